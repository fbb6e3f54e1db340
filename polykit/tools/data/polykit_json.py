"""polykit's JSON for small data: feeds as a list of {name: array} (or one such object), outputs
as {runner: [{name: array}, ...]}, an array as {"dtype": ..., "data": nested list} or a plain
(nested) list or number (float64 data becomes float32). Checked entry by entry: a DataFileError
names the feed or runner and iteration, and the tensor."""

from __future__ import annotations

from typing import Any, Mapping

from polykit.errors import DataFileError
from polykit.tools.data.dataset import DataSet, feeds_set, outputs_set, runnable_array

#: how each kind lays out the document, for messages
LAYOUTS = {"feeds": "a list of {name: array}", "outputs": "{runner: [{name: array}, ...]}"}
#: keys of an array Polygraphy encoded (polygraphy_json): a file's first array tells the formats apart
_POLYGRAPHY_KEYS = ("polygraphy_class", "__polygraphy_encoded_")


def from_document(doc: Any, where: str) -> DataSet:
    """The feeds or outputs a parsed JSON document of polykit's holds."""
    if _looks_like_outputs(doc):
        return outputs_set({r: [_tensors(o, f"{where}: runner {r!r} iteration {i}") for i, o in enumerate(its)]
                            for r, its in doc.items()})
    if isinstance(doc, dict):
        doc = [doc]
    if not isinstance(doc, list):
        raise DataFileError(f"feeds must be a list of {{input name: array}} objects, and outputs an object of runner "
                            f"name -> such a list; found {type(doc).__name__}", where=where)
    return feeds_set([_tensors(feed, f"{where}: feed {i}") for i, feed in enumerate(doc)])


def _looks_like_outputs(doc: Any) -> bool:
    """{runner: [{name: array}, ...]} (some runner with an iteration): saved outputs, not a feed dict."""
    return (isinstance(doc, dict) and bool(doc) and any(doc.values())
            and all(isinstance(v, list) and all(isinstance(o, dict) for o in v) for v in doc.values()))


def _tensors(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise DataFileError(f"a feed must be an object of input name -> array, not {type(value).__name__}",
                            where=where)
    return {name: _array(v, f"{where}: tensor {name!r}") for name, v in value.items()}


def _array(value: Any, where: str) -> Any:
    import numpy as np

    from polykit.compiler.plan.schema import DTYPES

    if isinstance(value, dict):
        dtype = value.get("dtype", "float32")
        if "data" not in value or not isinstance(dtype, str) or dtype not in DTYPES:
            polygraphy = any(str(k).startswith(_POLYGRAPHY_KEYS) for k in value)
            raise DataFileError(f"an array must be {{'dtype': <numeric dtype>, 'data': [...]}}; got keys "
                                f"{sorted(value)} and dtype {dtype!r}", where=where,
                                hint="the file mixes Polygraphy's arrays with polykit's: write it in one format"
                                if polygraphy else None)
        extra = sorted(str(k) for k in value if k not in ("dtype", "data"))
        if extra:
            raise DataFileError(f"an array object holds keys polykit's JSON format does not have: {extra}",
                                where=where, hint="an array is {'dtype': ..., 'data': [...]}, its shape that of "
                                "the nested lists; remove the other keys")
        arr = _as_array(value["data"], DTYPES[dtype], where)
    else:
        arr = _as_array(value, None, where)
        arr = arr.astype(np.float32) if arr.dtype == np.float64 else arr
    return runnable_array(arr, where)


def _as_array(data: Any, dtype: Any, where: str) -> Any:
    import numpy as np

    try:
        arr = np.asarray(data, dtype=dtype)
    except (ValueError, TypeError, OverflowError) as exc:
        raise DataFileError(f"the data is not a rectangular array of numbers: {exc}", where=where) from None
    if dtype is None and arr.dtype.kind not in "biuf":
        raise DataFileError(f"the data is not an array of numbers (got {arr.dtype})", where=where)
    return arr


def _encode(arr: Any) -> dict[str, Any]:
    import numpy as np

    arr = np.asarray(arr)
    return {"dtype": str(arr.dtype), "data": arr.tolist()}


def encode_feeds(feeds: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [{name: _encode(arr) for name, arr in feed.items()} for feed in feeds]


def encode_outputs(outputs: Mapping[str, list[Mapping[str, Any]]]) -> dict[str, Any]:
    return {r: [{name: _encode(arr) for name, arr in outs.items()} for outs in its] for r, its in outputs.items()}

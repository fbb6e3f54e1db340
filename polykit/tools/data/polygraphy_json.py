"""Polygraphy's JSON files (`polygraphy run --save-inputs/--save-outputs`), read and written,
so saved Polygraphy data can feed and check polykit runs and the other way round.

Polygraphy's encoder (polygraphy/json/serde.py) tags each object with its class under
"polygraphy_class" (older versions: a key "__polygraphy_encoded_<class>" whose value is
"polygraphy_serialized_json_type"):
  ndarray          {"array": base64 of the .npy file's bytes}  (oldest: the bytes as latin-1
                   text, or an .npz whose first array is the value)
  LazyArray        {"values": <ndarray>}                       (alias LazyNumpyArray)
  IterationResult  {"outputs": {name: <LazyArray>}, "runtime": s, "runner_name": str}
  RunResults       {"lst": [[runner name, [<IterationResult>, ...]], ...]}
Inputs are a list of feed dicts {name: <ndarray>}. Polygraphy 0.53 can also save either as a
folder of per-iteration files `0000000000.json`, ... (a feed dict, or a one-iteration
RunResults, each). Arrays are read with polykit's checked .npy reader (never pickle): a file
that holds objects, or torch tensors (class "Tensor": torch.save is pickle), is refused.
"""

from __future__ import annotations

import base64
import binascii
import io
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from polykit.errors import DataFileError
from polykit.npy_io import NPY_MAGIC, ZIP_MAGICS, read_npy, read_npz
from polykit.tools.data.dataset import DataSet, feeds_set, outputs_set, runnable_array

TYPE_MARKER = "polygraphy_class"
LEGACY_PREFIX = "__polygraphy_encoded_"
LEGACY_MARKER = "polygraphy_serialized_json_type"
#: digits of the zero-padded index in a per-iteration file name (Polygraphy's ITERATION_FILE_INDEX_WIDTH)
ITERATION_FILE_DIGITS = 10
#: how each kind lays out the document, for messages
LAYOUTS = {"feeds": "a list of feed dicts of Polygraphy arrays", "outputs": "a Polygraphy RunResults"}


def polygraphy_class(value: Any) -> str | None:
    """The Polygraphy class a decoded JSON value encodes, or None for a plain value."""
    if not isinstance(value, dict):
        return None
    if isinstance(value.get(TYPE_MARKER), str):
        return value[TYPE_MARKER]
    legacy = [k[len(LEGACY_PREFIX):] for k, v in value.items()
              if isinstance(k, str) and k.startswith(LEGACY_PREFIX) and v == LEGACY_MARKER]
    return legacy[0] if legacy else None


def holds(doc: Any) -> bool:
    """Whether a parsed JSON document is Polygraphy's: a tagged object (a RunResults), or feeds
    (a list of feed dicts, or one) whose first array is tagged. Polygraphy tags every object it
    writes, so the first one tells; polykit's JSON has no tags."""
    if polygraphy_class(doc) is not None:
        return True
    feed = doc[0] if isinstance(doc, list) and doc else doc
    return isinstance(feed, dict) and bool(feed) and polygraphy_class(next(iter(feed.values()))) is not None


def from_document(doc: Any, where: str) -> DataSet:
    """The feeds (a list of feed dicts, or one) or outputs (a RunResults) of a parsed document."""
    cls = polygraphy_class(doc)
    if cls == "RunResults":
        return outputs_set(_run_results(doc, where))
    if cls is not None:
        raise DataFileError(f"the file holds a Polygraphy {cls}, not saved inputs (a list of feed dicts) or outputs "
                            "(a RunResults)", where=where)
    feeds = [doc] if isinstance(doc, dict) else doc
    if not isinstance(feeds, list):
        raise DataFileError(f"Polygraphy's saved inputs are a list of feed dicts, not {type(doc).__name__}", where=where)
    return feeds_set([_feed(feed, f"{where}: feed {i}") for i, feed in enumerate(feeds)])


def _feed(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise DataFileError(f"a feed must be an object of input name -> array, not {type(value).__name__}", where=where)
    return {name: _array(v, f"{where}: tensor {name!r}") for name, v in value.items()}


def _array(value: Any, where: str) -> Any:
    import numpy as np

    arr = _decode(value, where)
    if not isinstance(arr, np.ndarray):
        raise DataFileError("expected an array, found another Polygraphy object", where=where)
    return runnable_array(arr, where)


def _decode(value: Any, where: str) -> Any:
    """The array (or dict/list of arrays) a Polygraphy-encoded value holds."""
    cls = polygraphy_class(value)
    decoder = _DECODERS.get(cls or "")
    if decoder is None:
        raise DataFileError(f"Polygraphy class {cls!r} is not one polykit reads", where=where,
                            hint="polykit reads Polygraphy's saved inputs (ndarray) and outputs (RunResults)")
    return decoder(value, where)


def iteration_files(folder: Path) -> list[Path]:
    """The per-iteration *.json files of a folder Polygraphy saved, in index order."""
    return sorted(p for p in folder.glob("*.json") if p.is_file())


def _field(value: dict, key: str, where: str) -> Any:
    if key not in value:
        raise DataFileError(f"the Polygraphy {polygraphy_class(value)} object has no {key!r}", where=where)
    return value[key]


def _ndarray(value: dict, where: str) -> Any:
    text = _field(value, "array", where)
    if not isinstance(text, str):
        raise DataFileError("a Polygraphy array's 'array' is not a string", where=where)
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        try:
            raw = text.encode("latin-1")  # Polygraphy's oldest encoding
        except UnicodeEncodeError:
            raise DataFileError("a Polygraphy array is neither base64 nor latin-1 text", where=where) from None
    if raw.startswith(ZIP_MAGICS):  # the oldest versions saved an .npz; its (first) array is the value
        arrays = read_npz(io.BytesIO(raw), where)
        if not arrays:
            raise DataFileError("a Polygraphy array holds an empty .npz archive", where=where)
        return next(iter(arrays.values()))
    if not raw.startswith(NPY_MAGIC):
        raise DataFileError("a Polygraphy array does not decode: its data is not .npy bytes", where=where,
                            hint="polykit reads arrays Polygraphy saved with numpy's .npy format")
    return read_npy(io.BytesIO(raw), len(raw), where)


def _torch_tensor(value: dict, where: str) -> Any:
    raise DataFileError("the file holds a torch tensor (Polygraphy saves those with torch.save, which is pickle); "
                        "polykit never unpickles data", where=where,
                        hint="save numpy arrays instead: convert the tensors with .numpy() before saving")


def _lazy_array(value: dict, where: str) -> Any:
    return _decode(_field(value, "values", where), where)


def _iteration_result(value: dict, where: str) -> dict[str, Any]:
    outputs = _field(value, "outputs", where)
    if not isinstance(outputs, dict):
        raise DataFileError("a Polygraphy IterationResult's outputs are not a name -> array object", where=where)
    return {name: _array(v, f"{where}: output {name!r}") for name, v in outputs.items()}


def _run_results(value: dict, where: str) -> dict[str, list[dict[str, Any]]]:
    entries = _field(value, "lst", where)
    out: dict[str, list[dict[str, Any]]] = {}
    for i, entry in enumerate(entries if isinstance(entries, list) else [None]):
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str) and isinstance(entry[1], list)):
            raise DataFileError(f"entry {i} of a Polygraphy RunResults is not [runner name, [results...]]", where=where)
        runner, iterations = entry
        name = runner if runner not in out else f"{runner}-{len(out)}"
        out[name] = [_outputs(_decode(it, f"{where}: runner {runner!r}"), f"{where}: runner {runner!r}")
                     for it in iterations]
    return out


def _outputs(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise DataFileError("a Polygraphy RunResults iteration is not an IterationResult", where=where)
    return value


_DECODERS: dict[str, Callable[[dict, str], Any]] = {
    "ndarray": _ndarray,
    "Tensor": _torch_tensor,
    "LazyArray": _lazy_array,
    "LazyNumpyArray": _lazy_array,
    "IterationResult": _iteration_result,
    "RunResults": _run_results,
}


# ---- writing: what Polygraphy's Encoder writes for the same objects ----------------------
def encode_array(arr: Any) -> dict[str, Any]:
    """{"array": base64 .npy bytes, "polygraphy_class": "ndarray"}. ml_dtypes floats (bfloat16,
    float8), which numpy saves as opaque bytes Polygraphy cannot read, are written as float32
    (every value exact)."""
    import numpy as np

    from polykit.tools.compare.funcs import is_float_dtype

    arr = np.asarray(arr)
    if arr.dtype.kind == "V" and is_float_dtype(arr.dtype):
        arr = arr.astype(np.float32)
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return {"array": base64.b64encode(buf.getvalue()).decode("ascii"), TYPE_MARKER: "ndarray"}


def encode_feeds(feeds: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Saved inputs: a list of feed dicts of encoded arrays."""
    return [{name: encode_array(arr) for name, arr in feed.items()} for feed in feeds]


def encode_run_results(outputs: Mapping[str, Sequence[Mapping[str, Any]]],
                       times: Mapping[str, Sequence[float]] | None = None) -> dict[str, Any]:
    """Saved outputs: a RunResults of {runner: [outputs per iteration]} (runtime in seconds or null)."""
    def iteration(runner: str, i: int, outs: Mapping[str, Any]) -> dict[str, Any]:
        runtimes = (times or {}).get(runner) or []
        return {"outputs": {name: {"values": encode_array(arr), TYPE_MARKER: "LazyArray"} for name, arr in outs.items()},
                "runtime": float(runtimes[i]) if i < len(runtimes) else None, "runner_name": runner,
                TYPE_MARKER: "IterationResult"}

    return {"lst": [[runner, [iteration(runner, i, o) for i, o in enumerate(its)]] for runner, its in outputs.items()],
            TYPE_MARKER: "RunResults"}


def iteration_file_name(index: int) -> str:
    """`0000000000.json`: the name Polygraphy gives iteration `index` in a per-iteration folder."""
    return f"{index:0{ITERATION_FILE_DIGITS}d}.json"

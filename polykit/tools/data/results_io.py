"""Saving and loading feeds and outputs: .npz (numpy's zip of .npy files), never pickle.

polykit's .npz: feeds (one feed dict per iteration) under keys "<iteration>/<tensor name>",
outputs per runner under "<runner>/<iteration>/<tensor name>". Tensor names may contain "/"
(they are split off at the first one or two slashes only). A plain name-keyed .npz
(`numpy.savez("in.npz", x=...)`, keys that are not all of one of these forms) is one
iteration: a feed dict, or the outputs of one runner named after the file.
Small data may be JSON: feeds as a list of {name: nested list or {"dtype": ..., "data":
nested list}}, outputs as {runner: that list}. Polygraphy's JSON (`--save-inputs/--save-outputs`
of `polygraphy run`: one file, or a folder of per-iteration files) loads too, and
`format="polygraphy"` writes it (polygraphy_json).

Every file is checked as it is read: a DataFileError names the file and the entry that is
wrong (not a zip, a lone .npy, a truncated archive, an object array, a ragged list).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from polykit.errors import DataFileError, UsageError
from polykit.files import require_file
from polykit.npy_io import open_npz
from polykit.tools.data import polygraphy_json

#: what --format names: polykit's .npz/.json (chosen by suffix), or Polygraphy's JSON
SAVE_FORMATS = ("polykit", "polygraphy")
_FEED_KEY = re.compile(r"^\d+/.")
_OUTPUT_KEY = re.compile(r"^[^/]+/\d+/.")


def npz_layout(keys: Iterable[str]) -> str:
    """"feeds" ("<iteration>/<name>" keys), "outputs" ("<runner>/<iteration>/<name>") or "plain"."""
    keys = list(keys)
    if keys and all(_FEED_KEY.match(k) for k in keys):
        return "feeds"
    if keys and all(_OUTPUT_KEY.match(k) for k in keys):
        return "outputs"
    return "plain"


def _write(path: Path, write: Callable[[Path], Any]) -> Path:
    try:
        write(path)
    except OSError as exc:
        raise DataFileError(f"cannot write the file: {exc.strerror or exc}", where=str(path),
                            hint="check that its folder exists and is writable") from None
    return path


def _write_npz(path: Path, arrays: dict[str, Any]) -> Path:
    import numpy as np

    def write(p: Path) -> None:
        with open(p, "wb") as fh:
            np.savez(fh, **arrays)

    return _write(path, write)


def _split_iterations(flat: dict[str, Any]) -> list[dict[str, Any]]:
    iters: dict[int, dict[str, Any]] = {}
    for key, arr in flat.items():
        index, _, name = key.partition("/")
        iters.setdefault(int(index), {})[name] = arr
    return [iters[i] for i in sorted(iters)]


def _json_array(value: Any, where: str) -> Any:
    """An array from one JSON value: polykit's {"dtype", "data"}, Polygraphy's encoding, or a
    (nested) list or number (float64 data becomes float32)."""
    import numpy as np

    from polykit.compiler.plan.schema import DTYPES

    if polygraphy_json.polygraphy_class(value) is not None:
        arr = polygraphy_json.decode(value, where)
        if not isinstance(arr, np.ndarray):
            raise DataFileError("expected an array, found another Polygraphy object", where=where)
    elif isinstance(value, dict):
        dtype = value.get("dtype", "float32")
        if "data" not in value or not isinstance(dtype, str) or dtype not in DTYPES:
            raise DataFileError(f"an array must be {{'dtype': <numeric dtype>, 'data': [...]}}; got keys "
                                f"{sorted(value)} and dtype {dtype!r}", where=where)
        arr = _as_array(value["data"], DTYPES[dtype], where)
    else:
        arr = _as_array(value, None, where)
        arr = arr.astype(np.float32) if arr.dtype == np.float64 else arr
    if arr.dtype.kind not in "biuf" and arr.dtype.name not in DTYPES:
        raise DataFileError(f"the array has dtype {arr.dtype}, which polykit does not run", where=where,
                            hint="store numbers or booleans")
    return arr


def _as_array(data: Any, dtype: Any, where: str) -> Any:
    import numpy as np

    try:
        arr = np.asarray(data, dtype=dtype)
    except (ValueError, TypeError, OverflowError) as exc:
        raise DataFileError(f"the data is not a rectangular array of numbers: {exc}", where=where) from None
    if dtype is None and arr.dtype.kind not in "biuf":
        raise DataFileError(f"the data is not an array of numbers (got {arr.dtype})", where=where)
    return arr


def _feed_dict(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise DataFileError(f"a feed must be an object of input name -> array, not {type(value).__name__}",
                            where=where)
    return {name: _json_array(v, f"{where}: tensor {name!r}") for name, v in value.items()}


def _read_json(path: Path) -> Any:
    path = require_file(path, "data file", DataFileError)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise DataFileError(f"cannot read JSON: {exc}", where=str(path)) from None


def _to_json(arr: Any) -> dict[str, Any]:
    import numpy as np

    arr = np.asarray(arr)
    return {"dtype": str(arr.dtype), "data": arr.tolist()}


def _write_json(path: Path, doc: Any) -> Path:
    return _write(path, lambda p: p.write_text(json.dumps(doc)))


def _json_kind(doc: Any) -> str:
    """"outputs" for a RunResults or {runner: [{name: array}, ...]}, else "feeds"."""
    cls = polygraphy_json.polygraphy_class(doc)
    if cls is not None:
        return "outputs" if cls == "RunResults" else "feeds"
    return "outputs" if isinstance(doc, dict) and _looks_like_outputs(doc) else "feeds"


def _looks_like_outputs(doc: dict) -> bool:
    """{runner: [{name: array}, ...]}: saved outputs, not a feed dict."""
    return bool(doc) and all(isinstance(v, list) and v and all(isinstance(o, dict) for o in v) for v in doc.values())


def _json_feeds(doc: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(doc, dict) and _json_kind(doc) == "feeds":
        doc = [doc]
    if not isinstance(doc, list):
        raise DataFileError("feeds must be a list of {input name: array} objects", where=where,
                            hint="this may be a file of outputs: give it to --load-outputs")
    return [_feed_dict(f, f"{where}: feed {i}") for i, f in enumerate(doc)]


def _json_outputs(doc: Any, where: str) -> dict[str, list[dict[str, Any]]]:
    if polygraphy_json.polygraphy_class(doc) == "RunResults":
        doc = polygraphy_json.decode(doc, where)
    elif not isinstance(doc, dict) or not all(isinstance(its, list) for its in doc.values()):
        raise DataFileError("outputs must be an object of runner name -> list of {output name: array}",
                            where=where, hint="this may be a file of inputs: give it to --load-inputs")
    return {r: [_feed_dict(o, f"{where}: runner {r!r} iteration {i}") for i, o in enumerate(its)]
            for r, its in doc.items()}


def _folder_files(folder: Path) -> list[Path]:
    files = polygraphy_json.iteration_files(folder)
    if not files:
        raise DataFileError("the folder holds no per-iteration .json files", where=str(folder),
                            hint="give a data file, or a folder Polygraphy saved with --save-inputs/--save-outputs DIR")
    return files


def _npz_outputs(path: Path) -> dict[str, list[dict[str, Any]]]:
    flat = open_npz(require_file(path, "data file", DataFileError))
    layout = npz_layout(flat)
    if layout == "plain":
        return {path.stem: [flat]}
    if layout == "feeds":
        raise DataFileError("the archive holds saved inputs (keys '<iteration>/<name>'), not outputs",
                            where=str(path), hint="give it to --load-inputs")
    per_runner: dict[str, dict[str, Any]] = {}
    for key, arr in flat.items():
        runner, _, rest = key.partition("/")
        per_runner.setdefault(runner, {})[rest] = arr
    return {r: _split_iterations(rest) for r, rest in per_runner.items()}


def load_feeds(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Feeds from polykit's or a plain .npz, JSON (polykit's or Polygraphy's), or a folder of
    Polygraphy's per-iteration files; DataFileError naming file and entry."""
    path = Path(path)
    if path.is_dir():
        return [feed for f in _folder_files(path) for feed in _json_feeds(_read_json(f), str(f))]
    if path.suffix == ".json":
        return _json_feeds(_read_json(path), str(path))
    flat = open_npz(require_file(path, "data file", DataFileError))
    layout = npz_layout(flat)
    if layout == "outputs":
        raise DataFileError("the archive holds saved outputs (keys '<runner>/<iteration>/<name>'), not inputs",
                            where=str(path), hint="give it to --load-outputs")
    return _split_iterations(flat) if layout == "feeds" else [flat]


def load_outputs(path: str | os.PathLike) -> dict[str, list[dict[str, Any]]]:
    """{runner: [outputs per iteration]} from polykit's or a plain .npz (one runner named after
    the file), JSON (polykit's or Polygraphy's RunResults) or a folder of Polygraphy's
    per-iteration RunResults (iterations joined per runner)."""
    path = Path(path)
    if path.is_dir():
        joined: dict[str, list[dict[str, Any]]] = {}
        for f in _folder_files(path):
            for runner, its in _json_outputs(_read_json(f), str(f)).items():
                joined.setdefault(runner, []).extend(its)
        return joined
    if path.suffix == ".json":
        return _json_outputs(_read_json(path), str(path))
    return _npz_outputs(path)


def load_data(path: str | os.PathLike) -> tuple[str, Any]:
    """("feeds", [feed dict per iteration]), ("outputs", {runner: [...]}) or ("arrays", {name:
    array}) for a plain .npz: whatever a data file holds, told by its contents."""
    path = Path(path)
    if path.is_dir():
        kind = _json_kind(_read_json(_folder_files(path)[0]))
    elif path.suffix == ".json":
        kind = _json_kind(_read_json(path))
    else:
        flat = open_npz(require_file(path, "data file", DataFileError))
        kind = {"plain": "arrays", "feeds": "feeds", "outputs": "outputs"}[npz_layout(flat)]
        if kind == "arrays":
            return kind, flat
    return kind, load_feeds(path) if kind == "feeds" else load_outputs(path)


def load_reference_outputs(paths: Iterable[str | os.PathLike]) -> dict[str, list[dict[str, Any]]]:
    """Saved outputs of several files (--load-outputs A --load-outputs B), in order; a runner
    name seen before gets a "-<n>" suffix."""
    reference: dict[str, list[dict[str, Any]]] = {}
    for path in paths:
        for name, outs in load_outputs(path).items():
            reference[name if name not in reference else f"{name}-{len(reference)}"] = outs
    return reference


def _check_format(format: str) -> None:
    if format not in SAVE_FORMATS:
        raise UsageError(f"--format {format!r} is not one of {', '.join(SAVE_FORMATS)}",
                         hint="polykit: .npz or .json by the file's suffix; polygraphy: Polygraphy's JSON")


def _save_polygraphy(path: Path, whole: Callable[[], Any], iterations: Callable[[], list[Any]]) -> Path:
    """Polygraphy's rule: a path with a suffix is one file (`whole()`); one without is a folder
    (new or empty) of per-iteration files (`iterations()`, one item each)."""
    if path.suffix:
        return _write_json(path, whole())
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise DataFileError("a path without a suffix is a folder of per-iteration files; this one exists and is "
                            "not an empty folder", where=str(path), hint="give a new or empty folder, or a .json file")
    _write(path, lambda p: p.mkdir(parents=False, exist_ok=True))
    for i, item in enumerate(iterations()):
        _write_json(path / polygraphy_json.iteration_file_name(i), item)
    return path


def save_feeds(path: str | os.PathLike, feeds: list[dict[str, Any]], format: str = "polykit") -> Path:
    """Write feeds as polykit's .npz (.json by suffix) or, with format="polygraphy", Polygraphy's JSON."""
    _check_format(format)
    path = Path(path)
    if format == "polygraphy":
        encoded = lambda: polygraphy_json.encode_feeds(feeds)  # noqa: E731
        return _save_polygraphy(path, encoded, encoded)
    if path.suffix == ".json":
        return _write_json(path, [{k: _to_json(v) for k, v in f.items()} for f in feeds])
    return _write_npz(path, {f"{i}/{name}": arr for i, f in enumerate(feeds) for name, arr in f.items()})


def save_outputs(path: str | os.PathLike, outputs: Mapping[str, list[dict[str, Any]]], format: str = "polykit",
                 times: Mapping[str, list[float]] | None = None) -> Path:
    """Save {runner name: [outputs per iteration]} (Polygraphy's RunResults with format="polygraphy",
    `times` its runtimes in seconds)."""
    _check_format(format)
    path = Path(path)
    if format == "polygraphy":
        count = max((len(its) for its in outputs.values()), default=0)
        return _save_polygraphy(path, lambda: polygraphy_json.encode_run_results(outputs, times), lambda: [
            polygraphy_json.encode_run_results({r: its[i:i + 1] for r, its in outputs.items() if i < len(its)},
                                               {r: list(t)[i:i + 1] for r, t in (times or {}).items()})
            for i in range(count)])
    if path.suffix == ".json":
        return _write_json(path, {r: [{k: _to_json(v) for k, v in o.items()} for o in its] for r, its in outputs.items()})
    return _write_npz(path, {f"{r}/{i}/{name}": arr for r, its in outputs.items()
                             for i, o in enumerate(its) for name, arr in o.items()})

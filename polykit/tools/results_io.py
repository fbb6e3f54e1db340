"""Saving and loading feeds and outputs: .npz (numpy's zip of .npy files), never pickle.

Feeds: one feed dict per iteration, stored under keys "<iteration>/<tensor name>".
Outputs: per runner, keys "<runner>/<iteration>/<tensor name>". Tensor names may contain
"/" (they are split off at the first one or two slashes only). Small data may be JSON:
feeds as a list of {name: nested list or {"dtype": ..., "data": nested list}}, outputs
as {runner: that list}. Polygraphy's JSON files (`--save-inputs/--save-outputs` of
`polygraphy run`) load too (polygraphy_json).

Every file is checked as it is read: a DataFileError names the file and the entry that is
wrong (not a zip, a lone .npy, a truncated archive, an object array, a ragged list).
"""

from __future__ import annotations

import json
import os
import zipfile
import zlib
from pathlib import Path
from typing import Any

from polykit.errors import DataFileError
from polykit.files import require_file
from polykit.tools import polygraphy_json
from polykit.tools.npy_io import read_npy

_ZIP_MAGIC = b"PK\x03\x04"
_NPY_MAGIC = b"\x93NUMPY"
#: what reading a damaged zip archive raises (bad structure, bad compressed data, encryption)
_ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, OSError, NotImplementedError, RuntimeError, ValueError)


def read_npz(path: Path) -> dict[str, Any]:
    """name -> array of an .npz (each member read by npy_io: header checked against its bytes);
    also the reader of INT8 calibration batches (polykit.compiler.calibrate)."""
    path = require_file(path, "data file", DataFileError)
    with open(path, "rb") as fh:
        head = fh.read(len(_NPY_MAGIC))
    hint = "expected an .npz written by polykit (--save-inputs/--save-outputs) or numpy.savez"
    if head.startswith(_NPY_MAGIC):
        raise DataFileError("the file is a single .npy array, not an .npz archive of named arrays", where=str(path),
                            hint="save feeds with numpy.savez(path, **{'0/<input name>': array}) or --save-inputs")
    if not head.startswith(_ZIP_MAGIC):
        raise DataFileError("the file is not an .npz (zip) archive", where=str(path), hint=hint)
    arrays: dict[str, Any] = {}
    try:
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                key = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
                with zf.open(info) as fh:
                    arrays[key] = read_npy(fh, info.file_size, f"{path}: array {key!r}")
    except DataFileError:
        raise
    except _ZIP_ERRORS as exc:
        raise DataFileError(f"the archive cannot be read: {exc}", where=str(path), hint=hint) from None
    return arrays


def _write(path: Path, write: Any) -> Path:
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


def _split_iterations(flat: dict[str, Any], where: str) -> list[dict[str, Any]]:
    iters: dict[int, dict[str, Any]] = {}
    for key, arr in flat.items():
        index, sep, name = key.partition("/")
        if not sep or not index.isdigit():
            raise DataFileError(f"unexpected key {key!r}", where=where, hint="keys must be '<iteration>/<tensor name>'")
        iters.setdefault(int(index), {})[name] = arr
    return [iters[i] for i in sorted(iters)]


def _json_array(value: Any, where: str) -> Any:
    """An array from one JSON value: polykit's {"dtype", "data"}, Polygraphy's encoding, or a
    (nested) list or number (float64 data becomes float32)."""
    import numpy as np

    from polykit.compiler.plan_schema import DTYPES

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


def save_feeds(path: str | os.PathLike, feeds: list[dict[str, Any]]) -> Path:
    path = Path(path)
    if path.suffix == ".json":
        return _write_json(path, [{k: _to_json(v) for k, v in f.items()} for f in feeds])
    return _write_npz(path, {f"{i}/{name}": arr for i, f in enumerate(feeds) for name, arr in f.items()})


def load_feeds(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Feeds from .npz or JSON (polykit's or Polygraphy's); DataFileError naming file and entry."""
    path = Path(path)
    if path.suffix != ".json":
        return _split_iterations(read_npz(path), str(path))
    doc = _read_json(path)
    if isinstance(doc, dict) and polygraphy_json.polygraphy_class(doc) is None and not _looks_like_outputs(doc):
        doc = [doc]
    if not isinstance(doc, list):
        raise DataFileError("feeds must be a list of {input name: array} objects", where=str(path),
                            hint="this may be a file of outputs: give it to --load-outputs")
    return [_feed_dict(f, f"{path}: feed {i}") for i, f in enumerate(doc)]


def _looks_like_outputs(doc: dict) -> bool:
    """{runner: [{name: array}, ...]}: saved outputs, not a feed dict."""
    return bool(doc) and all(isinstance(v, list) and v and all(isinstance(o, dict) for o in v) for v in doc.values())


def save_outputs(path: str | os.PathLike, outputs: dict[str, list[dict[str, Any]]]) -> Path:
    """Save {runner name: [outputs per iteration]}."""
    path = Path(path)
    if path.suffix == ".json":
        return _write_json(path, {r: [{k: _to_json(v) for k, v in o.items()} for o in its] for r, its in outputs.items()})
    return _write_npz(path, {f"{r}/{i}/{name}": arr for r, its in outputs.items()
                             for i, o in enumerate(its) for name, arr in o.items()})


def load_outputs(path: str | os.PathLike) -> dict[str, list[dict[str, Any]]]:
    """{runner: [outputs per iteration]} from .npz or JSON (polykit's or Polygraphy's RunResults)."""
    path = Path(path)
    if path.suffix == ".json":
        doc = _read_json(path)
        if polygraphy_json.polygraphy_class(doc) == "RunResults":
            runs = polygraphy_json.decode(doc, str(path))
            return {r: [_feed_dict(o, f"{path}: runner {r!r} iteration {i}") for i, o in enumerate(its)]
                    for r, its in runs.items()}
        if not isinstance(doc, dict) or not all(isinstance(its, list) for its in doc.values()):
            raise DataFileError("outputs must be an object of runner name -> list of {output name: array}",
                                where=str(path), hint="this may be a file of inputs: give it to --load-inputs")
        return {r: [_feed_dict(o, f"{path}: runner {r!r} iteration {i}") for i, o in enumerate(its)]
                for r, its in doc.items()}
    per_runner: dict[str, dict[str, Any]] = {}
    for key, arr in read_npz(path).items():
        runner, sep, rest = key.partition("/")
        if not sep:
            raise DataFileError(f"unexpected key {key!r}", where=str(path), hint="keys must be '<runner>/<iteration>/<name>'")
        per_runner.setdefault(runner, {})[rest] = arr
    return {r: _split_iterations(flat, str(path)) for r, flat in per_runner.items()}

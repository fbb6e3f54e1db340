"""Saving and loading feeds and outputs: .npz (numpy's zip of .npy files), never pickle.

Feeds: one feed dict per iteration, stored under keys "<iteration>/<tensor name>".
Outputs: per runner, keys "<runner>/<iteration>/<tensor name>". Tensor names may contain
"/" (they are split off at the first one or two slashes only). Small data may be JSON:
feeds as a list of {name: nested list or {"dtype": ..., "data": nested list}}, outputs
as {runner: that list}.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from polykit.errors import PolykitError, UsageError


def _open_npz(path: Path) -> dict[str, Any]:
    import numpy as np

    if not path.is_file():
        raise UsageError(f"file {str(path)!r} does not exist")
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (ValueError, OSError) as exc:
        raise PolykitError(f"cannot read {path.name}: {exc}", where=str(path),
                           hint="expected an .npz written by polykit (--save-inputs/--save-outputs)") from exc


def _write_npz(path: Path, arrays: dict[str, Any]) -> None:
    import numpy as np

    try:
        with open(path, "wb") as fh:
            np.savez(fh, **arrays)
    except OSError as exc:
        raise PolykitError(f"cannot write {path}: {exc}", where=str(path)) from exc


def _split_iterations(flat: dict[str, Any], where: str) -> list[dict[str, Any]]:
    iters: dict[int, dict[str, Any]] = {}
    for key, arr in flat.items():
        index, sep, name = key.partition("/")
        if not sep or not index.isdigit():
            raise PolykitError(f"unexpected key {key!r}", where=where, hint="keys must be '<iteration>/<tensor name>'")
        iters.setdefault(int(index), {})[name] = arr
    return [iters[i] for i in sorted(iters)]


def _json_array(value: Any) -> Any:
    import numpy as np

    if isinstance(value, dict):
        return np.asarray(value["data"], dtype=value.get("dtype", "float32"))
    arr = np.asarray(value)
    return arr.astype(np.float32) if arr.dtype == np.float64 else arr


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise PolykitError(f"cannot read JSON: {exc}", where=str(path)) from exc


def _to_json(arr: Any) -> dict[str, Any]:
    import numpy as np

    arr = np.asarray(arr)
    return {"dtype": str(arr.dtype), "data": arr.tolist()}


def save_feeds(path: str | os.PathLike, feeds: list[dict[str, Any]]) -> Path:
    path = Path(path)
    if path.suffix == ".json":
        path.write_text(json.dumps([{k: _to_json(v) for k, v in f.items()} for f in feeds]))
    else:
        _write_npz(path, {f"{i}/{name}": arr for i, f in enumerate(feeds) for name, arr in f.items()})
    return path


def load_feeds(path: str | os.PathLike) -> list[dict[str, Any]]:
    path = Path(path)
    if path.suffix == ".json":
        doc = _read_json(path)
        if isinstance(doc, dict):
            doc = [doc]
        return [{k: _json_array(v) for k, v in f.items()} for f in doc]
    return _split_iterations(_open_npz(path), str(path))


def save_outputs(path: str | os.PathLike, outputs: dict[str, list[dict[str, Any]]]) -> Path:
    """Save {runner name: [outputs per iteration]}."""
    path = Path(path)
    if path.suffix == ".json":
        path.write_text(json.dumps({r: [{k: _to_json(v) for k, v in o.items()} for o in its] for r, its in outputs.items()}))
    else:
        _write_npz(path, {f"{r}/{i}/{name}": arr for r, its in outputs.items()
                          for i, o in enumerate(its) for name, arr in o.items()})
    return path


def load_outputs(path: str | os.PathLike) -> dict[str, list[dict[str, Any]]]:
    path = Path(path)
    if path.suffix == ".json":
        doc = _read_json(path)
        return {r: [{k: _json_array(v) for k, v in o.items()} for o in its] for r, its in doc.items()}
    per_runner: dict[str, dict[str, Any]] = {}
    for key, arr in _open_npz(path).items():
        runner, sep, rest = key.partition("/")
        if not sep:
            raise PolykitError(f"unexpected key {key!r}", where=str(path), hint="keys must be '<runner>/<iteration>/<name>'")
        per_runner.setdefault(runner, {})[rest] = arr
    return {r: _split_iterations(flat, str(path)) for r, flat in per_runner.items()}

"""Saving and loading feeds and outputs: the API behind --load-inputs/--load-outputs and
--save-inputs/--save-outputs.

Loading reads a file or folder in any format polykit reads (formats.read_saved: polykit's
.npz, a plain name-keyed .npz, polykit's or Polygraphy's JSON, a folder of Polygraphy's
per-iteration files), told once and read by that format's one reader, and checks that it holds
what was asked for: saved outputs given as inputs, or the reverse, is a DataFileError saying so.
Saving writes, by default, Polygraphy's JSON (polygraphy_json) to a `.json` path and polykit's
.npz (npz_format) to any other; `format="polygraphy"` writes Polygraphy's JSON whatever the
path (no suffix: a folder of per-iteration files), `format="polykit"` polykit's .npz, or its
richer JSON (polykit_json: dtypes by name, plain lists) to a `.json` path. Never pickle.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from polykit.errors import DataFileError, UsageError
from polykit.tools.data import npz_format, polygraphy_json, polykit_json
from polykit.tools.data.dataset import DataSet
from polykit.tools.data.formats import describe, read_saved

#: what --format names: polykit's .npz/.json (chosen by suffix), or Polygraphy's JSON
SAVE_FORMATS = ("polykit", "polygraphy")


def save_format(path: str | os.PathLike, format: str | None = None) -> str:
    """The format a save to `path` uses: `format`, else Polygraphy's for a .json path, else polykit's."""
    if format is None:
        return "polygraphy" if Path(path).suffix == ".json" else "polykit"
    check_format(format)
    return format


def _tensors(data: DataSet) -> Any:
    """[feed dict per iteration] of saved inputs, {runner: [outputs per iteration]} of saved
    outputs, {name: array} of plain arrays."""
    if data.kind == "feeds":
        return [dict(g.tensors) for g in data.groups]
    if data.kind == "outputs":
        joined: dict[str, list[dict[str, Any]]] = {}
        for g in data.groups:
            joined.setdefault(str(g.runner), []).append(dict(g.tensors))
        return joined
    return dict(data.groups[0].tensors)


def load_feeds(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Feeds (one dict per iteration) from any saved-data format; a plain .npz is one feed."""
    fmt, data = read_saved(path)
    if data.kind == "outputs":
        raise DataFileError(f"{describe(fmt, 'outputs')}, not inputs", where=str(Path(path)),
                            hint="give it to --load-outputs")
    return _tensors(data) if data.kind == "feeds" else [_tensors(data)]


def load_outputs(path: str | os.PathLike) -> dict[str, list[dict[str, Any]]]:
    """{runner: [outputs per iteration]} from any saved-data format; a plain .npz is the outputs
    of one runner named after the file, a folder's iterations are joined per runner."""
    fmt, data = read_saved(path)
    if data.kind == "feeds":
        raise DataFileError(f"{describe(fmt, 'feeds')}, not outputs", where=str(Path(path)),
                            hint="give it to --load-inputs")
    return _tensors(data) if data.kind == "outputs" else {Path(path).stem: [_tensors(data)]}


def load_data(path: str | os.PathLike) -> tuple[str, Any]:
    """("feeds", [feed dict per iteration]), ("outputs", {runner: [...]}) or ("arrays", {name:
    array}) for a plain .npz: whatever a data file holds, told by its contents."""
    _, data = read_saved(path)
    return data.kind, _tensors(data)


def load_reference_outputs(paths: Iterable[str | os.PathLike]) -> dict[str, list[dict[str, Any]]]:
    """Saved outputs of several files (--load-outputs A --load-outputs B), in order; a runner
    name seen before gets a "-<n>" suffix."""
    reference: dict[str, list[dict[str, Any]]] = {}
    for path in paths:
        for name, outs in load_outputs(path).items():
            reference[name if name not in reference else f"{name}-{len(reference)}"] = outs
    return reference


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


def _write_json(path: Path, doc: Any) -> Path:
    return _write(path, lambda p: p.write_text(json.dumps(doc)))


def check_format(format: str) -> None:
    if format not in SAVE_FORMATS:
        raise UsageError(f"--format {format!r} is not one of {', '.join(SAVE_FORMATS)}",
                         hint="polykit: .npz, or polykit's JSON for a .json path; polygraphy: Polygraphy's JSON "
                              "(the default for a .json path)")


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


def save_feeds(path: str | os.PathLike, feeds: list[dict[str, Any]], format: str | None = None) -> Path:
    """Write feeds (a list of feed dicts) in `save_format(path, format)`."""
    path = Path(path)
    if save_format(path, format) == "polygraphy":
        encoded = lambda: polygraphy_json.encode_feeds(feeds)  # noqa: E731
        return _save_polygraphy(path, encoded, encoded)
    if path.suffix == ".json":
        return _write_json(path, polykit_json.encode_feeds(feeds))
    return _write_npz(path, npz_format.feed_members(feeds))


def save_outputs(path: str | os.PathLike, outputs: Mapping[str, list[dict[str, Any]]], format: str | None = None,
                 times: Mapping[str, list[float]] | None = None) -> Path:
    """Save {runner name: [outputs per iteration]} in `save_format(path, format)` (Polygraphy's:
    a RunResults, `times` its runtimes in seconds)."""
    path = Path(path)
    if save_format(path, format) == "polygraphy":
        count = max((len(its) for its in outputs.values()), default=0)
        return _save_polygraphy(path, lambda: polygraphy_json.encode_run_results(outputs, times), lambda: [
            polygraphy_json.encode_run_results({r: its[i:i + 1] for r, its in outputs.items() if i < len(its)},
                                               {r: list(t)[i:i + 1] for r, t in (times or {}).items()})
            for i in range(count)])
    if path.suffix == ".json":
        return _write_json(path, polykit_json.encode_outputs(outputs))
    return _write_npz(path, npz_format.output_members(outputs))

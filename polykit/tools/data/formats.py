"""Saved inputs and outputs in every format polykit reads, each file handed to exactly one reader:

    fmt, data = read_saved("ref.npz")     # ("npz", DataSet("outputs", groups per runner and iteration))

The format is told once, from the path and the file's first bytes: a folder is Polygraphy's
per-iteration files; a zip header is an .npz (npz_format); a .json name, or text opening with
"[" or "{", is JSON, parsed once, whose structure picks polykit's reader (polykit_json) or
Polygraphy's (polygraphy_json: its objects are tagged). Anything else goes to the .npz reader,
which says what the file is instead (a lone .npy, text, a damaged archive).
"""

from __future__ import annotations

import os
from pathlib import Path

from polykit.errors import DataFileError
from polykit.files import read_json, require_file
from polykit.npy_io import ZIP_MAGICS
from polykit.tools.data import npz_format, polygraphy_json, polykit_json
from polykit.tools.data.dataset import DataSet, feeds_set, outputs_set

#: format -> (what the path is, how it lays out feeds and outputs), for messages
LAYOUTS = {
    "npz": ("archive", npz_format.LAYOUTS),
    "polykit-json": ("file", polykit_json.LAYOUTS),
    "polygraphy-json": ("file", polygraphy_json.LAYOUTS),
    "polygraphy-folder": ("folder", polygraphy_json.LAYOUTS),
}
#: bytes of a file's start that tell its format
_HEAD = 64


def read_saved(path: str | os.PathLike) -> tuple[str, DataSet]:
    """(format, DataSet) of a file or folder of saved inputs or outputs; DataFileError naming the
    file and the entry that is wrong."""
    path = Path(path)
    if path.is_dir():
        return "polygraphy-folder", _read_folder(path)
    path = require_file(path, "data file", DataFileError)
    try:
        with open(path, "rb") as fh:
            head = fh.read(_HEAD)
    except OSError as exc:
        raise DataFileError(f"cannot read the file: {exc.strerror or exc}", where=str(path)) from None
    if not head.startswith(ZIP_MAGICS) and (path.suffix == ".json" or head.lstrip()[:1] in (b"[", b"{")):
        return _read_json(path)
    return "npz", npz_format.read(path)


def describe(fmt: str, kind: str) -> str:
    """"the archive holds saved outputs (keys '<runner>/<iteration>/<name>')": what a file of
    `fmt` holds when its DataSet is of `kind`."""
    noun, layouts = LAYOUTS[fmt]
    return f"the {noun} holds saved {'inputs' if kind == 'feeds' else kind} ({layouts[kind]})"


def _read_json(path: Path) -> tuple[str, DataSet]:
    doc = read_json(path, "JSON data file", DataFileError)
    if polygraphy_json.holds(doc):
        return "polygraphy-json", polygraphy_json.from_document(doc, str(path))
    return "polykit-json", polykit_json.from_document(doc, str(path))


def _read_folder(folder: Path) -> DataSet:
    """The per-iteration files of a folder joined: feeds one after another, outputs per runner."""
    files = polygraphy_json.iteration_files(folder)
    if not files:
        raise DataFileError("the folder holds no per-iteration .json files", where=str(folder),
                            hint="give a data file, or a folder Polygraphy saved with --save-inputs/--save-outputs DIR")
    kind, feeds, outputs = None, [], {}
    for file in files:
        fmt, data = _read_json(file)
        if kind is not None and data.kind != kind:
            raise DataFileError(f"{describe(fmt, data.kind)}, the folder's first file saved {kind}", where=str(file),
                                hint="keep saved inputs and saved outputs in separate folders")
        kind = data.kind
        for group in data.groups:
            if kind == "feeds":
                feeds.append(dict(group.tensors))
            else:
                outputs.setdefault(group.runner, []).append(dict(group.tensors))
    return feeds_set(feeds) if kind == "feeds" else outputs_set(outputs)


"""Layerwise outputs on disk: an .npz written one tensor at a time and read one tensor at a time,
so a comparison of hundreds of marked tensors never holds them all in memory.

Members are named as results_io names them ("<runner>/<iteration>/<tensor name>.npy"), so a
file an OutputStore writes is an ordinary `--save-outputs` .npz (results_io.load_outputs and
numpy.load read it), and `open_outputs` reads such a file lazily: each array is checked and
read (npy_io.read_npy, never pickle) when a comparison asks for it, then dropped.

    with OutputStore("layers.npz") as store:
        lazy = store.spill("onnxrt", 0, outputs)   # writes and empties `outputs`
        store.seal()                               # the archive is complete: reads may start
        arr = lazy["conv1_out"]
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Any, Iterator, Mapping

from polykit.errors import DataFileError, UsageError
from polykit.npy_io import read_npy

_ZIP_MAGIC = b"PK\x03\x04"


class NpzArchive:
    """Read side of an .npz: member index at open, one array per `read`."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        try:
            self._zip = zipfile.ZipFile(self.path)
        except (OSError, zipfile.BadZipFile) as exc:
            raise DataFileError(f"the archive cannot be read: {exc}", where=str(self.path)) from None
        self.members = {i.filename[:-4]: i for i in self._zip.infolist() if i.filename.endswith(".npy")}

    def read(self, key: str) -> Any:
        info = self.members.get(key)
        if info is None:
            raise DataFileError(f"no array {key!r} in the archive", where=str(self.path))
        try:
            with self._zip.open(info) as fh:
                return read_npy(fh, info.file_size, f"{self.path}: array {key!r}")
        except (OSError, zipfile.BadZipFile, EOFError) as exc:
            raise DataFileError(f"array {key!r} cannot be read: {exc}", where=str(self.path)) from None

    def close(self) -> None:
        self._zip.close()


class LazyOutputs(Mapping[str, Any]):
    """One runner's outputs of one iteration, read from an archive on access (not cached)."""

    def __init__(self, source: Any, prefix: str, names: list[str]):
        self._source, self._prefix, self._names = source, prefix, list(names)
        self._known = set(self._names)

    def __getitem__(self, name: str) -> Any:
        if name not in self._known:
            raise KeyError(name)
        return self._source.read(self._prefix + name)

    def __contains__(self, name: object) -> bool:
        return name in self._known

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def open_outputs(path: str | os.PathLike) -> tuple[NpzArchive, dict[str, list[LazyOutputs]]] | None:
    """{runner: [lazy outputs per iteration]} of a polykit outputs .npz (keys
    "<runner>/<iteration>/<name>", iterations 0..n-1), with the archive to close; None when the
    file is not such an .npz (JSON, other layouts: results_io reads those whole)."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            if fh.read(len(_ZIP_MAGIC)) != _ZIP_MAGIC:
                return None
    except OSError:
        return None
    archive = NpzArchive(path)
    layout: dict[str, dict[int, list[str]]] = {}
    for key in archive.members:
        runner, _, rest = key.partition("/")
        index, sep, name = rest.partition("/")
        if not runner or not sep or not index.isdigit() or not name:
            archive.close()
            return None
        layout.setdefault(runner, {}).setdefault(int(index), []).append(name)
    if not layout or any(sorted(its) != list(range(len(its))) for its in layout.values()):
        archive.close()
        return None
    return archive, {r: [LazyOutputs(archive, f"{r}/{i}/", its[i]) for i in range(len(its))] for r, its in layout.items()}


class OutputStore:
    """Runners' outputs spilled to one .npz as they are produced (Comparator.run(store=...)).

    `spill` writes one iteration's outputs and returns a LazyOutputs for them; `seal` finishes the
    archive, after which they can be read. The file stays when `keep` (it is `--save-outputs`),
    else it is removed on close."""

    def __init__(self, path: str | os.PathLike, keep: bool = True):
        self.path, self.keep = Path(path), keep
        try:
            self._writer: zipfile.ZipFile | None = zipfile.ZipFile(self.path, "w")
        except OSError as exc:
            raise DataFileError(f"cannot write the file: {exc.strerror or exc}", where=str(self.path),
                                hint="check that its folder exists and is writable") from None
        self._archive: NpzArchive | None = None

    def spill(self, runner: str, iteration: int, outputs: dict[str, Any]) -> LazyOutputs:
        """Write `outputs` (emptied as each array is written, so each can be freed) under
        "<runner>/<iteration>/"."""
        import numpy as np
        from numpy.lib import format as npy

        if self._writer is None:
            raise UsageError("the output store is sealed: no more outputs can be added", where=str(self.path),
                             hint="open a new store for more outputs")
        names = list(outputs)
        for name in names:
            arr = np.asarray(outputs.pop(name))
            with self._writer.open(f"{runner}/{iteration}/{name}.npy", "w", force_zip64=True) as fh:
                npy.write_array(fh, arr, allow_pickle=False)
        return LazyOutputs(self, f"{runner}/{iteration}/", names)

    def seal(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def read(self, key: str) -> Any:
        if self._writer is not None:
            raise UsageError("the output store is still being written; seal() it before reading", where=str(self.path),
                             hint="call seal() after the last output")
        if self._archive is None:
            self._archive = NpzArchive(self.path)
        return self._archive.read(key)

    def close(self) -> None:
        self.seal()
        if self._archive is not None:
            self._archive.close()
        if not self.keep:
            self.path.unlink(missing_ok=True)

    def __enter__(self) -> "OutputStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

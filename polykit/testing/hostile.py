"""A corpus of small hostile files, built at test time: one case per class of input an attacker
or a careless user can hand polykit (zip bombs, sizes a file declares but does not hold,
numbers of 5,000 digits, JSON nested 10,000 deep, loops of 2**62 iterations, ...).

    for case in CASES:
        path = case.build(folder)          # writes the file (and a small model it needs) into folder
        for argv in case.commands(path):   # the CLI commands that read it
            ...                            # run under case.limits (POLYKIT_LIMITS): exit 2, no traceback

Every case is a few KB on disk. Those whose harm is size (a bomb) are built against the small
limits in `case.limits`, so a test proves the limit is checked before the allocation without
making gigabytes; the file's declared sizes are far above the limits either way.
"""

from __future__ import annotations

import io
import json
import struct
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

#: the limits every case runs under: small, so a bomb is refused in milliseconds
SMALL_LIMITS = {"data_bytes": 1 << 20, "host_memory": 64 << 20, "device_memory": 64 << 20,
                "fold_iterations": 1000, "run_iterations": 1000}


@dataclass(frozen=True)
class Case:
    """One hostile file: how to build it, and which CLI commands read it."""

    name: str
    build: Callable[[Path], Path]
    readers: tuple[str, ...]  # keys of READERS
    limits: dict[str, int] = field(default_factory=lambda: dict(SMALL_LIMITS))

    def commands(self, path: Path, model: Path) -> list[list[str]]:
        """The argv of every command that reads `path` (`model`: a valid model a feed file needs)."""
        return [[part.format(path=path, model=model) for part in READERS[r]] for r in self.readers]


#: how each command reads a file: argv templates ({path}: the hostile file, {model}: a valid model)
READERS: dict[str, tuple[str, ...]] = {
    "inspect-data": ("inspect", "data", "{path}"),
    "load-inputs": ("run", "{model}", "--trt", "--target", "cpu", "--load-inputs", "{path}"),
    "load-outputs": ("run", "{model}", "--trt", "--target", "cpu", "--load-outputs", "{path}"),
    "inspect-model": ("inspect", "model", "{path}"),
    "convert": ("convert", "{path}", "--target", "cpu", "-o", "{path}.plan"),
    "run-trt": ("run", "{path}", "--trt", "--target", "cpu"),
    "timing-cache": ("convert", "{model}", "--target", "cpu", "--load-timing-cache", "{path}", "-o", "{path}.plan"),
    "tactic-replay": ("convert", "{model}", "--target", "cpu", "--load-tactics", "{path}", "-o", "{path}.plan"),
    "inspect-tactics": ("inspect", "tactics", "{path}"),
    "calibration-cache": ("convert", "{model}", "--target", "cpu", "--int8", "--calibration-cache", "{path}",
                          "-o", "{path}.plan"),
}


# ---- data files -----------------------------------------------------------------------------
def npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def _zip(path: Path, members: dict[str, bytes], method: int = zipfile.ZIP_DEFLATED) -> Path:
    with zipfile.ZipFile(path, "w", compression=method) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def npz_deflate_bomb(folder: Path) -> Path:
    """A genuine bomb: 64 MiB of zeros deflated to ~64 KB (64x the test's data_bytes limit)."""
    return _zip(folder / "deflate_bomb.npz", {"x.npy": npy_bytes(np.zeros(16 << 20, np.float32))})


def npz_bzip2_bomb(folder: Path) -> Path:
    """64 MiB of zeros under bzip2 (a ~100 byte member: ratios deflate cannot reach)."""
    return _zip(folder / "bzip2_bomb.npz", {"x.npy": npy_bytes(np.zeros(16 << 20, np.float32))}, zipfile.ZIP_BZIP2)


def npz_lying_size(folder: Path) -> Path:
    """A 1 KB archive whose member declares 8 GiB uncompressed (central directory and npy header agree)."""
    arr_header = npy_bytes(np.zeros(0, np.float32))
    header = arr_header.replace(b"(0,)", b"(%d,)" % (2 << 30)).ljust(len(arr_header))
    path = _zip(folder / "lying_size.npz", {"x.npy": header + b"\0" * 512})
    return _patch_sizes(path, 8 << 30)


def _patch_sizes(path: Path, size: int) -> Path:
    """Rewrite the uncompressed size of every member (local header and central directory) to
    `size` (ZIP64 fields when it needs them are beyond this; 4 GiB - 1 is the plain maximum)."""
    data = bytearray(path.read_bytes())
    size = min(size, 0xFFFFFFFE)
    for sig, off in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        pos = data.find(sig)
        while pos >= 0:
            struct.pack_into("<I", data, pos + off, size)
            pos = data.find(sig, pos + 4)
    path.write_bytes(bytes(data))
    return path


def npy_huge_shape(folder: Path) -> Path:
    """An .npz whose member's npy header claims 2**40 float32 elements and holds 16 bytes."""
    raw = npy_bytes(np.zeros(4, np.float32)).replace(b"(4,)", b"(%d,)" % (1 << 40))
    return _zip(folder / "huge_shape.npz", {"x.npy": raw}, zipfile.ZIP_STORED)


def _json(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def json_deep(folder: Path) -> Path:
    return _json(folder / "deep.json", "[" * 100_000 + "]" * 100_000)


def json_long_int(folder: Path) -> Path:
    return _json(folder / "long_int.json", '[{"x": [' + "9" * 5000 + "]}]")


def json_float_overflow(folder: Path) -> Path:
    return _json(folder / "float_overflow.json", '[{"x": {"dtype": "float32", "data": [1e400]}}]')


def polygraphy_lazy_nest(folder: Path) -> Path:
    """A Polygraphy LazyArray nested 700 deep around one ndarray."""
    value: dict = {"array": "", "polygraphy_class": "ndarray"}
    for _ in range(700):
        value = {"values": value, "polygraphy_class": "LazyArray"}
    return _json(folder / "lazy_nest.json", json.dumps([{"x": value}]))


def polygraphy_huge_array(folder: Path) -> Path:
    """A Polygraphy ndarray whose .npy header claims 2**40 elements."""
    import base64

    raw = npy_bytes(np.zeros(4, np.float32)).replace(b"(4,)", b"(%d,)" % (1 << 40))
    doc = [{"x": {"array": base64.b64encode(raw).decode(), "polygraphy_class": "ndarray"}}]
    return _json(folder / "polygraphy_huge.json", json.dumps(doc))


_DATA = ("inspect-data", "load-inputs", "load-outputs")

CASES: list[Case] = [
    Case("npz-deflate-bomb", npz_deflate_bomb, _DATA),
    Case("npz-bzip2-bomb", npz_bzip2_bomb, _DATA),
    Case("npz-lying-size", npz_lying_size, _DATA),
    Case("npy-huge-shape", npy_huge_shape, _DATA),
    Case("json-deep", json_deep, _DATA),
    Case("json-long-int", json_long_int, _DATA),
    Case("json-float-overflow", json_float_overflow, _DATA),
    Case("polygraphy-lazy-nest", polygraphy_lazy_nest, _DATA),
    Case("polygraphy-huge-array", polygraphy_huge_array, _DATA),
]

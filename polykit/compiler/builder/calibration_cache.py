"""The calibration cache: per-tensor INT8 (or FP8) scales in a text file (TensorRT's calibration cache).

    polykit-calibration-cache 1 polykit=0.1.0 calibrator=entropy
    input: 0x1.0204080000000p-7
    /conv1/Conv_output_0: 0x1.6c16c20000000p-5

The header names the format version, the polykit version that wrote it and the calibrator;
each further line is `tensor name: scale` (the last ": " splits, so names may hold ": "), the
scale a float32 written as a hexadecimal float (float.hex), so it reads back bit for bit. The
scale maps int8 to real values: real = scale * q, q in [-128, 127] (threshold / 127).
An FP8 build's cache (e4m3 scales, threshold / 448) ends its header with ` type=fp8`; a header
without it holds INT8 scales (so every earlier cache reads as what it is), and a build of the one
kind refuses a cache of the other (quantize.activation_scales).
Reading is strict: a DataFileError names the file and line of anything else. A build takes
only its own polykit version's scales: another version's cache is ignored with a warning when
the build has calibration data (and written anew), and refused (DataFileError) when it has none.
The device is not recorded: scales are a property of the model and the data, which is why
TensorRT's calibration caches move between devices too.
"""

from __future__ import annotations

import os
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import numpy as np

import polykit
from polykit.compiler.builder.calibrate import CALIBRATORS
from polykit.errors import DataFileError
from polykit.files import read_limited, require_file

FORMAT_VERSION = 1
MAGIC = "polykit-calibration-cache"
_HEADER = re.compile(rf"^{MAGIC} (?P<version>[0-9]{{1,9}}) polykit=(?P<polykit>\S+) "
                     rf"calibrator=(?P<calibrator>{'|'.join(sorted(CALIBRATORS))})(?: type=(?P<type>fp8))?$")
#: what the scales quantize to: "int8" (no type= in the header) or "fp8"
CACHE_TYPES = ("int8", "fp8")
#: float.hex of a positive finite number
_HEX = re.compile(r"^0x[0-9a-f](\.[0-9a-f]{0,40})?p[-+]?[0-9]{1,6}$")
HINT = "write the cache again (build with --int8 and calibration data), or fix the line"


@dataclass(frozen=True)
class CalibrationCache:
    """What a cache file holds: the calibrator that made it, tensor name -> scale, and the type the
    scales quantize to (CACHE_TYPES)."""

    calibrator: str
    scales: Mapping[str, float] = field(default_factory=dict, hash=False)
    polykit_version: str = polykit.__version__
    type: str = "int8"

    def text(self) -> str:
        kind = "" if self.type == "int8" else f" type={self.type}"
        lines = [f"{MAGIC} {FORMAT_VERSION} polykit={self.polykit_version} calibrator={self.calibrator}{kind}"]
        for name, scale in self.scales.items():
            if "\n" in name or "\r" in name or not name:
                raise DataFileError(f"tensor name {name!r} cannot be written to a calibration cache",
                                    hint="rename the tensor in the model (polykit surgeon)")
            lines.append(f"{name}: {float(np.float32(scale)).hex()}")
        return "\n".join(lines) + "\n"


def parse_calibration_cache(text: str, where: str) -> CalibrationCache:
    """The cache in `text`; DataFileError naming `where` and the line for anything malformed."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not lines:
        raise DataFileError("the calibration cache is empty", where=f"{where}:1", hint=HINT)
    header = _HEADER.match(lines[0])
    if header is None:
        raise DataFileError(f"line 1 is not a calibration cache header ({MAGIC} VERSION polykit=V calibrator=NAME): "
                            f"{lines[0][:80]!r}", where=f"{where}:1", hint="is this a polykit calibration cache?")
    if int(header["version"]) != FORMAT_VERSION:
        raise DataFileError(f"calibration cache format {header['version']} is not {FORMAT_VERSION}", where=f"{where}:1",
                            hint="write the cache again with this polykit")
    scales: dict[str, float] = {}
    for number, line in enumerate(lines[1:], start=2):
        name, sep, value = line.rpartition(": ")
        if not sep or not name:
            raise DataFileError(f"expected 'tensor name: scale', got {line[:80]!r}", where=f"{where}:{number}", hint=HINT)
        scale = _scale(value, f"{where}:{number}")
        if name in scales:
            raise DataFileError(f"tensor {name!r} appears twice", where=f"{where}:{number}", hint=HINT)
        scales[name] = scale
    return CalibrationCache(header["calibrator"], scales, header["polykit"], header["type"] or "int8")


def _scale(text: str, where: str) -> float:
    if not _HEX.match(text):
        raise DataFileError(f"scale {text[:40]!r} is not a hexadecimal float (like 0x1.8p-6)", where=where, hint=HINT)
    try:
        value = float.fromhex(text)
    except OverflowError:
        value = math.inf
    if not (0 < value < float(np.finfo(np.float32).max)) or float(np.float32(value)) != value:
        raise DataFileError(f"scale {text!r} is not a positive, finite float32", where=where, hint=HINT)
    return value


def read_calibration_cache(path: str | os.PathLike) -> CalibrationCache:
    """Read and check a cache file (for the builder and for `polykit inspect data`)."""
    path = require_file(path, "calibration cache", DataFileError)
    try:
        text = read_limited(path, "calibration cache", DataFileError).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataFileError(f"the calibration cache is not UTF-8 text ({exc.reason} at byte {exc.start})",
                            where=str(path), hint="is this a polykit calibration cache?") from None
    except OSError as exc:
        raise DataFileError(f"cannot read the calibration cache: {exc.strerror or exc}", where=str(path)) from None
    return parse_calibration_cache(text, str(path))


def write_calibration_cache(path: str | os.PathLike, cache: CalibrationCache) -> None:
    text = cache.text()
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise DataFileError(f"cannot write the calibration cache: {exc.strerror or exc}", where=str(path),
                            hint="check that its folder exists and is writable") from None

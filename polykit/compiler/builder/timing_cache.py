"""The timing cache: measured tactic times, reused by later builds (TensorRT's timing cache).

A file is JSON (never pickle):

    {"format": 2, "polykit": "0.1.0", "device": "NVIDIA H200", "arch": "sm_90",
     "entries": {"<sha256 hex>": {"ms": 0.042, "tactic": "cpu.conv.winograd", "kind": "Conv", "device": "..."}}}

`polykit`, `device` and `arch` say where the times were measured (format 1 files say nothing):
a build on another device or with another polykit version ignores the cache with a warning
and times again (TensorRT's behaviour), and saving over such a file replaces it.

The key hashes everything a time depends on: the layer signature (kind, domain, attributes,
input/output shapes, dtypes and formats, precision), the tactic's name, params and source
hash (its kernel sources on cuda, its code on cpu), the device's name and compute
capability, and the polykit version; the other fields are there for people reading it.
Caches merge: entries of both, the one already held winning a clash. The file is untrusted:
its structure is checked and every problem is a UsageError naming the file and the field.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
from pathlib import Path
from typing import Any, Mapping

import numpy as np

import polykit
from polykit.errors import UsageError
from polykit.files import read_json

log = logging.getLogger("polykit")

FORMAT = 2
#: formats this polykit reads (format 1 records no device or version)
READABLE_FORMATS = (1, FORMAT)
#: what a cache records of the build that measured it
ORIGIN_FIELDS = ("polykit", "device", "arch")
_KEY = re.compile(r"^[0-9a-f]{64}$")
#: entry field -> (python types, what it must be)
_FIELDS = {"ms": ((int, float), "a number"), "tactic": (str, "a string"), "kind": (str, "a string"),
           "device": (str, "a string")}


def _canonical(value: Any) -> Any:
    """JSON-able form of layer attributes (arrays by dtype, shape and content hash)."""
    if isinstance(value, np.ndarray):
        return {"dtype": value.dtype.name, "shape": list(value.shape),
                "sha256": hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest()}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, bytes):
        return value.hex()
    return value


def timing_key(layer: Any, tactic: Any, device: Any) -> str:
    """The cache key of timing `tactic` on `layer` (a LayerDesc with stamped dtypes/shapes) on `device`."""
    doc = {
        "kind": layer.kind, "domain": layer.domain, "attrs": _canonical(layer.attrs),
        "in_shapes": [list(s) for s in layer.in_shapes], "out_shapes": [list(s) for s in layer.out_shapes],
        "in_dtypes": list(layer.in_dtypes), "out_dtypes": list(layer.out_dtypes),
        "formats": _canonical(tactic.params.get("formats", "linear")), "precision": layer.precision,
        "tactic": tactic.name, "params": _canonical(dict(tactic.params)), "source": tactic.source_key(layer),
        "device": device.name, "arch": device.arch, "polykit": polykit.__version__,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def origin_of(device: Any) -> dict[str, str]:
    """The origin record of times measured on `device` (a Target's device) by this polykit."""
    return {"polykit": polykit.__version__, "device": str(device.name), "arch": str(device.arch)}


class TimingCache:
    """Key -> entry ({"ms", "tactic", "kind", "device"}); `hits`/`misses` count lookups;
    `origin` ({"polykit", "device", "arch"}, None when unknown) where the times were measured."""

    def __init__(self, entries: Mapping[str, Mapping[str, Any]] | None = None,
                 origin: Mapping[str, str] | None = None):
        self.entries: dict[str, dict[str, Any]] = {k: dict(v) for k, v in (entries or {}).items()}
        self.origin = dict(origin) if origin else None
        self.hits = 0
        self.misses = 0

    def foreign_to(self, origin: Mapping[str, str]) -> str | None:
        """How the cache's origin differs from `origin`, in words; None when it is the same, or the
        cache records none (format 1: its keys hold the device and version, so nothing of it matches)."""
        if self.origin is None:
            return None
        diffs = [f"{field} {self.origin[field]!r} (here {origin[field]!r})" for field in ORIGIN_FIELDS
                 if self.origin[field] != origin[field]]
        return ", ".join(diffs) or None

    def lookup(self, key: str) -> float | None:
        entry = self.entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        self.hits += 1
        return float(entry["ms"])

    def record(self, key: str, ms: float, tactic: str, kind: str, device: str) -> None:
        if math.isfinite(ms):
            self.entries[key] = {"ms": float(ms), "tactic": tactic, "kind": kind, "device": device}

    def merge(self, other: "TimingCache") -> "TimingCache":
        """Add `other`'s entries that this cache lacks; returns self."""
        for key, entry in other.entries.items():
            self.entries.setdefault(key, dict(entry))
        return self

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, **(self.origin or {}), "entries": dict(sorted(self.entries.items()))}

    def save(self, path: str | os.PathLike) -> None:
        """Write the cache, merged into what `path` already holds (a valid cache file) when that
        was measured where this one was; a file from another device or version is replaced."""
        merged = TimingCache(self.entries, self.origin)
        if Path(path).is_file():
            held = load_timing_cache(path)
            differs = held.foreign_to(self.origin) if self.origin else None
            if differs:
                log.warning("timing cache %s was measured with %s: replaced by this build's times", path, differs)
            else:
                merged.merge(held)
        try:
            Path(path).write_text(json.dumps(merged.to_json(), indent=1, sort_keys=True) + "\n")
        except OSError as exc:
            raise UsageError(f"cannot write the timing cache: {exc}", where=str(path),
                             hint="check that the folder exists and is writable") from exc

    @staticmethod
    def from_json(doc: Any, where: str = "timing cache") -> "TimingCache":
        """Check a parsed cache document field by field; UsageError naming the first bad one."""

        def bad(field: str, what: str) -> UsageError:
            return UsageError(f"{field}: {what}", where=where,
                              hint="a timing cache is written by --save-timing-cache; delete the file to start over")

        if not isinstance(doc, dict):
            raise bad("the document", f"is a {type(doc).__name__}, not an object")
        if doc.get("format") not in READABLE_FORMATS:
            raise bad("format", f"is {doc.get('format')!r}, this polykit reads formats "
                                f"{', '.join(map(str, READABLE_FORMATS))}")
        origin = {field: doc.get(field) for field in ORIGIN_FIELDS}
        if any(v is not None for v in origin.values()):  # recorded: all three (none in format 1, or unmeasured)
            for field, value in origin.items():
                if not isinstance(value, str):
                    raise bad(field, f"is {value!r}, not a string (the {field} that measured the times)")
        entries = doc.get("entries")
        if not isinstance(entries, dict):
            raise bad("entries", "is missing or not an object")
        for key, entry in entries.items():
            if not _KEY.match(key):
                raise bad(f"entries[{key[:80]!r}]", "is not a sha256 key (64 lowercase hex digits)")
            if not isinstance(entry, dict):
                raise bad(f"entries[{key!r}]", "is not an object")
            for field, (types, what) in _FIELDS.items():
                value = entry.get(field)
                if not isinstance(value, types) or isinstance(value, bool):
                    raise bad(f"entries[{key!r}].{field}", f"is {value!r}, not {what}")
            if not (math.isfinite(entry["ms"]) and entry["ms"] >= 0):
                raise bad(f"entries[{key!r}].ms", f"is {entry['ms']!r}, not a finite time >= 0")
        return TimingCache(entries, origin if origin["polykit"] is not None else None)


def load_timing_cache(path: str | os.PathLike) -> TimingCache:
    """Read and check a timing cache file."""
    doc = read_json(path, "timing cache", UsageError, hint="pass a file written by --save-timing-cache")
    return TimingCache.from_json(doc, where=str(path))

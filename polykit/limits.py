"""Resource limits: how much memory, time and structure polykit grants one file, build or run.

Every file polykit reads is untrusted, and a small one can declare huge sizes (an .npz member
"of 8 GiB", a plan arena of 8 TB, a Loop of 2**62 iterations). The readers check what a file
declares against its real size and against these limits *before* allocating or looping, and
refuse with a PolykitError saying which limit and how to raise it.

| limit              | default    | bounds                                                                  |
|--------------------|-----------:|-------------------------------------------------------------------------|
| host_memory        | 16 GiB     | host bytes one build or run may request: a cpu plan's arena and weights, random inputs |
| device_memory      | 64 GiB     | device bytes a cuda plan may request: its arena and weights              |
| data_bytes         | 1 GiB      | decompressed bytes of one data file (.npz members, JSON arrays), of one JSON file, and of one model's external data tensor |
| json_depth         | 200        | nesting depth of a JSON document (plans, caches, replays, data)          |
| json_digits        | 40         | digits of a JSON integer or float literal                               |
| body_depth         | 32         | nesting depth of control-flow bodies (If/Loop/Scan in a model or plan)  |
| fold_iterations    | 100000     | Loop iterations constant folding may evaluate in one build              |
| run_iterations     | 100000     | Loop iterations one run of an engine may execute                        |

Raise them with the environment variable ``POLYKIT_LIMITS`` ("host_memory=64GiB,json_depth=500";
sizes take K/M/G/T/KiB/MiB/GiB/TiB suffixes), or with the CLI's global ``--limit NAME=VALUE``
(repeatable; it sets ``POLYKIT_LIMITS`` for the command and the processes it starts). From
Python: ``with polykit.limits.raised(host_memory=1 << 36): ...``. The environment is the one
source: rank worker processes inherit it, and nothing else holds the values.
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from typing import Iterator

from polykit.errors import PolykitError, UsageError

ENV = "POLYKIT_LIMITS"
GiB = 1 << 30


@dataclass(frozen=True)
class Limits:
    """The limits in force (see the module docstring for what each bounds)."""

    host_memory: int = 16 * GiB
    device_memory: int = 64 * GiB
    data_bytes: int = 1 * GiB
    json_depth: int = 200
    json_digits: int = 40
    body_depth: int = 32
    fold_iterations: int = 100_000
    run_iterations: int = 100_000


NAMES = tuple(f.name for f in fields(Limits))
_SIZE = re.compile(r"^([0-9]+)\s*([KMGT]?)(i?B?)$", re.IGNORECASE)
_UNITS = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4}
_cache: dict[str, Limits] = {}


def parse_value(name: str, text: str) -> int:
    """The integer `text` gives limit `name` ("64GiB", "1G" and "1073741824" are sizes in bytes;
    K/M/G/T are powers of 1024); UsageError if it is not a count >= 0."""
    m = _SIZE.match(text.strip()) if text.isascii() else None
    if m is None or len(m.group(1)) > 20:
        raise UsageError(f"limit {name}={text!r} is not a count (digits, optionally with K/M/G/T or KiB/MiB/GiB/TiB)",
                         where=ENV, hint=f"e.g. {name}={getattr(Limits(), name)}")
    return int(m.group(1)) << (10 * _UNITS[m.group(2).upper()])


def parse(spec: str) -> dict[str, int]:
    """name -> value of a "name=value,name=value" specification; UsageError naming an unknown
    limit or a bad value."""
    out: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or name not in NAMES:
            raise UsageError(f"{item!r} does not set a known limit", where=ENV,
                             hint=f"write NAME=VALUE with NAME one of {', '.join(NAMES)}")
        out[name] = parse_value(name, value)
    return out


def current() -> Limits:
    """The limits in force: the defaults raised (or lowered) by ``POLYKIT_LIMITS``."""
    spec = os.environ.get(ENV, "")
    found = _cache.get(spec)
    if found is None:
        found = _cache[spec] = replace(Limits(), **parse(spec))
    return found


def encode(values: dict[str, int]) -> str:
    """The ``POLYKIT_LIMITS`` text of name -> value."""
    return ",".join(f"{k}={v}" for k, v in values.items())


@contextmanager
def raised(**values: int) -> Iterator[Limits]:
    """Set limits (by name) for the duration of the block, through ``POLYKIT_LIMITS``."""
    unknown = set(values) - set(NAMES)
    if unknown:
        raise UsageError(f"unknown limit(s) {sorted(unknown)}", hint=f"known limits: {', '.join(NAMES)}")
    saved = os.environ.get(ENV)
    merged = {**parse(saved or ""), **{k: int(v) for k, v in values.items()}}
    os.environ[ENV] = encode(merged)
    try:
        yield current()
    finally:
        if saved is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = saved


def size_text(n: int) -> str:
    """"8.0 GiB": a byte count for messages."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} B"


def raise_hint(name: str, wanted: int | None = None) -> str:
    """How to raise limit `name` (to `wanted`, if known)."""
    value = _suggest(name, wanted if wanted is not None else 2 * getattr(current(), name))
    return (f"if the input is trusted, raise the limit: --limit {name}={value} "
            f"(or {ENV}={name}={value} in the environment)")


def _suggest(name: str, wanted: int) -> str:
    """`wanted` as a value to type: a byte count rounded up to whole MiB/GiB/TiB."""
    if not name.endswith(("memory", "bytes")):
        return str(wanted)
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20)):
        if wanted >= 1 << shift or unit == "MiB":
            return f"{-(-wanted >> shift)}{unit}"
    return str(wanted)


def check(name: str, value: int, what: str, error: type[PolykitError], where: str | None = None) -> None:
    """`error` unless `value` (what `what` declares or needs) is within limit `name`."""
    limit = getattr(current(), name)
    if value > limit:
        shown = size_text(value) if name.endswith(("memory", "bytes")) else str(value)
        cap = size_text(limit) if name.endswith(("memory", "bytes")) else str(limit)
        raise error(f"{what} ({shown}) is over the {name} limit ({cap})", where=where, hint=raise_hint(name, value))

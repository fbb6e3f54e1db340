"""Checks of the paths polykit reads and writes, so a bad path is a PolykitError naming it
(a directory given as a file, a missing file, an output folder that does not exist), and the
one bounded reader of JSON files (caches, replays, data; plan metadata): sizes, number
lengths and nesting depth within polykit.limits, malformed text a PolykitError."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from polykit import limits
from polykit.errors import PolykitError, UsageError


def require_file(path: "str | os.PathLike[str]", what: str, error: type[PolykitError] = UsageError) -> Path:
    """`path` as a Path when it names a regular file; else `error` saying whether it is missing or
    a directory (`what` names the role, e.g. "model file")."""
    p = Path(path)
    if p.is_dir():
        raise error(f"{what} {str(p)!r} is a directory, not a file", hint=f"pass the {what} itself")
    if not p.is_file():
        raise error(f"{what} {str(p)!r} does not exist", hint="check the path")
    return p


def require_output_folder(path: "str | os.PathLike[str]", option: str) -> Path:
    """`path` as a Path when a file can be created there (its folder exists); UsageError naming
    `option` otherwise, before any long work whose result it would hold."""
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{option} {str(p)!r} is a directory, not a file name", hint="give a file name in it")
    if not p.parent.is_dir():
        raise UsageError(f"{option} {str(p)!r}: the folder {str(p.parent)!r} does not exist",
                         hint="create the folder first, or choose another path")
    return p


def write_text(path: "str | os.PathLike[str]", text: str, what: str) -> Path:
    """Write `text` (UTF-8) to `path`; UsageError naming `what` (e.g. "tactic replay file") when
    it cannot be written."""
    p = Path(path)
    try:
        p.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write the {what}: {exc}", where=str(p),
                         hint="check that the folder exists and is writable") from exc
    return p


def read_limited(path: "str | os.PathLike[str]", what: str, error: type[PolykitError] = UsageError,
                 hint: str | None = None) -> bytes:
    """The bytes of the file `path` (`what` names its role), after checking its real size
    against the data_bytes limit; `error` if it is missing, unreadable or too large."""
    p = require_file(path, what, error)
    try:
        size = p.stat().st_size
        limits.check("data_bytes", size, f"the {what}", error, where=str(p))
        return p.read_bytes()
    except OSError as exc:
        raise error(f"cannot read the {what}: {exc.strerror or exc}", where=str(p), hint=hint or "check the path") from None


def read_json(path: "str | os.PathLike[str]", what: str, error: type[PolykitError] = UsageError,
              hint: str | None = None) -> Any:
    """The parsed JSON document of the file `path` (UTF-8, within the limits: see parse_json)."""
    raw = read_limited(path, what, error, hint)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"the {what} is not UTF-8 text ({exc.reason} at byte {exc.start})", where=str(path),
                    hint=hint) from None
    return parse_json(text, str(path), what, error, hint)


def parse_json(text: "str | bytes", where: str, what: str = "JSON document", error: type[PolykitError] = UsageError,
               hint: str | None = None) -> Any:
    """`text` parsed as JSON within the limits: numbers of at most json_digits digits and in the
    range of a float64, nesting at most json_depth deep; `error` naming `where` otherwise (never
    a RecursionError, ValueError or a 10,000-digit integer)."""
    digits = limits.current().json_digits

    def number(literal: str) -> None:
        if len(literal) > digits + 8:  # sign, point, exponent
            raise _Refused(f"a number of {len(literal)} characters ({literal[:20]}...): more than the json_digits "
                           f"limit ({digits}) allows", "json_digits")

    def parse_int(literal: str) -> int:
        number(literal)
        return int(literal)

    def parse_float(literal: str) -> float:
        number(literal)
        value = float(literal)
        if math.isinf(value):
            raise _Refused(f"the number {literal[:40]}, beyond the range of a float64", "")
        return value

    try:
        doc = json.loads(text, parse_int=parse_int, parse_float=parse_float)
    except _Refused as exc:
        raise error(f"the {what} holds {exc.args[0]}", where=where,
                    hint=limits.raise_hint(exc.args[1]) if exc.args[1] else
                    "numbers must be finite float64 values; infinities are written Infinity / -Infinity") from None
    except RecursionError:
        raise _depth_error(where, what, error, "more levels than the parser can take") from None
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as exc:
        raise error(f"the {what} is not valid JSON: {exc}", where=where, hint=hint) from None
    except MemoryError:
        raise error(f"the {what} does not fit in memory", where=where,
                    hint=limits.raise_hint("data_bytes", len(text) // 2)) from None
    depth = json_depth(doc)
    if depth > limits.current().json_depth:
        raise _depth_error(where, what, error, f"{depth} levels deep")
    return doc


class _Refused(Exception):
    """A number parse_json refuses (message, the limit to raise or "")."""


def _depth_error(where: str, what: str, error: type[PolykitError], depth: str) -> PolykitError:
    limit = limits.current().json_depth
    return error(f"the {what} nests {depth}; the json_depth limit is {limit}", where=where,
                 hint=limits.raise_hint("json_depth"))


def json_depth(doc: Any) -> int:
    """The nesting depth of a parsed JSON value (a scalar is 0, [] is 1), without recursion."""
    deepest, stack = 0, [(doc, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (list, dict)):
            depth += 1
            deepest = max(deepest, depth)
            stack.extend((v, depth) for v in (value.values() if isinstance(value, dict) else value))
    return deepest

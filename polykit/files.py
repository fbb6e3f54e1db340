"""Checks of the paths polykit reads and writes, so a bad path is a PolykitError naming it
(a directory given as a file, a missing file, an output folder that does not exist)."""

from __future__ import annotations

import os
from pathlib import Path

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

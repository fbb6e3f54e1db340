"""Parsing of the CLI's value syntaxes (Polygraphy's): `--atol 1e-4 logits:1e-3`,
`--val-range x:[-1,1]`, `--input-shapes x:[1,3,224,224]`, `--check-error-stat out:max`;
and the build options several subcommands share (`channels_last_option`).

click takes one value per option occurrence, so `expand_multi_values` first rewrites
`--atol 1e-4 logits:1e-3` into `--atol 1e-4 --atol logits:1e-3`, consuming only the
tokens that look like values of that option (so a model path after them is left alone),
and `rewrite_runner_flags` turns plugin runner flags (`--trt`, `--onnxrt`) into ordered
`--runner NAME` options.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

import typer

from polykit.errors import UsageError

_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?inf"
_NAME = r"[^\s\[\]]+"
_TOL = re.compile(rf"^(?:(?P<name>{_NAME}):)?(?P<value>{_NUM})$")
_RANGE = re.compile(rf"^(?:(?P<name>{_NAME}):)?\[\s*(?P<low>{_NUM})\s*,\s*(?P<high>{_NUM})\s*\]$")
_SHAPE = re.compile(rf"^(?P<name>{_NAME}):\[(?P<dims>[\d\s,]*)\]$")
_STAT = re.compile(r"^(?:(?P<name>.+):)?(?P<stat>elemwise|max|mean|median|quantile)$")

#: option -> pattern its values must match (what expand_multi_values may consume)
MULTI_VALUE_OPTIONS: dict[str, "re.Pattern[str]"] = {
    "--atol": _TOL,
    "--rtol": _TOL,
    "--val-range": _RANGE,
    "--input-shapes": _SHAPE,
    "--check-error-stat": _STAT,
    "--providers": re.compile(r"^[A-Za-z][A-Za-z0-9_]*$"),
    "--mark-outputs": re.compile(r"^(?!-)(?!.*\.(onnx|plan)$).+$"),
}


def expand_multi_values(argv: Sequence[str], options: Mapping[str, "re.Pattern[str]"] = MULTI_VALUE_OPTIONS) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        out.append(token)
        i += 1
        pattern = options.get(token)
        if pattern is None:
            continue
        if i < len(argv):  # the first value is always taken (click reports a bad one)
            out.append(argv[i])
            i += 1
        while i < len(argv) and not argv[i].startswith("--") and pattern.match(argv[i]):
            out.extend([token, argv[i]])
            i += 1
    return out


def rewrite_runner_flags(argv: Sequence[str], flags: Mapping[str, str]) -> list[str]:
    """Replace each runner flag with `--runner NAME` (order kept); stops at a bare `--`."""
    out: list[str] = []
    for i, token in enumerate(argv):
        if token == "--":
            return out + list(argv[i:])
        if token in flags:
            out.extend(["--runner", flags[token]])
        else:
            out.append(token)
    return out


def _num(text: str) -> float:
    return float(text)


def parse_tolerances(values: Sequence[str], option: str) -> dict[str, float]:
    """['1e-4', 'logits:1e-3'] -> {'': 1e-4, 'logits': 1e-3}."""
    table: dict[str, float] = {}
    for v in values:
        m = _TOL.match(v.strip())
        if m is None:
            raise UsageError(f"{option} {v!r} is not a number or NAME:NUMBER", hint=f"e.g. {option} 1e-4 logits:1e-3")
        value = _num(m["value"])
        if value < 0:
            raise UsageError(f"{option} {v!r} is negative")
        table[m["name"] or ""] = value
    return table


def parse_val_ranges(values: Sequence[str]) -> dict[str, tuple[float, float]]:
    """['x:[-1,1]', '[0,5]'] -> {'x': (-1.0, 1.0), '': (0.0, 5.0)}."""
    table: dict[str, tuple[float, float]] = {}
    for v in values:
        m = _RANGE.match(v.strip())
        if m is None:
            raise UsageError(f"--val-range {v!r} is not NAME:[LOW,HIGH] or [LOW,HIGH]", hint="e.g. --val-range x:[-1,1]")
        low, high = _num(m["low"]), _num(m["high"])
        if low > high:
            raise UsageError(f"--val-range {v!r}: low > high")
        table[m["name"] or ""] = (low, high)
    return table


def parse_input_shapes(values: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """['x:[1,3,224,224]'] -> {'x': (1, 3, 224, 224)}."""
    table: dict[str, tuple[int, ...]] = {}
    for v in values:
        m = _SHAPE.match(v.strip())
        if m is None:
            raise UsageError(f"--input-shapes {v!r} is not NAME:[D0,D1,...]", hint="e.g. --input-shapes x:[1,3,224,224]")
        dims = [d.strip() for d in m["dims"].split(",") if d.strip()]
        table[m["name"]] = tuple(int(d) for d in dims)
    return table


def parse_error_stats(values: Sequence[str]) -> dict[str, str]:
    """['elemwise', 'logits:max'] -> {'': 'elemwise', 'logits': 'max'}."""
    table: dict[str, str] = {}
    for v in values:
        m = _STAT.match(v.strip())
        if m is None:
            raise UsageError(f"--check-error-stat {v!r} is not [NAME:]elemwise|max|mean|median|quantile")
        table[m["name"] or ""] = m["stat"]
    return table


# ---- options of the commands that build a plan (convert, run, bench): declared once -------
LOAD_TACTICS = typer.Option(None, "--load-tactics", metavar="FILE",
                            help="force the tactics of a replay file (written by --save-tactics)")
SAVE_TACTICS = typer.Option(None, "--save-tactics", metavar="FILE",
                            help="write the tactic chosen for every layer to a replay file")


def channels_last_option() -> Any:
    """`--channels-last/--no-channels-last` (BuilderConfig.channels_last; unset: auto)."""
    import typer

    return typer.Option(None, "--channels-last/--no-channels-last",
                        help="run 2-D convolutions in NHWC (default: on for fp16 cuda builds)")

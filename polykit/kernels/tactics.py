"""The tactic table: named implementations of a layer kind on a target.

A tactic is the unit of autotuning and of debugging. Each plan layer names the tactic it
runs with; `select_tactics` in the builder looks candidates up here. On the cpu target the
reference kernel is the one tactic of every kind ("cpu.reference"); the cuda target
registers its kernels' tactics from polykit.kernels.cuda (descriptions only: sources and
parameters, importable without cuda-python, so CI can compile every variant).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

#: target -> layer kind -> tactics in priority order (first that supports a layer wins
#: unless timing chooses otherwise)
TACTICS: dict[str, dict[str, list["Tactic"]]] = {}


@dataclass(frozen=True)
class Tactic:
    """A named implementation of layer `kind` on `target`, with fixed parameters."""

    target: str
    kind: str
    name: str
    params: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    #: supports(layer) -> bool: whether this tactic can run the layer (shapes, dtypes, attrs)
    supports: Callable[[Any], bool] = field(default=lambda layer: True, hash=False, compare=False)
    priority: int = 0


def register_tactic(t: Tactic) -> Tactic:
    bucket = TACTICS.setdefault(t.target, {}).setdefault(t.kind, [])
    bucket[:] = [x for x in bucket if x.name != t.name] + [t]
    bucket.sort(key=lambda x: -x.priority)
    return t


def candidates(target: str, kind: str, layer: Any) -> list[Tactic]:
    """Tactics of `target` that can run `layer` (kind given separately for fused kinds)."""
    _load_target_tactics(target)
    out = [t for t in TACTICS.get(target, {}).get(kind, []) if t.supports(layer)]
    if not out:
        out = [t for t in TACTICS.get(target, {}).get("*", []) if t.supports(layer)]
    return out


def find_tactic(target: str, kind: str, name: str) -> Tactic | None:
    _load_target_tactics(target)
    for t in TACTICS.get(target, {}).get(kind, []) + TACTICS.get(target, {}).get("*", []):
        if t.name == name:
            return t
    return None


_loaded: set[str] = set()


def _load_target_tactics(target: str) -> None:
    if target in _loaded:
        return
    _loaded.add(target)
    if target == "cpu":
        register_tactic(Tactic("cpu", "*", "cpu.reference"))
    elif target == "cuda":
        import importlib

        importlib.import_module("polykit.kernels.cuda")

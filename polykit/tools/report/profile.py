"""Per-layer profile of polykit's engine (`polykit run --trt --profile`): which layers and
tactics take the time.

`summarize(runs, layers)` turns the ExecutionContext profiles of several runs into one row
per layer (median milliseconds over the runs, share of the total, kind, tactic) and totals
per tactic; `render` prints the slowest layers, `to_json` gives everything. On the cuda
target the times are GPU times (the runtime queues every layer before the GPU starts them).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence


@dataclass(frozen=True)
class LayerTime:
    name: str
    kind: str
    tactic: str
    ms: float  # median over the profiled runs
    share: float  # of the summed medians


@dataclass
class ProfileSummary:
    runs: int
    total_ms: float
    layers: list[LayerTime] = field(default_factory=list)  # slowest first
    tactics: list[tuple[str, float, int]] = field(default_factory=list)  # (tactic, ms, layers), slowest first

    def to_json(self) -> dict[str, Any]:
        return {"runs": self.runs, "total_ms": self.total_ms,
                "layers": [vars(x) for x in self.layers],
                "tactics": [{"tactic": t, "ms": ms, "layers": n} for t, ms, n in self.tactics]}


def summarize(runs: Sequence[Sequence[tuple[str, float]]], layers: Iterable[Any]) -> ProfileSummary:
    """One row per layer from `runs` (each a list of (layer, ms) as ExecutionContext.profile
    gives it); `layers` are the plan's LayerDescs (kind and tactic of each name)."""
    info = {lay.name: lay for lay in layers}
    per_layer: dict[str, list[float]] = {}
    for run in runs:
        for name, ms in run:
            per_layer.setdefault(name, []).append(float(ms))
    medians = {name: statistics.median(v) for name, v in per_layer.items()}
    total = sum(medians.values())
    rows = []
    for name, ms in medians.items():
        lay = info.get(name)
        rows.append(LayerTime(name, getattr(lay, "kind", "?"), getattr(lay, "tactic", "") or "-", ms,
                              ms / total if total else 0.0))
    rows.sort(key=lambda r: -r.ms)
    tactics: dict[str, list[float]] = {}
    for r in rows:
        tactics.setdefault(r.tactic, []).append(r.ms)
    return ProfileSummary(len(runs), total, rows,
                          sorted(((t, sum(v), len(v)) for t, v in tactics.items()), key=lambda x: -x[1]))


def render(console: Any, title: str, summary: ProfileSummary, top: int = 15) -> None:
    """Totals per tactic, then the `top` slowest layers, as rich tables."""
    from rich.markup import escape
    from rich.table import Table

    console.print(f"[bold]{escape(title)}[/]: {summary.total_ms:.3f} ms in {len(summary.layers)} layers "
                  f"(median of {summary.runs} run(s) per layer)")
    by_tactic = Table(show_edge=False, box=None)
    for col, just in (("tactic", "left"), ("ms", "right"), ("%", "right"), ("layers", "right")):
        by_tactic.add_column(col, justify=just)
    for tactic, ms, n in summary.tactics:
        by_tactic.add_row(escape(tactic), f"{ms:.3f}", f"{100 * ms / summary.total_ms if summary.total_ms else 0:.1f}", str(n))
    console.print(by_tactic)
    slow = Table(show_edge=False, box=None)
    for col, just in (("ms", "right"), ("%", "right"), ("layer", "left"), ("kind", "left"), ("tactic", "left")):
        slow.add_column(col, justify=just)
    for r in summary.layers[:top]:
        slow.add_row(f"{r.ms:.3f}", f"{100 * r.share:.1f}", escape(r.name), escape(r.kind), escape(r.tactic))
    if len(summary.layers) > top:
        console.print(f"slowest {top} of {len(summary.layers)} layers:")
    console.print(slow)
    if any(t.startswith("cuda.") for t, _, _ in summary.tactics):
            console.print("[dim](while profiling, the cuda target runs each layer behind a stream hold and without CUDA "
                      "graphs: the runner's end-to-end time above is not its real speed)[/]")

"""Reports of a comparison: a rich table per runner pair for people, JSON for machines."""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

from polykit.tools.comparator import AccuracyReport, RunResults


def _g(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.3g}" if math.isfinite(x) else str(x)


def to_json(report: AccuracyReport, results: RunResults | None = None) -> dict[str, Any]:
    """A JSON-able dict: verdict, run-level problems, per pair and output every statistic."""

    def clean(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            return str(value)
        if isinstance(value, (list, tuple)):
            return [clean(v) for v in value]
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        return value

    doc: dict[str, Any] = {
        "passed": report.passed,
        "problems": list(report.problems),
        "comparisons": [
            {"reference": p.reference, "runner": p.runner, "iteration": p.iteration, "passed": p.passed,
             "outputs": [clean(asdict(o)) for o in p.outputs]}
            for p in report.pairs
        ],
    }
    if results is not None:
        doc["runners"] = {
            name: {"iterations": len(its), "mean_inference_time_s": (sum(results.times[name]) / len(its)) if its else None}
            for name, its in results.outputs.items()
        }
    return doc


def render(console: Any, report: AccuracyReport, results: RunResults | None = None) -> None:
    """Print per-output tables and a one-line summary to a rich Console."""
    from rich.markup import escape

    if results is not None:
        for name, times in results.times.items():
            if times:
                console.print(f"[bold]{name}[/]: {len(times)} iteration(s), mean inference time "
                              f"{1000 * sum(times) / len(times):.3f} ms")
    for pair in report.pairs:
        console.print(f"[bold]{pair.runner} vs {pair.reference}[/] (reference), iteration {pair.iteration}")
        for o in pair.outputs:
            verdict = "[green]PASSED[/]" if o.passed else "[bold red]FAILED[/]"
            console.print(f"  {escape(o.name)}: {verdict}" + (f" ({escape(o.message)})" if o.message else ""))
            if o.worst_index is None and o.shape is None:
                continue
            console.print(f"    abs error: max {_g(o.max_abs)}, mean {_g(o.mean_abs)}, median {_g(o.median_abs)} | "
                          f"rel error: max {_g(o.max_rel)}, mean {_g(o.mean_rel)}, median {_g(o.median_rel)}")
            if o.worst_index is not None:
                console.print(f"    worst element {escape(str(list(o.worst_index)))}: reference {_g(o.worst_reference)}, "
                              f"{escape(pair.runner)} {_g(o.worst_actual)}")
            if o.metric:
                console.print(f"    {o.metric} = {_g(o.metric_value)} (threshold {_g(o.threshold)})")
            elif o.required_atol is not None:
                console.print(f"    passes with atol >= {_g(o.required_atol)} (at rtol {_g(o.rtol)}) "
                              f"or rtol >= {_g(o.required_rtol)} (at atol {_g(o.atol)}), {o.stat}")
    for problem in report.problems:
        console.print(f"[red]FAILED[/]: {escape(problem)}")
    failures = report.failures()
    if report.passed and not report.pairs:
        ran = len(results.runners) if results is not None else 0
        console.print(f"[bold green]PASSED[/] | {ran} result set(s), nothing to compare (give two or more runners)")
    elif report.passed:
        n = sum(len(p.outputs) for p in report.pairs)
        console.print(f"[bold green]PASSED[/] | {len(report.pairs)} comparison(s), {n} output(s) match")
    else:
        names = sorted({f"{o.name} ({p.runner} vs {p.reference})" for p, o in failures})
        console.print(f"[bold red]FAILED[/] | {len(failures)} output comparison(s) failed: {escape(', '.join(names))}"
                      + (f"; {len(report.problems)} problem(s)" if report.problems else ""))


def render_text(report: AccuracyReport, results: RunResults | None = None, width: int = 160) -> str:
    """The report as plain text (assertion messages, logs)."""
    import io

    from rich.console import Console

    buf = io.StringIO()
    render(Console(file=buf, width=width, no_color=True, highlight=False), report, results)
    return buf.getvalue()

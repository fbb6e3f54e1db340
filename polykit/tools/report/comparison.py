"""Reports of a comparison: rich text for people, JSON for machines (and report.html for browsers).

Text has three levels of detail: "quiet" (the summary line), "normal" (per output tables;
for a layerwise run, one line per runner pair and the first divergence instead of hundreds
of rows) and "verbose" (every compared tensor, in topological order, and the fused-away ones).
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

from polykit.tools.compare.comparator import AccuracyReport, RunResults
from polykit.tools.compare.funcs import OutputComparison
from polykit.tools.compare.divergence import Divergence, LayerwiseReport

#: render's levels of detail
DETAILS = ("quiet", "normal", "verbose")
#: OutputComparison fields a `layers` row of the JSON carries as its "error"
LAYER_STATS = ("max_abs", "mean_abs", "median_abs", "max_rel", "mean_rel", "median_rel", "atol", "rtol", "stat",
               "metric", "metric_value", "threshold", "message")


def _g(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.3g}" if math.isfinite(x) else str(x)


def clean(value: Any) -> Any:
    """`value` with non-finite floats as strings ("inf", "nan"): strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    return value


def to_json(report: AccuracyReport, results: RunResults | None = None,
            layerwise: LayerwiseReport | None = None) -> dict[str, Any]:
    """A JSON-able dict: verdict, run-level problems, per pair and output every statistic; with
    `layerwise`, the first divergence, the compared tensors in topological order and the fused-away ones."""
    doc: dict[str, Any] = {
        "passed": report.passed,
        "problems": list(report.problems),
        "comparisons": [
            {"reference": p.reference, "runner": p.runner, "iteration": p.iteration, "passed": p.passed,
             "outputs": [clean(asdict(o)) for o in p.outputs], "not_compared": list(p.not_compared)}
            for p in report.pairs
        ],
    }
    if results is not None:
        doc["runners"] = {
            name: {"iterations": len(its), "mean_inference_time_s": (sum(results.times[name]) / len(its))
                   if its and results.times[name] else None}
            for name, its in results.outputs.items()
        }
    if layerwise is not None:
        first = layerwise.first_divergence
        doc["first_divergence"] = None if first is None else {
            "tensor": first.tensor, "node": first.node, "op": first.op, "error": clean(asdict(first.error)),
            "inputs": [{"name": i.name, "state": i.state, "error": None if i.error is None else _stats(i.error)}
                       for i in first.inputs],
            "region": [{"node": node, "op": op} for node, op in first.region],
            "runner": layerwise.runner, "reference": layerwise.reference, "iteration": layerwise.iteration,
        }
        doc["layers"] = [{"tensor": r.tensor, "node": r.node, "op": r.op, "passed": r.error.passed,
                          "error": _stats(r.error)} for r in layerwise.layers]
        doc["fused_away"] = list(layerwise.fused_away)
    return doc


def _stats(o: OutputComparison) -> dict[str, Any]:
    return clean({k: getattr(o, k) for k in LAYER_STATS})


def render(console: Any, report: AccuracyReport, results: RunResults | None = None,
           layerwise: LayerwiseReport | None = None, detail: str = "normal") -> None:
    """Print the report to a rich Console at a level of `DETAILS`."""
    if detail != "quiet":
        _render_body(console, report, results, layerwise, detail)
    console.print(summary_line(report, results, layerwise))


def _render_body(console: Any, report: AccuracyReport, results: RunResults | None,
                 layerwise: LayerwiseReport | None, detail: str) -> None:
    from rich.markup import escape

    if results is not None:
        for name, times in results.times.items():
            if times:
                console.print(f"[bold]{name}[/]: {len(times)} iteration(s), mean inference time "
                              f"{1000 * sum(times) / len(times):.3f} ms")
    brief = layerwise is not None and layerwise.marked and detail != "verbose"
    order = {r.tensor: k for k, r in enumerate(layerwise.layers)} if layerwise is not None else {}
    for pair in report.pairs:
        if brief:
            failed = sum(not o.passed for o in pair.outputs)
            console.print(f"[bold]{pair.runner} vs {pair.reference}[/] (reference), iteration {pair.iteration}: "
                          f"{len(pair.outputs)} tensor(s) compared, {failed} differ"
                          + (f", {len(pair.not_compared)} not compared" if pair.not_compared else ""))
            continue
        console.print(f"[bold]{pair.runner} vs {pair.reference}[/] (reference), iteration {pair.iteration}")
        for o in sorted(pair.outputs, key=lambda o: order.get(o.name, len(order))):
            verdict = "[green]PASSED[/]" if o.passed else "[bold red]FAILED[/]"
            console.print(f"  {escape(o.name)}: {verdict}" + (f" ({escape(o.message)})" if o.message else ""))
            _render_stats(console, o, pair.runner, "    ")
    for problem in report.problems:
        console.print(f"[red]FAILED[/]: {escape(problem)}")
    if layerwise is None or not layerwise.marked:
        return
    if layerwise.fused_away:
        listed = ": " + ", ".join(layerwise.fused_away) if detail == "verbose" else " (-v lists them)"
        console.print(f"{len(layerwise.fused_away)} ONNX tensor(s) fused away inside polykit layers or absent from "
                      f"one side, not compared{escape(listed)}")
    if layerwise.first_divergence is not None:
        _render_divergence(console, layerwise.first_divergence, layerwise)
    elif report.pairs:
        console.print("no divergence: every compared tensor agrees")


def _render_stats(console: Any, o: OutputComparison, runner: str, indent: str) -> None:
    from rich.markup import escape

    if o.worst_index is None and o.shape is None:
        return
    console.print(f"{indent}abs error: max {_g(o.max_abs)}, mean {_g(o.mean_abs)}, median {_g(o.median_abs)} | "
                  f"rel error: max {_g(o.max_rel)}, mean {_g(o.mean_rel)}, median {_g(o.median_rel)}")
    if o.worst_index is not None:
        console.print(f"{indent}worst element {escape(str(list(o.worst_index)))}: reference {_g(o.worst_reference)}, "
                      f"{escape(runner)} {_g(o.worst_actual)}")
    if o.metric:
        console.print(f"{indent}{o.metric} = {_g(o.metric_value)} (threshold {_g(o.threshold)})")
    elif o.required_atol is not None:
        console.print(f"{indent}passes with atol >= {_g(o.required_atol)} (at rtol {_g(o.rtol)}) "
                      f"or rtol >= {_g(o.required_rtol)} (at atol {_g(o.atol)}), {o.stat}")


def _render_divergence(console: Any, d: Divergence, layerwise: LayerwiseReport) -> None:
    from rich.markup import escape

    console.print(f"[bold red]first divergence[/]: tensor {escape(repr(d.tensor))} from node {escape(repr(d.node))} "
                  f"({escape(d.op)}), {escape(layerwise.runner)} vs {escape(layerwise.reference)}, "
                  f"iteration {layerwise.iteration}")
    if d.error.message:
        console.print(f"    {escape(d.error.message)}")
    _render_stats(console, d.error, layerwise.runner, "    ")
    if len(d.region) > 1:
        console.print("    computed together (no tensor between them compared): "
                      + escape(", ".join(f"{node} ({op})" for node, op in d.region)))
    states = [f"{i.name} {i.state}" + (f" (max abs error {_g(i.error.max_abs)})" if i.error is not None else "")
              for i in d.inputs]
    console.print("    inputs: " + escape(", ".join(states) or "none"))


def summary_line(report: AccuracyReport, results: RunResults | None = None,
                 layerwise: LayerwiseReport | None = None) -> str:
    """The one-line verdict (what -q prints)."""
    from rich.markup import escape

    failures = report.failures()
    if report.passed and not report.pairs:
        ran = len(results.runners) if results is not None else 0
        return f"[bold green]PASSED[/] | {ran} result set(s), nothing to compare (give two or more runners)"
    count = sum(len(p.outputs) for p in report.pairs)
    marked = layerwise is not None and layerwise.marked
    if report.passed:
        what = "tensor(s)" if marked else "output(s)"
        fused = f"; {len(layerwise.fused_away)} fused away (not compared)" if marked and layerwise.fused_away else ""
        return f"[bold green]PASSED[/] | {len(report.pairs)} comparison(s), {count} {what} match{fused}"
    problems = f"; {len(report.problems)} problem(s)" if report.problems else ""
    if marked:
        first = layerwise.first_divergence
        where = f"; first divergence: {first.tensor!r} (node {first.node!r}, {first.op})" if first else ""
        return (f"[bold red]FAILED[/] | {len(failures)} of {count} tensor comparison(s) differ"
                f"{escape(where)}{problems}")
    names = sorted({f"{o.name} ({p.runner} vs {p.reference})" for p, o in failures})
    return f"[bold red]FAILED[/] | {len(failures)} output comparison(s) failed: {escape(', '.join(names))}{problems}"


def render_text(report: AccuracyReport, results: RunResults | None = None, width: int = 160,
                layerwise: LayerwiseReport | None = None, detail: str = "normal") -> str:
    """The report as plain text (assertion messages, logs)."""
    import io

    from rich.console import Console

    buf = io.StringIO()
    render(Console(file=buf, width=width, no_color=True, highlight=False), report, results, layerwise, detail)
    return buf.getvalue()

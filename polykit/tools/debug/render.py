"""The text reports of `polykit debug tactics`, `debug reduce` and `debug precision` (rich, on
stdout); `--json` prints each report's `to_json()` instead. Under the CLI's `-q` each prints only
its summary line, unwrapped (what was found, and the file written); errors still go to stderr."""

from __future__ import annotations

import logging
import shlex
from typing import Any, Optional

log = logging.getLogger("polykit")


def _quiet() -> bool:
    """-q: the CLI set the polykit logger to errors only."""
    return not log.isEnabledFor(logging.WARNING)


def _console() -> Any:
    from rich.console import Console

    return Console(highlight=False)


def _numbers(verdict: Any) -> str:
    return f": max abs {verdict.max_abs:.3g}, max rel {verdict.max_rel:.3g}" if verdict.max_abs is not None else ""


def _verdict(verdict: Any) -> str:
    """"passes" / "FAILS", the worst errors and what failed, as rich markup."""
    from rich.markup import escape

    return (f"{'passes' if verdict.passed else 'FAILS'}{_numbers(verdict)}"
            + (f" ({escape(verdict.detail)})" if verdict.detail else ""))


def _table(*columns: str) -> Any:
    from rich.table import Table

    table = Table(show_edge=False, box=None)
    table.add_column(columns[0], no_wrap=True)
    for column in columns[1:]:
        table.add_column(column, overflow="fold")
    return table


def render_tactics(report: Any, artifacts: Optional[str]) -> None:
    """The bad build's verdict, then the culprits as a table (or that there are none)."""
    from rich.markup import escape

    console = _console()
    result = report.result
    if _quiet():
        names = ", ".join(c.layer for c in result.culprits)
        console.print(f"debug tactics: {len(result.culprits)} culprit(s) in {report.builds} build(s)"
                      + (f": {escape(names)}" if names else f"; bad build {_verdict(result.bad)}"), soft_wrap=True)
        return
    console.print(f"[bold]debug tactics[/]: {len(result.suspects)} layer(s) have other tactics in the bad build than in "
                  f"the good one ({escape(report.good_source)})")
    console.print(f"bad build: {_verdict(result.bad)}")
    if not result.culprits:
        console.print(f"no culprits: the bad build passes the check ({report.builds} build(s))")
    else:
        console.print(f"{len(result.culprits)} culprit(s) found in {report.builds} builds; with them on their good "
                      "tactics the build passes. The error each introduces alone:")
        grouped = any(c.group for c in result.culprits)
        table = _table("layer", "tactic", "good tactic", "max abs", "max rel", *(("fails only with",) if grouped else ()))
        for c in result.culprits:
            table.add_row(escape(c.layer), escape(c.tactic), escape(c.good_tactic),
                          *(f"{v:.3g}" if v is not None else "-" for v in (c.alone.max_abs, c.alone.max_rel)),
                          *((escape(", ".join(c.group)) or "-",) if grouped else ()))
        console.print(table)
    if artifacts:
        console.print(f"wrote good.json, bad.json, fixed.json and culprits.json to {escape(artifacts)}")


def render_reduce(report: Any, output: str, min_good: Optional[str], asked_min_good: bool) -> None:
    """The reduction (nodes before and after, checks), the reduced subgraph's nodes, I/O and
    verdict, and the nearest passing subgraph."""
    from rich.markup import escape

    console = _console()
    graph = report.reduced.model.graph
    if report.verdict.passed:
        console.print(f"debug reduce: the model passes the check ({escape(report.verdict.detail or 'no failure')}): "
                      f"nothing to reduce; wrote it unchanged to {escape(output)}", soft_wrap=True)
        return
    if _quiet():
        console.print(f"debug reduce: {report.total_nodes} node(s) -> {len(graph.node)}; reduced model "
                      f"{_verdict(report.verdict)}; wrote {escape(output)}" + (f" and {escape(min_good)}" if min_good else ""), soft_wrap=True)
        return
    console.print(f"[bold]debug reduce[/]: {report.total_nodes} node(s) -> {len(graph.node)} in {report.checks} "
                  f"check(s) ({report.builds} build(s))")
    table = _table("node", "op")
    for node in graph.node:
        table.add_row(escape(node.name), node.op_type)
    console.print(table)
    console.print(f"inputs: {escape(', '.join(i.name for i in graph.input))}; outputs: "
                  f"{escape(', '.join(o.name for o in graph.output))}")
    console.print(f"reduced model: {_verdict(report.verdict)}; wrote {escape(output)}")
    if min_good:
        console.print(f"nearest passing subgraph ({len(report.min_good.model.graph.node)} node(s)): wrote "
                      f"{escape(min_good)}")
    elif asked_min_good:
        console.print("--min-good: no check passed a subgraph near the reduced one; nothing written")


def render_build(report: Any) -> None:
    """One line per build (passed or failed, and where its artifacts went), then the pass rate."""
    from rich.markup import escape

    console = _console()
    for it in report.iterations:
        if not _quiet():
            moved = f"; {escape(', '.join(it.sorted))}" if it.sorted else ""
            console.print(f"build {it.iteration + 1}: {_verdict(it.verdict)}{moved}", soft_wrap=True)
    total = len(report.iterations)
    console.print(f"debug build: {report.passed} of {total} build(s) passed")


def render_precision(report: Any, model: str, output: Optional[str]) -> None:
    """The nodes to keep in fp32 with their ranking scores, the error and latency before and
    after, and the --layer-precisions value with a command that uses it."""
    from rich.markup import escape

    console = _console()
    low = report.precision
    if _quiet():
        value = report.layer_precisions() if report.nodes else ""
        console.print(f"debug precision ({low}): " + (f"--layer-precisions {escape(value)}; after {_verdict(report.after)}"
                                                      if value else f"no node needs fp32; {_verdict(report.before)}")
                      + (f"; wrote {escape(output)}" if output else ""), soft_wrap=True)
        return
    console.print(f"[bold]debug precision[/] ({low}): {len(report.nodes)} of {len(report.scores)} candidate node(s) "
                  f"must stay in fp32 ({report.checks} check(s), {report.builds} build(s); ranked {report.rank})")
    if report.nodes:
        table = _table("node", "op", "score")
        for name, op in zip(report.nodes, report.ops):
            table.add_row(escape(name), op, f"{report.scores.get(name, 0.0):.3g}")
        console.print(table)
    for label, verdict, ms in ((f"before ({low} everywhere)", report.before, report.latency_before_ms),
                               ("after (these nodes in fp32)", report.after, report.latency_after_ms)):
        console.print(f"{label}: {_verdict(verdict)}" + (f"; latency {ms:.3f} ms (median)" if ms is not None else ""))
    if not report.nodes:
        console.print(f"the {low} build passes as it is: no node needs fp32")
        return
    value = report.layer_precisions()
    console.print(f"--layer-precisions {escape(value)}")
    console.print(f"e.g. polykit run {escape(shlex.quote(model))} --trt --onnxrt {escape(shlex.join(report.flags))} "
                  f"--layer-precisions {escape(shlex.quote(value))}")
    if output:
        console.print(f"wrote {escape(output)}")

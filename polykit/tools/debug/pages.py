"""The HTML reports of `polykit debug tactics|reduce|precision --report FILE.html`.

    save_debug_report("reduce.html", report.to_json(), "polykit debug reduce model.onnx")

Each page is drawn from the tool's `--json` document alone (PAGES, by its "tool" key): the
keys polykit.tools.report.html.render_html reads (summary, tables with failed rows in red,
bar charts), so the page shows the numbers the JSON holds.

- debug tactics: the culprits with their bad and good tactics and the error each introduces
  alone; every bisection step with the layers it put on their bad and their good tactics.
- debug reduce: every step of the search (its node set as a span of the topological order
  and the nodes left out of it); the reduced subgraph's nodes and I/O; the nearest passing one.
- debug precision: the error and latency before and after, the nodes kept in fp32, every step
  of the search, and each candidate node's error contribution as a bar chart.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from polykit.errors import UsageError
from polykit.tools.report.html import format_number, save_html

#: names a table cell lists before it says "and N more"
MAX_NAMES = 40


def _verdict(passed: Any) -> str:
    return "passes" if passed else "FAILS"


def _errors(entry: Mapping[str, Any]) -> list[str]:
    """max abs and max rel of a check's JSON entry ("-" when it gave no numbers)."""
    error = entry.get("error") or {}
    return [format_number(error.get("max_abs")), format_number(error.get("max_rel"))]


def _names(names: Sequence[str], everything: int | None = None) -> str:
    """Names for a table cell: "none", "all N" when they are all of `everything`, else a list."""
    if not names:
        return "none"
    if everything is not None and len(names) == everything and everything > 1:
        return f"all {everything}"
    shown = ", ".join(names[:MAX_NAMES])
    return shown + (f" and {len(names) - MAX_NAMES} more" if len(names) > MAX_NAMES else "")


def _steps_table(title: str, columns: Sequence[str], steps: Sequence[Mapping[str, Any]],
                 cells: Callable[[Mapping[str, Any]], list[Any]]) -> dict[str, Any]:
    """A table of a search's checks: `#`, the `cells` of each, its verdict, errors and detail."""
    rows = [[i + 1, *cells(step), _verdict(step.get("passed")), *_errors(step), step.get("detail", "")]
            for i, step in enumerate(steps)]
    return {"title": title, "columns": ["#", *columns, "verdict", "max abs", "max rel", "detail"], "rows": rows,
            "failed": [not step.get("passed") for step in steps]}


def tactics_page(doc: Mapping[str, Any]) -> dict[str, Any]:
    suspects = list(doc.get("suspects") or ())
    culprits = list(doc.get("culprits") or ())
    bad = doc.get("bad") or {}
    summary = {"layers with other tactics (suspects)": len(suspects), "good tactics from": doc.get("good"),
               "bad build": f"{_verdict(bad.get('passed'))} (max abs {_errors(bad)[0]}, max rel {_errors(bad)[1]})",
               "culprits": ", ".join(c["layer"] for c in culprits) or "none", "plans built": doc.get("builds")}

    def sides(trial: Mapping[str, Any]) -> list[str]:
        on_bad = list(trial.get("bad_layers") or ())
        return [_names(on_bad, len(suspects)), _names([s for s in suspects if s not in on_bad], len(suspects))]

    tables = [{"title": "Culprits: with these on their good tactics the build passes",
               "columns": ["layer", "tactic", "good tactic", "max abs alone", "max rel alone", "fails only with"],
               "rows": [[c["layer"], c["tactic"], c["good_tactic"], *_errors(c), ", ".join(c.get("group") or ()) or "-"]
                        for c in culprits], "failed": [True] * len(culprits)},
              _steps_table("Bisection steps", ["on bad tactics", "on good tactics"], doc.get("trials") or (), sides)]
    charts = [{"title": "Error each culprit introduces alone", "labels": [c["layer"] for c in culprits],
               "values": [(c.get("error") or {}).get("max_abs") for c in culprits], "failed": [True] * len(culprits),
               "unit": "max abs error"}] if culprits else []
    return {"summary": summary, "tables": tables, "charts": charts}


def _subgraph_tables(label: str, sub: Mapping[str, Any]) -> list[dict[str, Any]]:
    io = [[role, t["name"], t.get("dtype") or "-", "-" if t.get("shape") is None else str(t["shape"])]
          for role in ("input", "output") for t in sub.get(f"{role}s") or ()]
    return [{"title": f"{label}: {len(sub.get('nodes') or ())} node(s), {_verdict(sub.get('passed'))}",
             "columns": ["#", "node", "op"],
             "rows": [[i, name, op] for i, (name, op) in enumerate(zip(sub.get("nodes") or (), sub.get("ops") or ()))]},
            {"title": f"{label}: inputs and outputs", "columns": ["", "tensor", "dtype", "shape"], "rows": io}]


def reduce_page(doc: Mapping[str, Any]) -> dict[str, Any]:
    reduced = doc.get("reduced") or {}
    good = doc.get("min_good")
    summary = {"model nodes": doc.get("total_nodes"), "reduced to": f"{len(reduced.get('nodes') or ())} node(s)",
               "reduced subgraph": f"{_verdict(reduced.get('passed'))} (max abs {_errors(reduced)[0]}, "
                                   f"max rel {_errors(reduced)[1]})",
               "checks": doc.get("checks"), "plans built": doc.get("builds")}
    if reduced.get("path"):
        summary["reduced model written to"] = reduced["path"]
    if good is not None and good.get("path"):
        summary["nearest passing model written to"] = good["path"]

    def span(step: Mapping[str, Any]) -> list[Any]:
        return [step.get("nodes"), step.get("first"), step.get("last"), _names(list(step.get("left_out") or ()))]

    tables = [_steps_table("Search steps (each a span of the topological order)", ["nodes", "from", "to", "left out"],
                           doc.get("steps") or (), span), *_subgraph_tables("Reduced subgraph", reduced)]
    if good is not None:
        tables += _subgraph_tables("Nearest passing subgraph", good)
    return {"summary": summary, "problems": [reduced["detail"]] if reduced.get("detail") else [], "tables": tables}


def precision_page(doc: Mapping[str, Any]) -> dict[str, Any]:
    low = doc.get("precision", "")
    before, after = doc.get("before") or {}, doc.get("after") or {}
    chosen = {n["name"] for n in doc.get("nodes") or ()}
    scores = list(doc.get("scores") or ())
    summary = {"precision": low, "ranking": doc.get("rank"), "candidate nodes": doc.get("candidates"),
               "kept in fp32": f"{len(chosen)} node(s)", "--layer-precisions": doc.get("layer_precisions") or "(none)",
               "checks": doc.get("checks"), "plans built": doc.get("builds")}
    tables = [{"title": "Error and latency before and after",
               "columns": ["build", "verdict", "max abs", "max rel", "latency (ms, median)"],
               "rows": [[label, _verdict(entry.get("passed")), *_errors(entry), format_number(entry.get("latency_ms"))]
                        for label, entry in ((f"before: {low} everywhere", before), ("after: these nodes in fp32", after))],
               "failed": [not before.get("passed"), not after.get("passed")]},
              {"title": "Nodes kept in fp32", "columns": ["node", "op", "error contribution"],
               "rows": [[n["name"], n["op"], format_number(n.get("score"))] for n in doc.get("nodes") or ()]},
              {"title": "Candidate nodes (topological order, as in the chart)",
               "columns": ["#", "node", "op", "error contribution", "kept in fp32"],
               "rows": [[i, s["name"], s["op"], format_number(s.get("score")), "yes" if s["name"] in chosen else ""]
                        for i, s in enumerate(scores)], "failed": [s["name"] in chosen for s in scores]},
              _steps_table("Search steps (nodes in fp32, in ranking order)", ["in fp32", "nodes"], doc.get("steps") or (),
                           lambda step: [len(step.get("fp32") or ()), _names(list(step.get("fp32") or ()))])]
    charts = [{"title": f"Error contribution of each candidate node in {low} (red: kept in fp32)",
               "labels": [s["name"] for s in scores], "values": [s.get("score") for s in scores],
               "failed": [s["name"] in chosen for s in scores], "unit": f"{doc.get('rank')} error contribution"}]
    return {"summary": summary, "tables": tables, "charts": charts if scores else []}


#: a debug tool's JSON "tool" -> the page of its document
PAGES: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {
    "debug tactics": tactics_page,
    "debug reduce": reduce_page,
    "debug precision": precision_page,
}


def debug_page(doc: Mapping[str, Any], title: str) -> dict[str, Any]:
    """The render_html document of a debug tool's JSON `doc`, headed `title`."""
    page = PAGES.get(str(doc.get("tool")))
    if page is None:
        raise UsageError(f"no HTML report for a {doc.get('tool')!r} document", hint=f"the tools: {', '.join(PAGES)}")
    return {"title": title, **page(doc)}


def save_debug_report(path: str | os.PathLike, doc: Mapping[str, Any], title: str) -> Path:
    """Write the page of a debug tool's JSON `doc` to `path` (polykit.tools.report.html.save_html)."""
    return save_html(path, debug_page(doc, title))

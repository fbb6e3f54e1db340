"""One self-contained HTML page from a report's JSON document: inline CSS and SVG only (no
script, no external font, stylesheet or image, nothing fetched), so it opens offline and can
be attached to a bug report.

    save_html("report.html", to_json(report, results, layerwise))   # or render_html(doc) -> str

`render_html(doc)` takes the dict a tool prints with `--json` and renders the keys it knows,
in this order (each optional; others are ignored):

- "title": the page heading (default "polykit report"); "passed": the verdict badge.
- "summary": {label: value} rows; "problems": [message]; "runners": {name: {"iterations",
  "mean_inference_time_s"}}.
- "first_divergence": {"tensor", "node", "op", "error": {statistics}, "inputs": [{"name",
  "state", "error"}], "region": [{"node", "op"}], "runner", "reference", "iteration"}.
- "layers": [{"tensor", "node", "op", "passed", "error": {"max_abs", ...}}] in topological
  order: the per-layer error chart (first divergence marked) and its table.
- "charts": [{"title", "labels": [str], "values": [number or "inf"/"nan"], "failed": [bool],
  "marked": index or null, "unit"}]: more per-layer charts (log scale), e.g. from debug tools.
- "comparisons": [{"runner", "reference", "iteration", "passed", "outputs": [{"name", "passed",
  "message", "max_abs", "max_rel", "mean_abs", "histogram": {"edges", "counts", "zeros",
  "nonfinite"}, "worst": [{"index", "reference", "actual", "abs_error", "rel_error"}]}]}]:
  an output table per pair, then error histograms and worst elements of up to MAX_DETAILED
  outputs (failures first).
- "histograms": [{"title", "edges", "counts", "zeros", "nonfinite"}]; "tables": [{"title",
  "columns": [str], "rows": [[cell]], "failed": [bool] (optional: rows shown red)}]: more of
  each, as given.
- "fused_away": [tensor name]: listed, folded.
"""

from __future__ import annotations

import html
import math
import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from polykit.errors import DataFileError

#: outputs per comparison pair shown with their histogram and worst elements
MAX_DETAILED = 24
#: bars a chart numbers below them
MAX_INDEXED = 40
_W, _H, _PAD = 1000, 260, 48

_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;color:#1b1b1b;max-width:1100px}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ddd;padding:2px 8px;text-align:left;
font-size:.9em}th{background:#f3f3f3}.pass{color:#1a7f37}.fail{color:#c62828;font-weight:bold}
.badge{padding:2px 10px;border-radius:4px;color:#fff}.badge.pass{background:#1a7f37;color:#fff}
.badge.fail{background:#c62828;color:#fff}#first-divergence{border:2px solid #c62828;padding:.5em 1em}
svg{background:#fafafa;border:1px solid #ddd}svg text{font-size:11px;fill:#333}
rect.pass{fill:#4caf50}rect.fail{fill:#e53935}rect.hist{fill:#5c6bc0}
line.first-divergence{stroke:#000;stroke-width:2;stroke-dasharray:4 2}
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _num(value: Any) -> float | None:
    """A float from a JSON value (non-finite ones arrive as "inf"/"nan" strings); None otherwise."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def format_number(value: Any) -> str:
    """A JSON number as the page shows it (3 significant digits; "-" for null)."""
    x = _num(value)
    if x is None:
        return "-" if value is None else str(value)
    return f"{x:.3g}" if math.isfinite(x) else str(x)


def _table(columns: Sequence[str], rows: Iterable[Sequence[Any]], classes: Sequence[str] = ()) -> str:
    """A table; `classes[i]` is row i's CSS class ("fail" marks it red)."""
    head = "<tr>" + "".join(f"<th>{_e(c)}</th>" for c in columns) + "</tr>" if columns else ""
    body = [f'<tr class="{_e(classes[i] if i < len(classes) else "")}">' + "".join(f"<td>{_e(c)}</td>" for c in row)
            + "</tr>" for i, row in enumerate(rows)]
    return f"<table>{head}{''.join(body)}</table>"


def _verdict(passed: Any) -> str:
    return '<span class="pass">PASSED</span>' if passed else '<span class="fail">FAILED</span>'


def bar_chart(title: str, labels: Sequence[str], values: Sequence[Any], failed: Sequence[bool] = (),
              marked: int | None = None, unit: str = "max abs error") -> str:
    """An SVG bar chart on a log10 scale (zero at the bottom, non-finite at the top); `marked`
    (an index) gets the dashed first-divergence line. Up to MAX_INDEXED bars carry their index
    (the "#" of the table beside the chart) below them."""
    nums = [_num(v) for v in values]
    positive = [v for v in nums if v is not None and math.isfinite(v) and v > 0]
    low = math.floor(math.log10(min(positive))) if positive else -12
    high = math.ceil(math.log10(max(positive))) if positive else 0
    high = max(high, low + 1)
    n = max(len(values), 1)
    step = (_W - 2 * _PAD) / n
    plot_h = _H - 2 * _PAD

    def y_of(v: float | None) -> float:
        if v is None or not math.isfinite(v):
            return _PAD
        if v <= 0:
            return _H - _PAD
        return _H - _PAD - plot_h * (min(max(math.log10(v), low), high) - low) / (high - low)

    parts = [f'<svg class="chart" width="{_W}" height="{_H}" role="img">',
             f"<title>{_e(title)}</title>"]
    for k in range(low, high + 1):
        y = y_of(10.0 ** k)
        parts.append(f'<line x1="{_PAD}" x2="{_W - _PAD}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e0e0e0"/>'
                     f'<text x="4" y="{y + 4:.1f}">1e{k}</text>')
    for i, (label, v) in enumerate(zip(labels, nums)):
        y = y_of(v)
        cls = "fail" if i < len(failed) and failed[i] else "pass"
        parts.append(f'<rect class="{cls}" x="{_PAD + i * step:.2f}" y="{y:.1f}" width="{max(step * 0.8, 0.5):.2f}" '
                     f'height="{max(_H - _PAD - y, 1):.1f}"><title>{_e(label)}: {_e(format_number(values[i]))}'
                     "</title></rect>")
        if len(values) <= MAX_INDEXED:
            parts.append(f'<text class="index" x="{_PAD + (i + 0.4) * step:.1f}" y="{_H - _PAD + 13}" '
                         f'text-anchor="middle">{i}</text>')
    if marked is not None and 0 <= marked < len(values):
        x = _PAD + (marked + 0.4) * step
        parts.append(f'<line id="first-divergence-marker" class="first-divergence" x1="{x:.1f}" x2="{x:.1f}" '
                     f'y1="{_PAD - 10}" y2="{_H - _PAD}"/><text x="{min(x + 4, _W - 260):.1f}" y="{_PAD - 14}">'
                     f"first divergence: {_e(labels[marked])}</text>")
    parts.append(f'<text x="{_PAD}" y="{_H - 12}">{_e(unit)} per layer, topological order ({len(values)})</text></svg>')
    return "".join(parts)


def histogram_chart(title: str, hist: Mapping[str, Any]) -> str:
    """An SVG bar chart of one ErrorHistogram (log10-spaced bins; linear counts)."""
    counts = [int(c) for c in hist.get("counts", ())]
    edges = [_num(e) for e in hist.get("edges", ())]
    notes = f"exact: {int(hist.get('zeros', 0))}, NaN/Inf: {int(hist.get('nonfinite', 0))}"
    width, height = 480, 180
    parts = [f'<svg class="histogram" width="{width}" height="{height}" role="img">',
             f"<title>{_e(title)}</title>"]
    if counts:
        top = max(counts) or 1
        step = (width - 2 * _PAD) / len(counts)
        for i, c in enumerate(counts):
            h = (height - 2 * _PAD) * c / top
            lo, hi = (edges[i], edges[i + 1]) if i + 1 < len(edges) else (None, None)
            parts.append(f'<rect class="hist" x="{_PAD + i * step:.1f}" y="{height - _PAD - h:.1f}" '
                         f'width="{max(step - 1, 0.5):.1f}" height="{h:.1f}"><title>'
                         f"[{_e(format_number(lo))}, {_e(format_number(hi))}): {c}</title></rect>")
        parts.append(f'<text x="{_PAD}" y="{height - _PAD + 14}">{_e(format_number(edges[0]))}</text>'
                     f'<text x="{width - _PAD - 40}" y="{height - _PAD + 14}">{_e(format_number(edges[-1]))}</text>')
    parts.append(f'<text x="{_PAD}" y="16">|error| histogram, {_e(notes)}</text></svg>')
    return "".join(parts)


def _summary(doc: Mapping[str, Any]) -> str:
    rows = [(k, v) for k, v in dict(doc.get("summary") or {}).items()]
    for name, info in dict(doc.get("runners") or {}).items():
        t = _num((info or {}).get("mean_inference_time_s"))
        rows.append((f"runner {name}", f"{(info or {}).get('iterations', '?')} iteration(s)"
                     + (f", mean {1000 * t:.3f} ms" if t is not None else "")))
    out = "<h2>Summary</h2>" + (_table((), rows) if rows else "")
    problems = list(doc.get("problems") or ())
    if problems:
        out += "<ul>" + "".join(f'<li class="fail">{_e(p)}</li>' for p in problems) + "</ul>"
    return out


def _first_divergence(first: Mapping[str, Any]) -> str:
    error = first.get("error") or {}
    inputs = [(i.get("name"), i.get("state"), format_number((i.get("error") or {}).get("max_abs")))
              for i in first.get("inputs", ())]
    region = ", ".join(f"{r.get('node')} ({r.get('op')})" for r in first.get("region", ()))
    return ('<section id="first-divergence"><h2>First divergence</h2>'
            f"<p>tensor <b>{_e(first.get('tensor'))}</b> from node <b>{_e(first.get('node'))}</b> "
            f"({_e(first.get('op'))}), {_e(first.get('runner', ''))} vs {_e(first.get('reference', ''))}, "
            f"iteration {_e(first.get('iteration', 0))}</p><p>{_e(error.get('message', ''))}</p>"
            + _table(("max abs", "mean abs", "max rel", "mean rel", "atol", "rtol"),
                     [[format_number(error.get(k))
                       for k in ("max_abs", "mean_abs", "max_rel", "mean_rel", "atol", "rtol")]])
            + (f"<p>computed together (nothing between them compared): {_e(region)}</p>" if region else "")
            + "<p>inputs:</p>" + _table(("input", "state", "max abs error"), inputs) + "</section>")


def _layers(doc: Mapping[str, Any], layers: Sequence[Mapping[str, Any]]) -> str:
    first = doc.get("first_divergence") or {}
    marked = next((i for i, r in enumerate(layers) if r.get("tensor") == first.get("tensor")), None)
    chart = bar_chart("error per layer", [str(r.get("tensor")) for r in layers],
                      [(r.get("error") or {}).get("max_abs") for r in layers], [not r.get("passed") for r in layers],
                      marked)
    rows = [(i, r.get("tensor"), r.get("node"), r.get("op"), "PASSED" if r.get("passed") else "FAILED",
             format_number((r.get("error") or {}).get("max_abs")), format_number((r.get("error") or {}).get("max_rel")))
            for i, r in enumerate(layers)]
    classes = ["fail" if not r.get("passed") else "" for r in layers]
    return ("<h2>Error per layer</h2>" + chart
            + "<details><summary>per-layer table</summary>"
            + _table(("#", "tensor", "node", "op", "verdict", "max abs", "max rel"), rows, classes) + "</details>")


def _comparison(pair: Mapping[str, Any], order: Mapping[str, int]) -> str:
    """A pair's outputs (in `order`: tensor -> topological index, when known) and details."""
    outputs = sorted(pair.get("outputs") or (), key=lambda o: order.get(o.get("name"), len(order)))
    rows = [(o.get("name"), "PASSED" if o.get("passed") else "FAILED",
             *(format_number(o.get(k)) for k in ("max_abs", "mean_abs", "max_rel")), o.get("message", ""))
            for o in outputs]
    out = (f"<h2>{_e(pair.get('runner'))} vs {_e(pair.get('reference'))} (reference), iteration "
           f"{_e(pair.get('iteration', 0))}: {_verdict(pair.get('passed'))}</h2>"
           + _table(("output", "verdict", "max abs", "mean abs", "max rel", "message"), rows,
                    ["fail" if not o.get("passed") else "" for o in outputs]))
    detailed = sorted(outputs, key=lambda o: bool(o.get("passed")))[:MAX_DETAILED]
    for o in detailed:
        out += f"<h3>{_e(o.get('name'))}</h3>"
        if o.get("histogram"):
            out += histogram_chart(f"{o.get('name')} error histogram", o["histogram"])
        worst = [(w.get("index"), *(format_number(w.get(k)) for k in ("reference", "actual", "abs_error", "rel_error")))
                 for w in o.get("worst") or ()]
        if worst:
            out += _table(("index", "reference", "actual", "abs error", "rel error"), worst)
    if len(outputs) > len(detailed):
        out += f"<p>{len(outputs) - len(detailed)} more output(s) in the table above (the JSON has their histograms)</p>"
    return out


def render_html(doc: Mapping[str, Any]) -> str:
    """The page for `doc` (see the module docstring for the keys it reads)."""
    title = str(doc.get("title") or "polykit report")
    parts = ["<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">",
             f"<title>{_e(title)}</title><style>{_STYLE}</style></head><body>", f"<h1>{_e(title)}"]
    if "passed" in doc:
        cls = "pass" if doc["passed"] else "fail"
        parts.append(f' <span class="badge {cls}">{"PASSED" if doc["passed"] else "FAILED"}</span>')
    parts.append("</h1>" + _summary(doc))
    if doc.get("first_divergence"):
        parts.append(_first_divergence(doc["first_divergence"]))
    if doc.get("layers"):
        parts.append(_layers(doc, list(doc["layers"])))
    for chart in doc.get("charts") or ():
        parts.append(f"<h2>{_e(chart.get('title', ''))}</h2>" + bar_chart(
            str(chart.get("title", "")), [str(x) for x in chart.get("labels", ())], list(chart.get("values", ())),
            list(chart.get("failed", ())), chart.get("marked"), str(chart.get("unit", "value"))))
    order = {r.get("tensor"): i for i, r in enumerate(doc.get("layers") or ())}
    for pair in doc.get("comparisons") or ():
        parts.append(_comparison(pair, order))
    for hist in doc.get("histograms") or ():
        parts.append(f"<h2>{_e(hist.get('title', ''))}</h2>" + histogram_chart(str(hist.get("title", "")), hist))
    for table in doc.get("tables") or ():
        classes = ["fail" if failed else "" for failed in table.get("failed", ())]
        parts.append(f"<h2>{_e(table.get('title', ''))}</h2>"
                     + _table(table.get("columns", ()), table.get("rows", ()), classes))
    fused = list(doc.get("fused_away") or ())
    if fused:
        parts.append(f"<h2>Not compared</h2><details><summary>{len(fused)} ONNX tensor(s) fused away inside polykit "
                     "layers or absent from one side</summary><p>" + _e(", ".join(map(str, fused))) + "</p></details>")
    parts.append("</body></html>")
    return "".join(parts)


def save_html(path: str | os.PathLike, doc: Mapping[str, Any]) -> Path:
    """Write render_html(doc) to `path` (UTF-8); DataFileError when it cannot be written."""
    path = Path(path)
    try:
        path.write_text(render_html(doc), encoding="utf-8")
    except OSError as exc:
        raise DataFileError(f"cannot write the report: {exc.strerror or exc}", where=str(path),
                            hint="check that its folder exists and is writable") from None
    return path

"""`polykit debug tactics|reduce|precision --report FILE.html`: one self-contained page per run,
drawn from the tool's --json document: every search step with its verdict and errors, the
result (culprits and their tactics; the reduced and the nearest passing subgraph; the fp32 set
with the error and latency before and after, and each candidate's error contribution as an SVG
bar chart); it renders in headless Chromium."""

from __future__ import annotations

import html
import json
import re

import pytest

from polykit.errors import UsageError
from polykit.tools.cli.app import main
from polykit.tools.debug.pages import debug_page
from polykit.tools.report.html import format_number
from tests.tools.report.browser import assert_self_contained, dump_dom, needs_chromium
from tests.tools.debug.test_precision import overflow_model
from tests.tools.debug.test_reduce import CONVNET, LEVEL0, TOL

pytestmark = pytest.mark.usefixtures("fault_plugin")


def _run(capsys, tmp_path, *args: str) -> tuple[str, dict]:
    """The page and the --json document of one `polykit debug ...` run."""
    page = tmp_path / "report.html"
    capsys.readouterr()
    assert main(["debug", *args, "--json", "--report", str(page)]) == 0
    return page.read_text(encoding="utf-8"), json.loads(capsys.readouterr().out)


def _section(text: str, title: str) -> str:
    """From the <h2> that starts with `title` to the next <h2>."""
    start = text.index(f"<h2>{html.escape(title)}")
    end = text.find("<h2>", start + 4)
    return text[start:end if end >= 0 else len(text)]


def _rows(section: str) -> list[list[str]]:
    """The cells of each body row of the section's first table, unescaped."""
    table = section[section.index("<table>"):section.index("</table>")]
    return [[html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", row)]
            for row in re.findall(r"<tr[^>]*>(.*?)</tr>", table) if "<td>" in row]


def _errors(entry: dict) -> list[str]:
    error = entry["error"] or {}
    return [format_number(error.get("max_abs")), format_number(error.get("max_rel"))]


def _verdict(entry: dict) -> str:
    return "passes" if entry["passed"] else "FAILS"


def tactics_run(capsys, tmp_path, monkeypatch) -> tuple[str, dict]:
    monkeypatch.setenv("POLYKIT_FAULT_LAYERS", "blocks.0/c2|fc/Gemm")
    return _run(capsys, tmp_path, "tactics", CONVNET, *LEVEL0)


def reduce_run(capsys, tmp_path, monkeypatch) -> tuple[str, dict]:
    monkeypatch.setenv("POLYKIT_FAULT_LAYERS", "blocks.2/c1")
    return _run(capsys, tmp_path, "reduce", CONVNET, "-o", str(tmp_path / "r.onnx"), "--min-good",
                str(tmp_path / "good.onnx"), *LEVEL0, *TOL)


def precision_run(capsys, tmp_path, monkeypatch) -> tuple[str, dict]:
    model = overflow_model(tmp_path / "overflow.onnx")
    return _run(capsys, tmp_path, "precision", model, "--fp16", "--target", "cpu", "--atol", "1e-2", "--rtol", "1e-2",
                "--timing-iterations", "3")


def test_the_tactics_report_shows_each_bisection_step_and_the_culprits_with_their_tactics(capsys, tmp_path,
                                                                                         monkeypatch):
    text, doc = tactics_run(capsys, tmp_path, monkeypatch)
    assert text.startswith("<!DOCTYPE html>") and "<h1>polykit debug tactics convnet_ts.onnx</h1>" in text
    assert_self_contained(text)
    culprits = _rows(_section(text, "Culprits"))
    assert [c["layer"] for c in doc["culprits"]] == ["/blocks/blocks.0/c2/Conv", "/fc/Gemm"]
    assert culprits == [[c["layer"], c["tactic"], c["good_tactic"], *_errors(c), "-"] for c in doc["culprits"]]
    steps = _section(text, "Bisection steps")
    rows = _rows(steps)
    assert len(rows) == len(doc["trials"]) == doc["builds"] and steps.count('class="fail"') == \
        sum(not t["passed"] for t in doc["trials"])
    suspects = doc["suspects"]
    for i, (row, trial) in enumerate(zip(rows, doc["trials"])):
        on_bad, on_good = trial["bad_layers"], [s for s in suspects if s not in trial["bad_layers"]]
        assert row[0] == str(i + 1) and row[-4:-1] == [_verdict(trial), *_errors(trial)]
        for cell, names in ((row[1], on_bad), (row[2], on_good)):
            assert cell == ("none" if not names else f"all {len(suspects)}" if len(names) == len(suspects)
                            else ", ".join(names))
    assert rows[0][1] == f"all {len(suspects)}" and rows[0][3] == "FAILS"  # the bad build first
    chart = _section(text, "Error each culprit introduces alone")
    assert chart.count('<rect class="fail"') == 2 and "/fc/Gemm: " + _errors(doc["culprits"][1])[0] in chart


def test_the_reduce_report_shows_each_step_the_reduced_subgraph_and_the_nearest_passing_one(capsys, tmp_path,
                                                                                          monkeypatch):
    text, doc = reduce_run(capsys, tmp_path, monkeypatch)
    assert_self_contained(text)
    assert "<td>model nodes</td><td>16</td>" in text and "<td>reduced to</td><td>1 node(s)</td>" in text
    assert f"<td>reduced model written to</td><td>{tmp_path / 'r.onnx'}</td>" in text
    rows = _rows(_section(text, "Search steps"))
    assert len(rows) == len(doc["steps"]) == doc["checks"]
    for row, step in zip(rows, doc["steps"]):
        left_out = ", ".join(step["left_out"]) or "none"
        assert row[1:5] == [str(step["nodes"]), step["first"], step["last"], left_out]
        assert row[-4:-1] == [_verdict(step), *_errors(step)]
    assert doc["steps"][0]["nodes"] == 16 and doc["steps"][0]["passed"] is False
    assert doc["steps"][-1]["nodes"] == 1 and doc["steps"][-1]["first"] == "/blocks/blocks.2/c1/Conv"
    reduced = doc["reduced"]
    assert _rows(_section(text, "Reduced subgraph: 1 node(s), FAILS")) == [["0", "/blocks/blocks.2/c1/Conv", "Conv"]]
    io = _rows(_section(text, "Reduced subgraph: inputs and outputs"))
    assert [r[1] for r in io] == [t["name"] for t in reduced["inputs"]] + [t["name"] for t in reduced["outputs"]]
    good = doc["min_good"]
    assert good["passed"] is True
    near = _rows(_section(text, f"Nearest passing subgraph: {len(good['nodes'])} node(s), passes"))
    assert near == [[str(i), name, op] for i, (name, op) in enumerate(zip(good["nodes"], good["ops"]))]


def test_the_precision_report_shows_errors_latencies_steps_and_a_chart_of_error_contributions(capsys, tmp_path,
                                                                                             monkeypatch):
    text, doc = precision_run(capsys, tmp_path, monkeypatch)
    assert_self_contained(text)
    assert f"<td>--layer-precisions</td><td>{doc['layer_precisions']}</td>" in text
    before, after = doc["before"], doc["after"]
    assert _rows(_section(text, "Error and latency before and after")) == [
        ["before: fp16 everywhere", "FAILS", *_errors(before), format_number(before["latency_ms"])],
        ["after: these nodes in fp32", "passes", *_errors(after), format_number(after["latency_ms"])]]
    scores = {s["name"]: s["score"] for s in doc["scores"]}
    assert _rows(_section(text, "Nodes kept in fp32")) == [[n["name"], n["op"], format_number(scores[n["name"]])]
                                                          for n in doc["nodes"]]
    steps = doc["steps"]
    rows = _rows(_section(text, "Search steps"))
    assert len(rows) == len(steps) <= doc["checks"] and steps[0]["fp32"] == [] and steps[0]["passed"] is False
    assert [r[1:3] + r[-4:-1] for r in rows] == [[str(len(s["fp32"])), ", ".join(s["fp32"]) or "none", _verdict(s),
                                                  *_errors(s)] for s in steps]
    assert len(doc["scores"]) == doc["candidates"] == 7
    chart = _section(text, "Error contribution of each candidate node")
    assert chart.count("<rect ") == 7 and chart.count('<rect class="fail"') == len(doc["nodes"])
    assert all(f"<title>{s['name']}: {format_number(s['score'])}</title>" in chart for s in doc["scores"])
    assert chart.count('<text class="index"') == 7  # the # of the candidates' table
    kept = {n["name"] for n in doc["nodes"]}
    assert _rows(_section(text, "Candidate nodes")) == [
        [str(i), s["name"], s["op"], format_number(s["score"]), "yes" if s["name"] in kept else ""]
        for i, s in enumerate(doc["scores"])]


@needs_chromium
@pytest.mark.parametrize("run, headings", [
    (tactics_run, ["Culprits", "Bisection steps", "Error each culprit introduces alone"]),
    (reduce_run, ["Search steps", "Reduced subgraph", "Nearest passing subgraph"]),
    (precision_run, ["Error and latency before and after", "Search steps", "Error contribution of each candidate"]),
])
def test_each_debug_report_renders_in_headless_chromium(capsys, tmp_path, monkeypatch, run, headings):
    run(capsys, tmp_path, monkeypatch)
    dom = dump_dom(tmp_path / "report.html", tmp_path)
    assert all(f"<h2>{h}" in dom for h in headings) and "<table>" in dom
    assert ("<svg" in dom) == (run is not reduce_run)


def test_a_report_to_a_missing_folder_is_refused_before_any_work(capsys, tmp_path):
    model = overflow_model(tmp_path / "overflow.onnx")
    assert main(["debug", "precision", model, "--fp16", "--target", "cpu", "--report",
                 str(tmp_path / "no" / "r.html")]) == 2
    assert "--report" in capsys.readouterr().err


def test_a_document_of_another_tool_has_no_debug_page():
    with pytest.raises(UsageError, match="no HTML report for a 'run' document"):
        debug_page({"tool": "run"}, "t")


def test_a_reduce_step_is_a_span_of_the_order_and_the_nodes_left_out_of_it():
    from polykit.tools.debug.reduce import ReduceStep
    from polykit.tools.debug.tactic_bisect import Verdict

    step = ReduceStep.of((1, 2, 4), ["a", "b", "c", "d", "e"], Verdict(False, 0.5, 2.0, "y differs"))
    assert step.to_json() == {"nodes": 3, "first": "b", "last": "e", "left_out": ["d"], "passed": False,
                              "error": {"max_abs": 0.5, "max_rel": 2.0}, "detail": "y differs"}

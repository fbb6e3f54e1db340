"""`polykit run --report FILE.html` and report.html.render_html: one self-contained page (inline
SVG, nothing fetched) with the summary, error histograms, worst elements and the per-layer
error chart with the first divergence marked; rendered by a real headless browser."""

from __future__ import annotations

import json
import re

import pytest

from polykit.tools.cli.app import main
from polykit.tools.report.html import render_html
from tests.tools.report.browser import assert_self_contained, dump_dom, needs_chromium
from tests.tools.compare.layerwise_models import convnet


@pytest.fixture
def diverging_run(tmp_path, capsys):
    """A layerwise run of a convnet with conv3 perturbed against the good one's saved outputs:
    (its HTML report, its --json document)."""
    good, bad = convnet(tmp_path / "good.onnx"), convnet(tmp_path / "bad.onnx", perturb="w3")
    ref, feeds, page = tmp_path / "ref.npz", tmp_path / "feeds.npz", tmp_path / "report.html"
    assert main(["run", good, "--onnxrt", "--mark-all", "--save-outputs", str(ref), "--save-inputs", str(feeds)]) == 0
    # --observe-marks: the engine as built unmarked, so the report has tensors fused away to show
    args = ["run", bad, "--trt", "--target", "cpu", "--mark-all", "--observe-marks", "--load-outputs", str(ref),
            "--load-inputs", str(feeds)]
    assert main(args + ["--report", str(page), "-q"]) == 1
    capsys.readouterr()
    assert main(args + ["--json"]) == 1
    return page, json.loads(capsys.readouterr().out)


@needs_chromium
def test_the_report_renders_in_headless_chromium_with_the_chart_and_the_first_divergence(diverging_run, tmp_path):
    page, _ = diverging_run
    dom = dump_dom(page, tmp_path)
    assert re.search(r'<svg[^>]*class="chart"', dom) and dom.count("<rect") > 7
    assert 'id="first-divergence-marker"' in dom and "first divergence: c3" in dom
    assert '<section id="first-divergence">' in dom and "<b>conv3</b>" in dom
    assert 'class="histogram"' in dom


def test_the_report_is_self_contained(diverging_run):
    page, _ = diverging_run
    assert_self_contained(page.read_text(encoding="utf-8"))


def test_the_report_shows_every_section_of_the_json_document(diverging_run):
    page, doc = diverging_run
    text = page.read_text(encoding="utf-8")
    assert "<h1>polykit run bad.onnx <span class=\"badge fail\">FAILED</span></h1>" in text
    assert "<td>runner onnxrt</td><td>1 iteration(s)</td>" in text  # loaded: no time to show
    worst = doc["comparisons"][0]["outputs"][0]["worst"][0]
    assert f"<td>{worst['index']}</td>" in text  # the worst elements' table
    assert all(f"<td>{name}</td>" in text for name in ("c3", "r2", "logits"))  # the per-layer table
    assert "c1, c2, m" in text  # fused away


def test_render_html_takes_generic_tables_charts_and_histograms_and_escapes_text():
    doc = {"title": "debug <tool>", "passed": False, "summary": {"layers tried": 3},
           "tables": [{"title": "bisection", "columns": ["step", "layers"], "rows": [[1, "<img src=x>"]]}],
           "charts": [{"title": "error per layer", "labels": ["a", "b", "c"], "values": [1e-6, "inf", 0.5],
                       "failed": [False, True, True], "marked": 1}],
           "histograms": [{"title": "errors", "edges": [1e-3, 1e-2, 1e-1], "counts": [4, 1], "zeros": 2}]}
    page = render_html(doc)
    assert "<h1>debug &lt;tool&gt;" in page and "&lt;img src=x&gt;" in page and "<img" not in page
    assert page.count('class="chart"') == 1 and 'id="first-divergence-marker"' in page and "first divergence: b" in page
    assert 'class="histogram"' in page and "exact: 2" in page and "<td>layers tried</td><td>3</td>" in page


def test_report_to_a_missing_folder_is_a_usage_error(tmp_path, capsys):
    model = convnet(tmp_path / "c.onnx", size=8)
    assert main(["run", model, "--onnxrt", "--report", str(tmp_path / "no" / "r.html")]) == 2
    assert "--report" in capsys.readouterr().err


def test_ci_installs_chromium_before_the_tests_without_failing_when_it_cannot():
    from pathlib import Path

    ci = (Path(__file__).resolve().parents[3] / ".ci" / "run").read_text()
    install = ci.index("apt-get install -y -qq chromium")
    assert install < ci.index(".venv/bin/python -m pytest -q")
    assert "|| echo" in ci[install:ci.index("fi", install)]  # a failed install only prints a line


def test_save_html_writes_the_page_and_names_a_file_it_cannot_write(tmp_path):
    from polykit.errors import DataFileError
    from polykit.tools.report.html import save_html

    doc = {"title": "t", "passed": True, "histograms": [{"title": "h", "edges": [1e-6, 1e-5], "counts": [3]}]}
    assert save_html(tmp_path / "r.html", doc).read_text(encoding="utf-8") == render_html(doc)
    with pytest.raises(DataFileError, match="cannot write the report"):
        save_html(tmp_path, doc)  # a folder

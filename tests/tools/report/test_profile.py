"""polykit.tools.report.profile: per-layer medians, shares and tactic totals from run profiles."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from polykit.compiler.plan.records import LayerDesc
from polykit.tools.report.profile import render, summarize

LAYERS = [LayerDesc("conv1", "Conv", ("x", "w"), ("c",), tactic="cuda.conv.igemm_simt"),
          LayerDesc("relu", "Relu", ("c",), ("r",), tactic="cuda.pointwise"),
          LayerDesc("conv2", "Conv", ("r", "w2"), ("y",), tactic="cuda.conv.igemm_simt")]
RUNS = [[("conv1", 1.0), ("relu", 0.2), ("conv2", 3.0)],
        [("conv1", 9.0), ("relu", 0.1), ("conv2", 2.0)],   # an outlier run of conv1
        [("conv1", 1.2), ("relu", 0.3), ("conv2", 2.5)]]


def test_rows_are_per_layer_medians_slowest_first_with_kind_tactic_and_share():
    s = summarize(RUNS, LAYERS)
    assert [(r.name, r.ms) for r in s.layers] == [("conv2", 2.5), ("conv1", 1.2), ("relu", 0.2)]
    assert s.total_ms == pytest.approx(3.9)
    assert s.layers[0].kind == "Conv" and s.layers[0].tactic == "cuda.conv.igemm_simt"
    assert s.layers[0].share == pytest.approx(2.5 / 3.9)
    assert s.tactics == [("cuda.conv.igemm_simt", pytest.approx(3.7), 2), ("cuda.pointwise", pytest.approx(0.2), 1)]


def test_layers_missing_from_the_plan_still_get_a_row():
    s = summarize([[("mystery", 1.0)]], [])
    assert (s.layers[0].kind, s.layers[0].tactic) == ("?", "-")


def test_render_lists_the_top_layers_and_the_cuda_note():
    buf = io.StringIO()
    render(Console(file=buf, width=200, no_color=True), "trt per-layer profile", summarize(RUNS, LAYERS), top=2)
    text = buf.getvalue()
    assert "3.900 ms in 3 layers (median of 3 run(s) per layer)" in text
    assert "slowest 2 of 3 layers" in text and "conv2" in text and "conv1" in text
    assert "stream hold" in text
    assert summarize(RUNS, LAYERS).to_json()["tactics"][0] == {"tactic": "cuda.conv.igemm_simt", "ms": pytest.approx(3.7),
                                                              "layers": 2}

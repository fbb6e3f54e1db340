import json
from pathlib import Path

import numpy as np
import pytest

from .passes_testkit import feeds_for, graph, node, op_counts

from polykit.compiler.graph.evaluator import evaluate_graph
from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.compiler.passes import fold_constants, optimize, run_passes
from polykit.errors import GraphError

DATA = Path(__file__).resolve().parents[2] / "data" / "torch"


def _small():
    return graph([node("Add", ["a", "b"], "c"), node("Identity", ["x"], "i"), node("Mul", ["i", "c"], "m"),
                  node("Relu", ["m"], "r"), node("Exp", ["r"], "y")],
                 {"x": (2, 3)}, ["y"], {"a": np.ones(3, np.float32), "b": np.arange(3, dtype=np.float32)})


def test_run_passes_runs_in_order_and_reports_change():
    calls = []

    def first(g):
        calls.append("first")
        return False

    def second(g):
        calls.append("second")
        return False

    assert run_passes(_small(), [first, second]) is False
    assert calls == ["first", "second"]


def test_run_passes_repeats_to_a_fixed_point():
    rounds = []

    def flaky(g):
        rounds.append(1)
        return len(rounds) < 3

    assert run_passes(_small(), [flaky], fixed_point=True)
    assert len(rounds) == 3


def test_a_pass_that_breaks_the_graph_is_named():
    def breaker(g):
        g.nodes[0].inputs = ["nowhere"]
        return True

    with pytest.raises(GraphError, match="breaker"):
        run_passes(_small(), [breaker])


def test_shapes_are_reinferred_after_a_change():
    g = _small()
    run_passes(g, [fold_constants])
    assert g.value("c").shape == (3,) and "c" in g.initializers


def test_optimize_returns_a_copy_and_leaves_the_input_alone():
    g = _small()
    before = [(n.op_type, list(n.inputs)) for n in g.nodes]
    out = optimize(g)
    assert [(n.op_type, list(n.inputs)) for n in g.nodes] == before
    assert op_counts(out) == {f"{POLYKIT_DOMAIN}:Pointwise": 1}


def test_optimize_keeps_marked_tensors_under_their_names():
    g = _small()
    feeds = feeds_for(g)
    out = optimize(g, keep={"m", "i"})
    values = evaluate_graph(out, feeds, keep_all=True)
    reference = evaluate_graph(g, feeds, keep_all=True)
    for name in ("m", "i", "y"):
        np.testing.assert_allclose(values[name], reference[name], rtol=1e-6)


def test_optimize_without_fusion_leaves_no_fused_nodes():
    out = optimize(_small(), fuse=False)
    assert all(n.domain == "" for n in out.nodes)


def _model(name):
    path = DATA / name
    if not path.is_file():
        pytest.skip(f"{name} is not in tests/data")
    return load_onnx(path)


@pytest.mark.parametrize("name, expected", [
    ("bert_tiny_ts.onnx", {"Attention": 2, "LayerNormalization": 5}),
    ("bert_tiny_dynamo.onnx", {"Attention": 2, "LayerNormalization": 5}),
    ("gpt2_tiny_ts.onnx", {"Attention": 2, "Gelu": 0}),  # Gelu joins the Gemm epilogues
    ("vit_tiny_ts.onnx", {"Attention": 2, "LayerNormalization": 5}),
    ("convnet_ts.onnx", {"Conv": 6}),
])
def test_optimize_keeps_torch_exports_numerically_equal_and_fuses_them(name, expected):
    g = _model(name)
    feeds = feeds_for(g, seed=1)
    for k, v in feeds.items():
        if v.dtype.kind in "iu":
            feeds[k] = np.abs(v) % 4
    out = optimize(g)
    assert len(out.nodes) < len(g.nodes)
    counts = {}
    for n in out.nodes:
        counts[n.op_type] = counts.get(n.op_type, 0) + 1
    assert {k: counts.get(k, 0) for k in expected} == expected
    before, after = evaluate_graph(g, feeds), evaluate_graph(out, feeds)
    for key in before:
        np.testing.assert_allclose(after[key], before[key], rtol=1e-4, atol=1e-5)
    for n in out.nodes:
        json.dumps(n.attrs if n.domain == POLYKIT_DOMAIN else {})


def test_an_optimized_graph_survives_an_onnx_round_trip(tmp_path):
    from polykit.compiler.graph.onnx_export import save_onnx

    g = _model("bert_tiny_ts.onnx")
    out = optimize(g)
    path = save_onnx(out, tmp_path / "optimized.onnx")
    back = load_onnx(path)
    assert [n.op_type for n in back.nodes] == [n.op_type for n in out.nodes]
    feeds = {k: np.abs(v) % 4 if v.dtype.kind in "iu" else v for k, v in feeds_for(g).items()}
    before, after = evaluate_graph(out, feeds), evaluate_graph(back, feeds)
    for key in before:
        np.testing.assert_allclose(after[key], before[key], rtol=1e-6)


def test_optimizing_twice_changes_nothing_more():
    g = _model("convnet_ts.onnx")
    once = optimize(g)
    twice = optimize(once)
    assert [(n.op_type, n.domain, n.inputs, n.outputs) for n in twice.nodes] == \
        [(n.op_type, n.domain, n.inputs, n.outputs) for n in once.nodes]

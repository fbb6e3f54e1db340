"""fold_attention_layouts: head transposes around Attention become layouts, outputs unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.graph.evaluator import evaluate_graph
from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Graph, Node, Value
from polykit.compiler.passes import eliminate_dead_code, fold_attention_layouts, run_passes

rng = np.random.default_rng(5)


def _block(mask: bool) -> Graph:
    """x [B, S, H*D] -> Q/K/V as Reshape + Transpose(0,2,1,3) -> Attention -> Transpose -> Reshape."""
    B, S, H, D = 2, 5, 3, 4
    g = Graph(name="blk")
    g.inputs = ["x"] + (["m"] if mask else [])
    g.set_value(Value("x", np.dtype(np.float32), (B, S, H * D)))
    g.initializers["split"] = np.array([B, S, H, D], dtype=np.int64)
    g.initializers["merge"] = np.array([B, S, H * D], dtype=np.int64)
    nodes = []
    for t in "qkv":
        nodes.append(Node("Relu" if t == "q" else "Sigmoid" if t == "k" else "Neg", ["x"], [f"{t}0"], name=f"{t}_act"))
        nodes.append(Node("Reshape", [f"{t}0", "split"], [f"{t}1"], name=f"{t}_split"))
        nodes.append(Node("Transpose", [f"{t}1"], [f"{t}2"], {"perm": [0, 2, 1, 3]}, name=f"{t}_heads"))
    ins = ["q2", "k2", "v2"] + (["m"] if mask else [])
    if mask:
        g.set_value(Value("m", np.dtype(np.bool_), (B, 1, S, S)))
    nodes.append(Node("Attention", ins, ["o"], {"scale": 0.4}, name="att", domain=POLYKIT_DOMAIN))
    nodes.append(Node("Transpose", ["o"], ["o1"], {"perm": [0, 2, 1, 3]}, name="o_heads"))
    nodes.append(Node("Reshape", ["o1", "merge"], ["y"], name="o_merge"))
    g.nodes = nodes
    g.outputs = ["y"]
    return g


@pytest.mark.parametrize("mask", [False, True])
def test_head_transposes_fold_into_layouts_and_outputs_stay_the_same(mask):
    g = _block(mask)
    feeds = {"x": rng.standard_normal((2, 5, 12)).astype(np.float32)}
    if mask:
        feeds["m"] = rng.random((2, 1, 5, 5)) > 0.3
    want = evaluate_graph(g, feeds)["y"]
    h = g.copy()
    assert run_passes(h, [fold_attention_layouts])
    att = next(n for n in h.nodes if n.op_type == "Attention")
    assert [att.attrs.get(a) for a in ("q_layout", "k_layout", "v_layout", "out_layout")] == ["bshd"] * 4
    assert att.inputs[:3] == ["q1", "k1", "v1"] and att.outputs == ["o1"]
    np.testing.assert_allclose(evaluate_graph(h, feeds)["y"], want, rtol=1e-6, atol=1e-6)


def test_an_attention_output_with_other_readers_keeps_its_layout():
    g = _block(False)
    g.nodes.append(Node("Identity", ["o"], ["o_copy"], name="other"))
    g.outputs.append("o_copy")
    run_passes(g, [fold_attention_layouts])
    att = next(n for n in g.nodes if n.op_type == "Attention")
    assert att.attrs.get("out_layout", "bhsd") == "bhsd" and att.attrs.get("q_layout") == "bshd"


def test_an_output_transpose_that_also_moves_a_unit_batch_becomes_a_view_of_bshd():
    """torchvision's MultiheadAttention: [1, H, S, D] -> Transpose(2, 0, 1, 3) -> [S, 1, H, D]."""
    g = _block(False)
    g.set_value(Value("x", np.dtype(np.float32), (1, 5, 12)))
    g.initializers["split"] = np.array([1, 5, 3, 4], dtype=np.int64)
    g.initializers["merge"] = np.array([5, 12], dtype=np.int64)
    next(n for n in g.nodes if n.name == "o_heads").attrs["perm"] = [2, 0, 1, 3]
    feeds = {"x": rng.standard_normal((1, 5, 12)).astype(np.float32)}
    want = evaluate_graph(g, feeds)["y"]
    h = g.copy()
    assert run_passes(h, [fold_attention_layouts, eliminate_dead_code])
    att = next(n for n in h.nodes if n.op_type == "Attention")
    assert att.attrs.get("out_layout") == "bshd" and not any(n.op_type == "Transpose" for n in h.nodes)
    np.testing.assert_allclose(evaluate_graph(h, feeds)["y"], want, rtol=1e-6, atol=1e-6)


def test_an_output_transpose_that_moves_real_dims_stays():
    g = _block(False)
    next(n for n in g.nodes if n.name == "o_heads").attrs["perm"] = [2, 0, 1, 3]  # batch 2 is not a unit dim
    g.initializers["merge"] = np.array([5, 2, 12], dtype=np.int64)
    run_passes(g, [fold_attention_layouts])
    att = next(n for n in g.nodes if n.op_type == "Attention")
    assert att.attrs.get("out_layout", "bhsd") == "bhsd"


def _windowed_out(B=2, W=3, H=2, S=5, D=4, perm=(0, 2, 1, 3)) -> Graph:
    """Rank-5 Attention [B, W, H, S, D] -> Reshape [B*W, H, S, D] -> Transpose -> y."""
    g = Graph(name="win")
    g.inputs = ["q", "k", "v"]
    for t in g.inputs:
        g.set_value(Value(t, np.dtype(np.float32), (B, W, H, S, D)))
    g.initializers["merge"] = np.array([B * W, H, S, D], dtype=np.int64)
    g.nodes = [Node("Attention", ["q", "k", "v"], ["o"], {"scale": 0.5}, name="att", domain=POLYKIT_DOMAIN),
               Node("Reshape", ["o", "merge"], ["o4"], name="o_merge"),
               Node("Transpose", ["o4"], ["y"], {"perm": list(perm)}, name="o_heads")]
    g.outputs = ["y"]
    return g


@pytest.mark.parametrize("B, W, H, S, D", [(2, 3, 2, 5, 4), (3, 1, 4, 7, 3)])
def test_a_rank5_output_merged_then_head_transposed_is_written_bshd(B, W, H, S, D):
    g = _windowed_out(B, W, H, S, D)
    feeds = {t: rng.standard_normal((B, W, H, S, D)).astype(np.float32) for t in "qkv"}
    want = evaluate_graph(g, feeds)["y"]
    h = g.copy()
    assert run_passes(h, [fold_attention_layouts])
    assert [n.op_type for n in h.nodes] == ["Attention", "Reshape"]
    assert h.nodes[0].attrs["out_layout"] == "bshd" and h.nodes[1].outputs == ["y"]
    np.testing.assert_allclose(evaluate_graph(h, feeds)["y"], want, rtol=1e-6, atol=1e-6)


def test_a_merge_followed_by_another_transpose_is_left_alone():
    g = _windowed_out(perm=(1, 0, 2, 3))
    run_passes(g, [fold_attention_layouts])
    assert [n.op_type for n in g.nodes] == ["Attention", "Reshape", "Transpose"]
    assert "out_layout" not in g.nodes[0].attrs

"""hoist_activations: elementwise ops move above reshapes so they join epilogues."""

from __future__ import annotations

import functools

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.passes import fuse_bias_activation, hoist_activations, run_passes

from .passes_testkit import graph, node, run_and_compare

rng = np.random.default_rng(9)
SHAPE = np.array([2, 3, 5], np.int64)


def _gemm_reshape(*after, outputs=("y",)):
    nodes = [node("Gemm", ["x", "w", "b"], "g"), node("Reshape", ["g", "shape"], "r"), *after]
    consts = {"w": rng.standard_normal((4, 5)).astype(np.float32), "b": rng.standard_normal(5).astype(np.float32),
              "shape": SHAPE, "half": np.array(0.5, np.float32)}
    return graph(nodes, {"x": (6, 4)}, list(outputs), consts)


def test_gelu_moves_above_the_reshape():
    g = _gemm_reshape(node("Gelu", ["r"], "y", approximate="tanh"))
    out, changed = run_and_compare(g, hoist_activations)
    assert changed and [n.op_type for n in out.nodes] == ["Gemm", "Gelu", "Reshape"]
    assert out.producers()["y"].op_type == "Reshape" and out.value("y").shape == (2, 3, 5)


def test_gemm_reshape_gelu_becomes_an_epilogue():
    g = _gemm_reshape(node("Gelu", ["r"], "y"))

    def rewrite(gr):
        return run_passes(gr, [hoist_activations, fuse_bias_activation])

    out, _ = run_and_compare(g, rewrite)
    gemm = out.nodes[0]
    assert gemm.domain == POLYKIT_DOMAIN and [s["op"] for s in gemm.attrs["epilogue"]["body"]] == ["Gelu"]
    assert [n.op_type for n in out.nodes] == ["Gemm", "Reshape"]


def test_a_chain_with_scalar_constants_moves_whole():
    g = _gemm_reshape(node("Mul", ["r", "half"], "m"), node("Relu", ["m"], "y"))
    out, _ = run_and_compare(g, hoist_activations)
    assert [n.op_type for n in out.nodes] == ["Gemm", "Mul", "Relu", "Reshape"]


def test_a_one_element_constant_of_higher_rank_than_the_source_stays_after_the_reshape():
    # Add(Unsqueeze(offsets (2,)) -> (2,1,1,1), const (1,1,1,1)): hoisted, it would broadcast (2,) to (1,1,1,2)
    g = graph([node("Add", ["x", "one"], "a"), node("Unsqueeze", ["a", "axes"], "u"), node("Add", ["u", "c"], "y")],
              {"x": (2,)}, ["y"], {"one": np.array(1.0, np.float32), "axes": np.array([1, 2, 3], np.int64),
                                   "c": np.full((1, 1, 1, 1), 3.0, np.float32)})
    out, changed = run_and_compare(g, hoist_activations)
    assert not changed and out.value("y").shape == (2, 1, 1, 1)


def test_an_op_with_a_broadcast_tensor_operand_stays_after_the_reshape():
    g = graph([node("Gemm", ["x", "w"], "g"), node("Reshape", ["g", "shape"], "r"), node("Add", ["r", "z"], "y")],
              {"x": (6, 4), "z": (3, 5)}, ["y"], {"w": rng.standard_normal((4, 5)).astype(np.float32),
                                                    "shape": SHAPE})
    _, changed = run_and_compare(g, hoist_activations)
    assert not changed


def test_a_reshaped_tensor_read_twice_is_left_alone():
    g = _gemm_reshape(node("Relu", ["r"], "y"), node("Neg", ["r"], "z"), outputs=("y", "z"))
    _, changed = run_and_compare(g, hoist_activations)
    assert not changed


def test_a_kept_intermediate_is_not_moved():
    g = _gemm_reshape(node("Relu", ["r"], "y"))
    _, changed = run_and_compare(g, functools.partial(hoist_activations, keep=frozenset({"r"})))
    assert not changed


def test_a_reshape_of_a_graph_input_is_left_alone():
    g = graph([node("Flatten", ["x"], "f", axis=1), node("Relu", ["f"], "y")], {"x": (2, 3, 4)}, ["y"])
    _, changed = run_and_compare(g, hoist_activations)
    assert not changed


def test_gpt2_gelus_join_the_gemm_epilogues_and_outputs_are_unchanged():
    import pytest

    from polykit.compiler.graph.evaluator import evaluate_graph
    from polykit.compiler.graph.onnx_import import load_onnx
    from polykit.compiler.passes import optimize

    from .passes_testkit import feeds_for
    from .test_pass_manager import DATA

    path = DATA / "gpt2_tiny_ts.onnx"
    if not path.is_file():
        pytest.skip("gpt2_tiny_ts.onnx is not in tests/data")
    g = load_onnx(path)
    out = optimize(g)
    gelu_gemms = [n for n in out.nodes if n.op_type == "Gemm" and n.domain == POLYKIT_DOMAIN
                  and any(s["op"] == "Gelu" for s in n.attrs["epilogue"]["body"])]
    assert len(gelu_gemms) == 2 and not any(n.op_type == "Gelu" for n in out.nodes)
    feeds = {k: np.abs(v) % 4 if v.dtype.kind in "iu" else v for k, v in feeds_for(g, 4).items()}
    before, after = evaluate_graph(g, feeds), evaluate_graph(out, feeds)
    for key in before:
        np.testing.assert_allclose(after[key], before[key], rtol=1e-4, atol=1e-5)


def _gemm_view_residual(*chain, residual_first=False):
    """Gemm(x[6, 4]) -> Reshape [2, 3, 5] -> `chain`; "res" = Sigmoid(z[2, 3, 5]), computed before
    or after the Gemm (so the hoisted op's new view of it must be ordered after its producer)."""
    res = node("Sigmoid", ["z"], "res", name="res_producer")
    body = [node("Gemm", ["x", "w", "b"], "g"), node("Reshape", ["g", "shape"], "r"), *chain]
    nodes = [res, *body] if residual_first else [*body[:2], res, *body[2:]]
    consts = {"w": rng.standard_normal((4, 5)).astype(np.float32), "b": rng.standard_normal(5).astype(np.float32),
              "shape": SHAPE, "c": rng.standard_normal((2, 3, 5)).astype(np.float32)}
    g = graph(nodes, {"x": (6, 4), "z": (2, 3, 5)}, ["y"], consts)
    g.nodes = nodes  # keep the given order (graph() sorts it)
    return g


def test_a_residual_add_of_the_full_shape_moves_above_the_reshape_and_joins_the_epilogue():
    for first in (False, True):
        g = _gemm_view_residual(node("Add", ["r", "res"], "a"), node("Relu", ["a"], "y"), residual_first=first)

        def rewrite(gr):
            return run_passes(gr, [hoist_activations, fuse_bias_activation])

        out, changed = run_and_compare(g, rewrite)
        gemm = next(n for n in out.nodes if n.domain == POLYKIT_DOMAIN)
        assert [s["op"] for s in gemm.attrs["epilogue"]["body"]] == ["Add", "Relu"]
        assert out.value(gemm.outputs[0]).shape == (6, 5)
        assert [n.op_type for n in out.nodes].count("Reshape") == 2  # the residual's view and the moved one


def test_a_full_shape_constant_is_re_laid_out_and_a_broadcast_operand_stops_the_move():
    g = _gemm_view_residual(node("Mul", ["r", "c"], "y"))
    out, changed = run_and_compare(g, hoist_activations)
    assert changed and [n.op_type for n in out.nodes if n.op_type != "Sigmoid"] == ["Gemm", "Mul", "Reshape"]
    mul = next(n for n in out.nodes if n.op_type == "Mul")
    assert out.initializers[mul.inputs[1]].shape == (6, 5)
    row = _gemm_reshape(node("Add", ["r", "b"], "y"))  # b is [5]: broadcast, not the full shape
    _, changed = run_and_compare(row, hoist_activations)
    assert not changed

"""merge_duplicates: equal scalar constants and equal nodes computed once (outputs unchanged)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.compiler.passes import merge_duplicates
from polykit.runtime.engine import Engine

from .passes_testkit import graph, node, op_counts, run_and_compare, scalar


def _mask_per_layer(layers: int, fills=(0.0, -1e4)):
    """BERT's attention mask as exported: each layer's Where(mask, its own copy of 0, its own -1e4)."""
    nodes, inits = [node("Greater", ["m", "zero"], "mask")], {"zero": scalar(0.5)}
    for k in range(layers):
        inits[f"keep{k}"], inits[f"fill{k}"] = scalar(fills[0]), scalar(fills[1])
        nodes += [node("Where", ["mask", f"keep{k}", f"fill{k}"], f"bias{k}"), node("Add", ["s", f"bias{k}"], f"y{k}")]
    return graph(nodes, {"m": (2, 1, 1, 5), "s": (2, 3, 5, 5)}, [f"y{k}" for k in range(layers)], inits)


def test_equal_scalar_constants_and_then_equal_nodes_merge():
    out, changed = run_and_compare(_mask_per_layer(4), merge_duplicates)
    assert changed and op_counts(out) == {"Greater": 1, "Where": 1, "Add": 4}
    where = next(n for n in out.nodes if n.op_type == "Where")
    assert all(n.inputs[1] == where.outputs[0] for n in out.nodes if n.op_type == "Add")


def test_different_values_or_attributes_keep_nodes_apart():
    g = _mask_per_layer(1)
    g.initializers["keep1"], g.initializers["fill1"] = scalar(0.0), scalar(-3e4)  # another fill value
    g.nodes += [node("Where", ["mask", "keep1", "fill1"], "bias1"), node("Add", ["s", "bias1"], "y1"),
                node("Softmax", ["s"], "p0", axis=-1), node("Softmax", ["s"], "p1", axis=2)]
    g.outputs += ["y1", "p0", "p1"]
    g = graph(g.nodes, {"m": (2, 1, 1, 5), "s": (2, 3, 5, 5)}, g.outputs, g.initializers)
    out, _ = run_and_compare(g, merge_duplicates)  # keep1 becomes keep0 (both 0.0); the fills differ
    assert op_counts(out) == {"Greater": 1, "Where": 2, "Add": 2, "Softmax": 2}


def test_larger_equal_constants_random_ops_and_graph_outputs_stay():
    ones = np.ones(3, np.float32)  # a random-weight model's LayerNorm scales: equal by coincidence
    g = graph([node("Mul", ["x", "g0"], "a"), node("Mul", ["x", "g1"], "b"),
               node("Relu", ["x"], "r0"), node("Relu", ["x"], "r1"),
               node("RandomUniformLike", ["x"], "u0", seed=1.0), node("RandomUniformLike", ["x"], "u1", seed=1.0)],
              {"x": (2, 3)}, ["a", "b", "r0", "r1"], {"g0": ones, "g1": ones.copy()})
    changed = merge_duplicates(g)
    assert not changed
    assert op_counts(g) == {"Mul": 2, "Relu": 2, "RandomUniformLike": 2}


def test_a_duplicate_read_from_inside_a_branch_stays_and_the_model_matches_onnxruntime():
    """r1 equals r0 but the If's then-branch reads r1 from the outer scope: r1's node stays;
    r2 (read outside only) merges into r0."""
    then = helper.make_graph([helper.make_node("Neg", ["r1"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2, 3])])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2, 3])])
    nodes = [helper.make_node("Relu", ["x"], ["r0"], name="relu0"), helper.make_node("Relu", ["x"], ["r1"], name="relu1"),
             helper.make_node("Relu", ["x"], ["r2"], name="relu2"),
             helper.make_node("If", ["c"], ["f"], name="if", then_branch=then, else_branch=other),
             helper.make_node("Add", ["r0", "f"], ["s"], name="add0"), helper.make_node("Mul", ["s", "r2"], ["y"], name="mul")]
    model = helper.make_model(helper.make_graph(
        nodes, "outer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                         helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])]), opset_imports=[helper.make_opsetid("", 17)])
    g = load_onnx(model)
    assert merge_duplicates(g)
    assert {n.name for n in g.nodes if n.op_type == "Relu"} == {"relu0", "relu1"}
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with Engine(build_plan(model, BuilderConfig(target="cpu"))) as engine, engine.create_execution_context() as ctx:
        for c in (True, False):
            feeds = {"x": x, "c": np.array(c)}
            np.testing.assert_allclose(ctx.execute(feeds)["y"], session.run(None, feeds)[0], rtol=1e-6)


def test_bert_style_masks_leave_one_where_in_a_cpu_plan_that_matches_the_unmerged_graph():
    inits = [numpy_helper.from_array(np.float32(0.5), "half")]
    nodes = [helper.make_node("Greater", ["m", "half"], ["mask"])]
    for k in range(3):
        inits += [numpy_helper.from_array(np.array([0.0], np.float32), f"k{k}"),
                  numpy_helper.from_array(np.array([-1e4], np.float32), f"f{k}")]
        nodes += [helper.make_node("Where", ["mask", f"k{k}", f"f{k}"], [f"b{k}"]),
                  helper.make_node("Add", ["s" if k == 0 else f"y{k - 1}", f"b{k}"], [f"y{k}"])]
    model = helper.make_model(helper.make_graph(
        nodes, "masks", [helper.make_tensor_value_info("m", TensorProto.FLOAT, [1, 1, 1, 4]),
                         helper.make_tensor_value_info("s", TensorProto.FLOAT, [1, 2, 4, 4])],
        [helper.make_tensor_value_info("y2", TensorProto.FLOAT, [1, 2, 4, 4])], inits),
        opset_imports=[helper.make_opsetid("", 17)])
    plan = build_plan(model, BuilderConfig(target="cpu", fuse=False))
    assert [l.kind for l in plan.layers].count("Where") == 1
    rng = np.random.default_rng(1)
    feeds = {"m": rng.random((1, 1, 1, 4)).astype(np.float32), "s": rng.standard_normal((1, 2, 4, 4)).astype(np.float32)}
    import onnxruntime as ort

    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    with Engine(plan) as engine, engine.create_execution_context() as ctx:
        np.testing.assert_array_equal(ctx.execute(feeds)["y2"], want)

"""One plan serves every value of a shape-tensor input: its consumers' shapes are their shape
rules evaluated at bind time (polykit.compiler.graph.shape_rules), with ranges read from the model
(polykit.compiler.builder.value_ranges); outputs equal onnxruntime's bit for bit."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.compiler.plan.file import Plan
from polykit.compiler.builder.value_ranges import ruled_profile
from polykit.errors import BuildError, PlanError, RuntimeInputError
from polykit.runtime.engine import Runtime
from tests.compiler.test_plan_check import edited

X_SHAPE = (2, 3, 4)


def _model(node, second: str, count: int, outputs=("y",)):
    g = helper.make_graph([node], "ruled",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(X_SHAPE)),
                           helper.make_tensor_value_info(second, TensorProto.INT64, [count])],
                          [helper.make_tensor_value_info(o, TensorProto.INT64 if o == "i" else TensorProto.FLOAT, None)
                           for o in outputs])
    return helper.make_model(g, ir_version=10, opset_imports=[helper.make_opsetid("", 18)])


#: (model, the shape-tensor input, its values: the first is opt, every one runs on that plan)
CASES = {
    "reshape": (_model(helper.make_node("Reshape", ["x", "shape"], ["y"]), "shape", 2), "shape",
                [[4, 6], [-1, 2], [0, -1], [24, 1], [1, 24]]),
    "topk": (_model(helper.make_node("TopK", ["x", "k"], ["y", "i"], axis=-1), "k", 1, ("y", "i")), "k",
             [[2], [0], [4], [1]]),
    "reduce_axes": (_model(helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0), "axes", 2), "axes",
                    [[0, 2], [1, 2], [-1, 0], [-2, -3]]),
    "pad": (_model(helper.make_node("Pad", ["x", "pads"], ["y"]), "pads", 6), "pads",
            [[0, 1, 0, 0, 2, 1], [1, 0, 3, 1, 0, 0], [0, -1, 0, 0, 0, -2], [4, 4, 4, 4, 4, 4]]),
    "expand": (_model(helper.make_node("Expand", ["x", "shape"], ["y"]), "shape", 4), "shape",
               [[1, 2, 3, 4], [5, 2, 1, 1], [3, 1, 3, 4], [1, 1, 1, 4]]),
}

SUMMED = {"reduce_axes"}


def _slice_model():  # Slice's ends: a second shape-tensor input of the same node
    node = helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["y"])
    g = helper.make_graph([node], "ruled",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(X_SHAPE))]
                          + [helper.make_tensor_value_info(n, TensorProto.INT64, [1]) for n in ("starts", "ends", "axes")],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(g, ir_version=10, opset_imports=[helper.make_opsetid("", 18)])


def ruled_plan(model, feeds, target="cpu"):
    """The plan (through its bytes) whose shape-tensor inputs range over their value_ranges, opt at `feeds`."""
    graph = load_onnx(model)
    shapes = {k: v.shape for k, v in feeds.items()}
    profile = ruled_profile(graph, shapes, feeds)
    assert profile is not None and profile.ruled, "the model's shape-tensor inputs got no ranges"
    plan = Plan.deserialize(build_plan(graph, BuilderConfig(target=target, input_shapes=shapes,
                                                            profiles=[profile])).serialize())
    assert plan.profiles.rules, "no shape rule was recorded: the plan bakes the opt values"
    return plan


def _engine(model, feeds):
    return Runtime("cpu").deserialize_engine(ruled_plan(model, feeds))


@pytest.mark.parametrize("case", sorted(CASES))
def test_one_plan_serves_every_shape_tensor_value_like_onnxruntime(case):
    model, name, values = CASES[case]
    x = np.random.default_rng(3).standard_normal(X_SHAPE).astype(np.float32)
    feeds = [{"x": x, name: np.array(v, np.int64)} for v in values]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    engine = _engine(model, feeds[0])
    for feed in feeds:
        with engine.create_execution_context() as ctx:
            got = ctx.execute(feed)
        want = session.run(None, feed)
        for out, ref in zip(model.graph.output, want):
            assert got[out.name].shape == ref.shape, f"{case} {feed[name].tolist()}: shape of {out.name}"
            if case in SUMMED:  # onnxruntime sums in another order
                np.testing.assert_allclose(got[out.name], ref, rtol=1e-6, err_msg=f"{case} {feed[name].tolist()}")
            else:
                np.testing.assert_array_equal(got[out.name], ref, err_msg=f"{case} {feed[name].tolist()}: {out.name}")


def test_slice_with_starts_ends_and_axes_inputs_clamps_at_run_time():
    model = _slice_model()
    x = np.random.default_rng(5).standard_normal(X_SHAPE).astype(np.float32)
    feeds = [{"x": x, "starts": np.array([s]), "ends": np.array([e]), "axes": np.array([a])}
             for s, e, a in ((0, 2, 0), (1, 100, 2), (-3, -1, 1), (-100, 2, -1), (3, 1, 2))]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    engine = _engine(model, feeds[0])
    for feed in feeds:
        with engine.create_execution_context() as ctx:
            got = ctx.execute(feed)["y"]
        np.testing.assert_array_equal(got, session.run(None, feed)[0], err_msg=str(feed))


@pytest.mark.parametrize("case, value, what", [
    ("reshape", [25, 1], "shape-tensor input 'shape' has element 0 = 25, outside"),
    ("topk", [5], "shape-tensor input 'k' has element 0 = 5, outside"),
    ("reduce_axes", [0, 3], "shape-tensor input 'axes' has element 1 = 3, outside"),
    ("reshape", [5, 5], "cannot reshape"),
])
def test_a_value_the_model_does_not_allow_is_a_runtime_input_error(case, value, what):
    model, name, values = CASES[case]
    x = np.ones(X_SHAPE, np.float32)
    engine = _engine(model, {"x": x, name: np.array(values[0], np.int64)})
    with engine.create_execution_context() as ctx, pytest.raises(RuntimeInputError) as err:
        ctx.execute({"x": x, name: np.array(value, np.int64)})
    assert what in err.value.what, err.value.what


def test_a_reshape_that_is_a_no_op_at_opt_stays_for_the_other_values():
    """remove_identity compares dim expressions, not their opt values: Reshape(x, [2, 3, 4]) is
    a no-op only at that value."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    g = helper.make_graph(nodes, "noop_at_opt", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(X_SHAPE)),
                                                helper.make_tensor_value_info("shape", TensorProto.INT64, [3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(g, ir_version=10, opset_imports=[helper.make_opsetid("", 18)])
    x = np.random.default_rng(7).standard_normal(X_SHAPE).astype(np.float32)
    engine = _engine(model, {"x": x, "shape": np.array(X_SHAPE, np.int64)})
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for value in ([4, 3, 2], [2, 3, 4], [1, -1, 6]):
        feed = {"x": x, "shape": np.array(value, np.int64)}
        with engine.create_execution_context() as ctx:
            np.testing.assert_array_equal(ctx.execute(feed)["y"], session.run(None, feed)[0], err_msg=str(value))


def test_a_ruled_plan_is_refused_on_a_target_that_sizes_tensors_at_build_time(monkeypatch):
    from polykit.runtime import target as targets

    monkeypatch.setitem(targets.TARGETS, "fixed", "polykit.runtime.cpu:CpuTarget")  # a target that plans every byte
    model, name, values = CASES["reshape"]
    graph = load_onnx(model)
    feeds = {"x": np.ones(X_SHAPE, np.float32), name: np.array(values[0])}
    profile = ruled_profile(graph, {k: v.shape for k, v in feeds.items()}, feeds)
    with pytest.raises(BuildError, match="fixed target cannot size at run time"):
        build_plan(graph, BuilderConfig(target="fixed", input_shapes={k: v.shape for k, v in feeds.items()},
                                        profiles=[profile]))


def test_a_crafted_shape_rule_record_is_refused_naming_the_field():
    model, name, values = CASES["topk"]
    graph = load_onnx(model)
    feeds = {"x": np.ones(X_SHAPE, np.float32), name: np.array(values[0])}
    shapes = {k: v.shape for k, v in feeds.items()}
    data = build_plan(graph, BuilderConfig(target="cpu", input_shapes=shapes,
                                           profiles=[ruled_profile(graph, shapes, feeds)])).serialize()

    def unknown_op(doc):
        doc["profiles"]["rules"][0]["op"] = "NoSuchOp"

    def stray_symbol(doc):
        doc["profiles"]["rules"][0]["inputs"][1]["value"] = ["value(q)[0]"]

    for edit, what in ((unknown_op, "has no shape rule"), (stray_symbol, "symbol 'value(q)[0]'")):
        with pytest.raises(PlanError) as err:
            Plan.deserialize(edited(data, edit))
        assert "profiles.rules[0]" in err.value.what and what in err.value.what, err.value.what


def test_max_of_dims_and_values_keeps_an_expression_for_every_value():
    """Max(Shape(x), target) -> Expand: the host chain's max is an expression of the value
    symbols, not decided at opt (a ruled symbol's corners are its opt: nothing would check it)."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Max", ["s", "target"], ["m"]),
             helper.make_node("Expand", ["x", "m"], ["y"])]
    g = helper.make_graph(nodes, "ruled", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 1]),
                                           helper.make_tensor_value_info("target", TensorProto.INT64, [3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(g, ir_version=10, opset_imports=[helper.make_opsetid("", 18)])
    x = np.random.default_rng(6).standard_normal((1, 3, 1)).astype(np.float32)
    feeds = [{"x": x, "target": np.array(t, np.int64)} for t in ([1, 3, 1], [2, 1, 5], [4, 3, 2], [1, 1, 1])]
    engine = _engine(model, feeds[0])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for feed in feeds:
        with engine.create_execution_context() as ctx:
            got = ctx.execute(feed)["y"]
        np.testing.assert_array_equal(got, session.run(None, feed)[0], err_msg=str(feed["target"]))


def test_a_length_used_as_data_too_serves_every_value_like_onnxruntime():
    """A window's length: a float Range's limit (its rule at bind time, through Cast) and the
    divisor of its angles (data: the layers compute it from the feed, nothing decided at opt)."""
    nodes = [helper.make_node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT),
             helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("z", TensorProto.FLOAT, [], [0.0])),
             helper.make_node("Constant", [], ["one"], value=helper.make_tensor("o", TensorProto.FLOAT, [], [1.0])),
             helper.make_node("Range", ["zero", "nf", "one"], ["r"]),
             helper.make_node("Div", ["r", "nf"], ["q"]), helper.make_node("Cos", ["q"], ["y"])]
    g = helper.make_graph(nodes, "window", [helper.make_tensor_value_info("n", TensorProto.INT32, [])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(g, ir_version=10, opset_imports=[helper.make_opsetid("", 18)])
    feeds = [{"n": np.array(v, np.int32)} for v in (10, 3, 1, 17, 0)]
    engine = _engine(model, feeds[0])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for feed in feeds:
        with engine.create_execution_context() as ctx:
            got = ctx.execute(feed)["y"]
        np.testing.assert_allclose(got, session.run(None, feed)[0], rtol=1e-6, err_msg=str(feed["n"]))


def test_an_if_on_a_known_rank_is_inlined_so_its_branch_rules_read_the_captured_values():
    """AffineGrid's expansion: If(Size(size) == 4) splits the captured `size` in its taken branch;
    the build inlines it (the condition folds), so the ConstantOfShape downstream is ruled."""
    def branch(name, count):
        outs = [f"{name}{i}" for i in range(count)]
        node = helper.make_node("Split", ["size"], outs, axis=0, num_outputs=count)
        return helper.make_graph([node], name, [], [helper.make_tensor_value_info(o, TensorProto.INT64, [1])
                                                    for o in outs])

    then, other = branch("t", 4), branch("e", 4)
    nodes = [helper.make_node("Size", ["size"], ["rank"]),
             helper.make_node("Constant", [], ["four"], value=helper.make_tensor("f", TensorProto.INT64, [], [4])),
             helper.make_node("Equal", ["rank", "four"], ["is4"]),
             helper.make_node("If", ["is4"], ["n", "c", "h", "w"], then_branch=then, else_branch=other),
             helper.make_node("Concat", ["h", "w"], ["hw"], axis=0),
             helper.make_node("ConstantOfShape", ["hw"], ["y"],
                              value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.5]))]
    g = helper.make_graph(nodes, "branchy", [helper.make_tensor_value_info("size", TensorProto.INT64, [4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(g, ir_version=10, opset_imports=[helper.make_opsetid("", 18)])
    feeds = [{"size": np.array(s, np.int64)} for s in ([1, 2, 3, 4], [2, 1, 5, 1], [1, 1, 0, 7])]
    engine = _engine(model, feeds[0])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for feed in feeds:
        with engine.create_execution_context() as ctx:
            np.testing.assert_array_equal(ctx.execute(feed)["y"], session.run(None, feed)[0], err_msg=str(feed))

"""Old-opset forms of the math ops import to the canonical form with the same results.

Each test builds a model in an old opset, imports it with load_onnx, checks the rewrite,
then evaluates the imported graph with the reference kernels and compares with
onnxruntime running the ORIGINAL model (or the op's defining formula where onnxruntime
lacks the old form).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from polykit.compiler.graph.evaluator import evaluate_graph
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.errors import NodeAttributeError

RNG = np.random.default_rng(11)
F32 = onnx.TensorProto.FLOAT


def make_model(nodes, inputs, outputs, opset, initializers=()):
    """inputs: [(name, shape)] float32; outputs: names (untyped)."""
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, F32, s) for n, s in inputs],
        [onnx.ValueInfoProto(name=o) for o in outputs],
        initializer=[onnx.numpy_helper.from_array(a, n) for n, a in initializers],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7
    return model


def run_polykit(graph, feeds):
    return list(evaluate_graph(graph, feeds).values())


def run_ort(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def ops_of(graph):
    return [n.op_type for n in graph.nodes]


# ---- activations ------------------------------------------------------------------------------

def test_clip6_attributes_become_inputs_of_x_dtype():
    model = make_model([helper.make_node("Clip", ["x"], ["y"], min=-0.5, max=0.25)], [("x", [3, 4])], ["y"], 6)
    graph = load_onnx(model)
    (clip,) = graph.nodes
    assert "min" not in clip.attrs and len(clip.inputs) == 3
    assert graph.initializers[clip.inputs[1]].dtype == np.float32
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_array_equal(run_polykit(graph, {"x": x})[0], run_ort(model, {"x": x})[0])


def test_clip6_on_an_untyped_intermediate_casts_bounds_like_x():
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Clip", ["r"], ["y"], max=0.5)]
    model = make_model(nodes, [("x", [5])], ["y"], 6)
    graph = load_onnx(model)
    assert "CastLike" in ops_of(graph)
    x = RNG.standard_normal(5).astype(np.float32)
    np.testing.assert_array_equal(run_polykit(graph, {"x": x})[0], run_ort(model, {"x": x})[0])


def test_clip6_without_attributes_has_no_bound_inputs():
    graph = load_onnx(make_model([helper.make_node("Clip", ["x"], ["y"])], [("x", [2])], ["y"], 6))
    assert graph.nodes[0].inputs == ["x"]


def test_clip13_node_is_left_as_is():
    model = make_model([helper.make_node("Clip", ["x", "", "hi"], ["y"])], [("x", [3])], ["y"], 13,
                       initializers=[("hi", np.array(0.5, np.float32))])
    assert load_onnx(model).nodes[0].inputs == ["x", "", "hi"]


# ---- softmax family --------------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_opset11_softmax_family_coerces_to_2d_at_axis(op, axis):
    model = make_model([helper.make_node(op, ["x"], ["y"], axis=axis)], [("x", [2, 3, 4])], ["y"], 11)
    graph = load_onnx(model)
    x = (RNG.standard_normal((2, 3, 4)) * 3).astype(np.float32)
    np.testing.assert_allclose(run_polykit(graph, {"x": x})[0], run_ort(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_opset11_softmax_on_the_last_axis_stays_one_node():
    model = make_model([helper.make_node("Softmax", ["x"], ["y"])], [("x", [4, 10])], ["y"], 11)
    graph = load_onnx(model)
    assert ops_of(graph) == ["Softmax"] and graph.nodes[0].attrs["axis"] == -1


def test_opset11_softmax_of_unknown_rank_uses_flatten_and_reshape():
    model = make_model([helper.make_node("Softmax", ["x"], ["y"], axis=1)], [("x", None)], ["y"], 11)
    graph = load_onnx(model)
    assert ops_of(graph) == ["Shape", "Flatten", "Softmax", "Reshape"]
    x = RNG.standard_normal((2, 3, 2)).astype(np.float32)
    np.testing.assert_allclose(run_polykit(graph, {"x": x})[0], run_ort(model, {"x": x})[0], rtol=1e-5)


def test_opset13_softmax_keeps_its_single_axis():
    model = make_model([helper.make_node("Softmax", ["x"], ["y"], axis=1)], [("x", [2, 3, 4])], ["y"], 13)
    graph = load_onnx(model)
    assert ops_of(graph) == ["Softmax"] and graph.nodes[0].attrs["axis"] == 1


# ---- reductions ------------------------------------------------------------------------------------

@pytest.mark.parametrize("op,opset", [("ReduceSum", 11), ("ReduceMean", 13), ("ReduceMax", 13), ("ReduceL2", 11),
                                      ("ReduceLogSumExp", 13), ("ReduceProd", 11)])
def test_axes_attribute_becomes_an_int64_input(op, opset):
    model = make_model([helper.make_node(op, ["x"], ["y"], axes=[0, -1], keepdims=0)], [("x", [2, 3, 4])], ["y"], opset)
    graph = load_onnx(model)
    (node,) = graph.nodes
    assert "axes" not in node.attrs
    assert graph.initializers[node.inputs[1]].tolist() == [0, -1]
    assert graph.value("y").shape == (3,)
    x = RNG.uniform(0.5, 1.5, (2, 3, 4)).astype(np.float32)
    np.testing.assert_allclose(run_polykit(graph, {"x": x})[0], run_ort(model, {"x": x})[0], rtol=1e-5)


def test_reduce_without_axes_attribute_reduces_all():
    model = make_model([helper.make_node("ReduceMin", ["x"], ["y"])], [("x", [2, 3])], ["y"], 11)
    graph = load_onnx(model)
    assert graph.nodes[0].inputs == ["x"] and graph.value("y").shape == (1, 1)


def test_reduce_sum13_axes_input_is_left_alone():
    model = make_model([helper.make_node("ReduceSum", ["x", "a"], ["y"])], [("x", [2, 3])], ["y"], 13,
                       initializers=[("a", np.array([1], np.int64))])
    assert load_onnx(model).nodes[0].inputs == ["x", "a"]


# ---- TopK ------------------------------------------------------------------------------------------

def test_topk1_k_attribute_becomes_input():
    model = make_model([helper.make_node("TopK", ["x"], ["v", "i"], k=2, axis=1)], [("x", [3, 5])], ["v", "i"], 1)
    graph = load_onnx(model)
    (node,) = graph.nodes
    assert graph.initializers[node.inputs[1]].tolist() == [2]
    assert graph.value("v").shape == (3, 2) and graph.value("i").dtype == np.int64
    x = RNG.permutation(15).reshape(3, 5).astype(np.float32)
    for got, want in zip(run_polykit(graph, {"x": x}), run_ort(model, {"x": x})):
        np.testing.assert_array_equal(got, want)


# ---- BatchNormalization / InstanceNormalization -----------------------------------------------------------

def _bn_params(c, shape=None):
    shape = shape or (c,)
    return [("s", RNG.uniform(0.5, 1.5, shape).astype(np.float32)), ("b", RNG.standard_normal(shape).astype(np.float32)),
            ("m", RNG.standard_normal(shape).astype(np.float32)), ("v", RNG.uniform(0.5, 2.0, shape).astype(np.float32))]


@pytest.mark.parametrize("opset,attrs", [(6, {"is_test": 1}), (7, {"spatial": 1}), (9, {})])
def test_legacy_batchnorm_inference_imports_to_one_node(opset, attrs):
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], epsilon=1e-3, **attrs)
    params = _bn_params(3)
    graph = load_onnx(make_model([node], [("x", [2, 3, 4, 4])], ["y"], opset, initializers=params))
    assert ops_of(graph) == ["BatchNormalization"]
    assert set(graph.nodes[0].attrs) == {"epsilon"}
    p = {k: v.reshape(3, 1, 1) for k, v in params}
    x = RNG.standard_normal((2, 3, 4, 4)).astype(np.float32)
    want = (x - p["m"]) / np.sqrt(p["v"] + 1e-3) * p["s"] + p["b"]
    np.testing.assert_allclose(run_polykit(graph, {"x": x})[0], want, rtol=1e-5, atol=1e-5)


def test_non_spatial_batchnorm_becomes_elementwise_ops():
    params = _bn_params(3, (3, 2, 2))
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], spatial=0, epsilon=1e-4)
    graph = load_onnx(make_model([node], [("x", [2, 3, 2, 2])], ["y"], 7, initializers=params))
    assert "BatchNormalization" not in ops_of(graph)
    p = dict(params)
    x = RNG.standard_normal((2, 3, 2, 2)).astype(np.float32)
    want = (x - p["m"]) / np.sqrt(p["v"] + 1e-4) * p["s"] + p["b"]
    np.testing.assert_allclose(run_polykit(graph, {"x": x})[0], want, rtol=1e-5, atol=1e-6)


def test_opset9_batchnorm_with_running_stat_outputs_imports_as_training_mode():
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv", "sm", "sv"])
    graph = load_onnx(make_model([node], [("x", [4, 3, 2])], ["y", "rm", "rv"], 9, initializers=_bn_params(3)))
    (bn,) = graph.nodes
    assert bn.attrs["training_mode"] == 1 and bn.outputs == ["y", "rm", "rv"]
    assert graph.value("rm").shape == (3,)


def test_opset9_batchnorm_whose_saved_statistics_are_read_is_rejected():
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv", "sm", "sv"])
    model = make_model([node], [("x", [4, 3, 2])], ["y", "sm"], 9, initializers=_bn_params(3))
    with pytest.raises(NodeAttributeError, match="saved_mean"):
        load_onnx(model)


def test_instancenorm1_drops_consumed_inputs():
    node = helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], consumed_inputs=[0, 0, 0])
    params = _bn_params(3)[:2]
    graph = load_onnx(make_model([node], [("x", [1, 3, 4])], ["y"], 1, initializers=params))
    assert "consumed_inputs" not in graph.nodes[0].attrs


# ---- GroupNormalization 18 -> 21 --------------------------------------------------------------------------

def _groupnorm18_expected(x, groups, scale_g, bias_g, eps=1e-5):
    n, c = x.shape[:2]
    g = x.reshape(n, groups, -1).astype(np.float64)
    norm = ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + eps)).reshape(x.shape)
    per = c // groups
    shape = (1, c) + (1,) * (x.ndim - 2)
    return norm * np.repeat(scale_g, per).reshape(shape) + np.repeat(bias_g, per).reshape(shape)


def test_groupnorm18_constant_per_group_params_repeat_per_channel():
    scale, bias = np.array([0.5, 2.0], np.float32), np.array([1.0, -1.0], np.float32)
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2)
    graph = load_onnx(make_model([node], [("x", [2, 6, 3])], ["y"], 18, initializers=[("s", scale), ("b", bias)]))
    (gn,) = graph.nodes
    assert graph.initializers[gn.inputs[1]].tolist() == [0.5, 0.5, 0.5, 2.0, 2.0, 2.0]
    x = RNG.standard_normal((2, 6, 3)).astype(np.float32)
    np.testing.assert_allclose(run_polykit(graph, {"x": x})[0], _groupnorm18_expected(x, 2, scale, bias),
                               rtol=1e-5, atol=1e-6)


def test_groupnorm18_with_unknown_channels_expands_params_at_run_time():
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=3)
    graph = load_onnx(make_model([node], [("x", ["N", "C", 4]), ("s", [3]), ("b", [3])], ["y"], 18))
    assert "Expand" in ops_of(graph)
    x = RNG.standard_normal((2, 6, 4)).astype(np.float32)
    scale, bias = RNG.uniform(0.5, 1.5, 3).astype(np.float32), RNG.standard_normal(3).astype(np.float32)
    got = run_polykit(graph, {"x": x, "s": scale, "b": bias})[0]
    np.testing.assert_allclose(got, _groupnorm18_expected(x, 3, scale, bias), rtol=1e-5, atol=1e-6)

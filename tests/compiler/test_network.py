"""NetworkDefinition: from-scratch graphs build and run like the same model imported from ONNX."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder.builder import Builder, build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.graph.network import NetworkDefinition
from polykit.errors import GraphError, ShapeError, UsageError
from polykit.runtime.engine import Runtime

RNG = np.random.default_rng(7)
W1 = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3
B1 = RNG.standard_normal(4).astype(np.float32) * 0.1
SCALE = RNG.uniform(0.5, 1.5, 4).astype(np.float32)
SHIFT = RNG.standard_normal(4).astype(np.float32) * 0.1
MEAN = RNG.standard_normal(4).astype(np.float32) * 0.1
VAR = RNG.uniform(0.5, 1.5, 4).astype(np.float32)
W2 = RNG.standard_normal((64, 10)).astype(np.float32) * 0.2
B2 = RNG.standard_normal(10).astype(np.float32) * 0.1
X = RNG.standard_normal((2, 3, 8, 8)).astype(np.float32)


def _cnn_network() -> NetworkDefinition:
    net = NetworkDefinition("cnn")
    x = net.add_input("x", np.float32, (2, 3, 8, 8))
    h = net.add_conv(x, W1, B1, strides=(1, 1), pads=(1, 1, 1, 1))
    h = net.add_normalization(h, SCALE, SHIFT, kind="batch", mean=MEAN, var=VAR, epsilon=1e-5)
    h = net.add_activation(h, "relu")
    h = net.add_pooling(h, "max", kernel_shape=(2, 2), strides=(2, 2))
    h = net.add_flatten(h, axis=1)
    h = net.add_gemm(h, W2, B2)
    net.mark_output(net.add_softmax(h, axis=-1))
    return net


def _cnn_onnx():
    inits = [numpy_helper.from_array(a, n) for a, n in
             [(W1, "w1"), (B1, "b1"), (SCALE, "s"), (SHIFT, "sh"), (MEAN, "m"), (VAR, "v"), (W2, "w2"), (B2, "b2")]]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c"], pads=[1, 1, 1, 1], strides=[1, 1]),
        helper.make_node("BatchNormalization", ["c", "s", "sh", "m", "v"], ["bn"], epsilon=1e-5),
        helper.make_node("Relu", ["bn"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"], axis=1),
        helper.make_node("Gemm", ["f", "w2", "b2"], ["g"]),
        helper.make_node("Softmax", ["g"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def _run(plan, **feeds):
    out = Runtime().deserialize_engine(plan.serialize()).create_execution_context().execute(feeds)
    return list(out.values())[0] if len(out) == 1 else out


def test_cnn_from_scratch_matches_the_imported_onnx_model():
    cfg = BuilderConfig(target="cpu")
    mine = _run(Builder(cfg).build(_cnn_network().graph), x=X)
    theirs = _run(build_plan(_cnn_onnx(), cfg), x=X)
    assert mine.shape == (2, 10)
    np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(mine.sum(axis=-1), 1.0, rtol=1e-5)


def test_cnn_from_scratch_lowers_to_the_same_layer_kinds_as_the_import():
    cfg = BuilderConfig(target="cpu")
    mine = Builder(cfg).build(_cnn_network().graph)
    theirs = build_plan(_cnn_onnx(), cfg)
    assert [l.kind for l in mine.layers] == [l.kind for l in theirs.layers]


def test_graph_is_shape_inferred():
    net = _cnn_network()
    g = net.graph
    assert g.value(g.outputs[0]).shape == (2, 10)
    assert net.shape(g.outputs[0]) == (2, 10)


def test_elementwise_unary_reduce_and_shape_layers_compute_numpy():
    net = NetworkDefinition()
    a = net.add_input("a", np.float32, (2, 3, 4))
    b = net.add_input("b", np.float32, (4,))
    s = net.add_elementwise(a, b, "mul")
    e = net.add_unary(s, "exp")
    r = net.add_reduce(e, "sum", axes=[2], keepdims=False)
    t = net.add_transpose(r, (1, 0))
    sh = net.add_shuffle(a, first_transpose=(2, 0, 1), reshape=(4, 6))
    cat = net.add_concat([t, net.add_slice(sh, [0, 0], [3, 2])], axis=1)
    g = net.add_gather(cat, [2, 0], axis=0)
    cast = net.add_cast(g, np.float64)
    clipped = net.add_activation(cast, "clip", min=0.0, max=3.0)
    for out in (t, sh, clipped):
        net.mark_output(out)
    av = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    bv = RNG.standard_normal(4).astype(np.float32)
    out = _run(Builder(BuilderConfig(target="cpu")).build(net.graph), a=av, b=bv)
    want_t = np.exp(av * bv).sum(axis=2).T
    want_sh = av.transpose(2, 0, 1).reshape(4, 6)
    want_cat = np.concatenate([want_t, want_sh[:3, :2]], axis=1)
    np.testing.assert_allclose(out[t], want_t, rtol=1e-5)
    np.testing.assert_array_equal(out[sh], want_sh)
    np.testing.assert_allclose(out[clipped], np.clip(want_cat[[2, 0]].astype(np.float64), 0, 3), rtol=1e-5)
    assert out[clipped].dtype == np.float64


def test_layer_norm_matmul_and_activation_params():
    net = NetworkDefinition()
    x = net.add_input("x", np.float32, (3, 5))
    w = RNG.standard_normal((5, 2)).astype(np.float32)
    h = net.add_normalization(x, np.ones(5, np.float32), np.zeros(5, np.float32), kind="layer", axis=-1)
    h = net.add_activation(net.add_matmul(h, w), "leaky_relu", alpha=0.2)
    net.mark_output(h)
    xv = RNG.standard_normal((3, 5)).astype(np.float32)
    norm = (xv - xv.mean(-1, keepdims=True)) / np.sqrt(xv.var(-1, keepdims=True) + 1e-5)
    mm = norm @ w
    np.testing.assert_allclose(_run(Builder(BuilderConfig(target="cpu")).build(net.graph), x=xv),
                               np.where(mm > 0, mm, 0.2 * mm), rtol=1e-4, atol=1e-5)


def test_shape_mistake_is_reported_at_the_call():
    net = NetworkDefinition()
    a = net.add_input("a", np.float32, (2, 3))
    with pytest.raises(ShapeError):
        net.add_elementwise(a, np.ones((4,), np.float32), "add")


def test_unknown_tensor_is_a_graph_error():
    net = NetworkDefinition()
    with pytest.raises(GraphError, match="no tensor 'ghost'"):
        net.add_unary("ghost", "abs")


def test_unknown_activation_is_a_usage_error():
    net = NetworkDefinition()
    x = net.add_input("x", np.float32, (2,))
    with pytest.raises(UsageError, match="unknown activation 'swoosh'"):
        net.add_activation(x, "swoosh")


def test_unexpected_activation_parameter_is_a_usage_error():
    net = NetworkDefinition()
    x = net.add_input("x", np.float32, (2,))
    with pytest.raises(UsageError, match="beta"):
        net.add_activation(x, "relu", beta=1.0)


def test_duplicate_input_name_is_a_graph_error():
    net = NetworkDefinition()
    net.add_input("x", np.float32, (2,))
    with pytest.raises(GraphError, match="already exists"):
        net.add_input("x", np.float32, (2,))


def test_network_without_outputs_has_no_graph():
    net = NetworkDefinition()
    net.add_unary(net.add_input("x", np.float32, (2,)), "abs")
    with pytest.raises(GraphError, match="no outputs"):
        net.graph


def test_named_layers_name_their_output_tensors():
    net = NetworkDefinition()
    y = net.add_unary(net.add_input("x", np.float32, (2,)), "neg", name="negate")
    assert y == "negate"

"""Explicit FP8 Q/DQ around a model's linear layers (polykit.tools.model.fp8_qdq): what is quantized and how
(ModelOpt's form), calibrated scales amax / 448, onnxruntime's reading of the result, and polykit folding
every quantized linear layer into an FP8 layer."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.errors import UsageError
from polykit.runtime.engine import Engine
from polykit.tools.model.fp8_qdq import calibrate_fp8, insert_fp8_qdq, linear_layers

# onnxruntime with basic graph optimizations only: its extended level drops a Relu before a float8 QuantizeLinear
# (ReluQuantFusion, right for integer types whose zero point is the minimum; wrong for e4m3: measured on 1.32)
from tests.compiler.test_int8_qdq import run_onnxruntime

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)


def mlp_with_attention(opset: int = 21) -> onnx.ModelProto:
    """x [4, 16] -> MatMul W1 [16, 32] + b1 -> h; Relu -> r; Gemm(r, W2 [10, 32], transB, bias) -> y; and
    s = h x h^T (an activation by activation product: left alone), read by y's Gemm and a second MatMul of r."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(a, n) for n, a in (
        ("W1", rng.standard_normal((16, 32)).astype(np.float32) * np.float32(0.3)),
        ("b1", rng.standard_normal(32).astype(np.float32) * np.float32(0.1)),
        ("W2", rng.standard_normal((10, 32)).astype(np.float32) * np.float32(0.3)),
        ("b2", rng.standard_normal(10).astype(np.float32) * np.float32(0.1)),
        ("W3", rng.standard_normal((32, 6)).astype(np.float32) * np.float32(0.3)))]
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["m"], name="fc1"),
             helper.make_node("Add", ["m", "b1"], ["h"], name="bias1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Gemm", ["r", "W2", "b2"], ["y"], name="fc2", transB=1),
             helper.make_node("MatMul", ["r", "W3"], ["z"], name="fc3"),
             helper.make_node("Transpose", ["h"], ["ht"], name="t", perm=[1, 0]),
             helper.make_node("MatMul", ["h", "ht"], ["s"], name="scores")]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4, d])
                               for n, d in (("y", 10), ("z", 6), ("s", 4))],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def batches(n: int) -> list[dict[str, np.ndarray]]:
    return [{"x": np.random.default_rng(seed).standard_normal((4, 16)).astype(np.float32)} for seed in range(n)]


def test_linear_layers_are_the_products_of_an_activation_and_a_rank_2_weight():
    found = [(node.name, x, axis) for node, x, axis in linear_layers(mlp_with_attention())]
    assert found == [("fc1", "x", 1), ("fc2", "r", 0), ("fc3", "r", 1)]  # scores: two activations


def test_scales_are_the_activations_amax_over_448():
    model, data = mlp_with_attention(), batches(3)
    scales = calibrate_fp8(model, data)
    assert set(scales) == {"x", "r"}
    assert scales["x"] == float(np.float32(max(np.abs(b["x"]).max() for b in data) / 448))
    w1, b1 = (numpy_helper.to_array(t) for t in model.graph.initializer[:2])
    r_max = max(np.maximum(b["x"] @ w1 + b1, 0).max() for b in data)
    np.testing.assert_allclose(scales["r"], r_max / 448, rtol=1e-6)


def test_qdq_is_inserted_as_modelopt_writes_it_and_onnxruntime_runs_it(tmp_path):
    model = mlp_with_attention()
    scales = {"x": 0.01, "r": 0.02}
    quantized = insert_fp8_qdq(model, scales)
    onnx.checker.check_model(quantized)
    assert len(model.graph.node) == 7 and quantized.ir_version >= 9  # the model itself is unchanged
    ops = [n.op_type for n in quantized.graph.node]
    # one Q -> DQ pair per activation (r's is shared by fc2 and fc3), one DQ per weight
    assert ops.count("QuantizeLinear") == 2 and ops.count("DequantizeLinear") == 5
    nodes = {n.name: n for n in quantized.graph.node}
    inits = {t.name: numpy_helper.to_array(t) for t in quantized.graph.initializer}
    assert not {"W1", "W2", "W3"} & set(inits)  # the float weights are gone
    producer = {o: n for n in quantized.graph.node for o in n.output}
    assert nodes["fc2"].input[0] == nodes["fc3"].input[0] and nodes["scores"].input == ["h", "ht"]
    for name, w, axis, channels in (("fc1", "W1", 1, 32), ("fc2", "W2", 0, 10), ("fc3", "W3", 1, 6)):
        dq = producer[nodes[name].input[1]]
        wq, w_scale = inits[dq.input[0]], inits[dq.input[1]]
        assert dq.op_type == "DequantizeLinear" and wq.dtype == E4M3 and w_scale.shape == (channels,)
        assert {a.name: a.i for a in dq.attribute}["axis"] == axis
        w = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == w))
        np.testing.assert_array_equal(w_scale, np.abs(w).max(axis=1 - axis) / np.float32(448))
        q = producer[producer[nodes[name].input[0]].input[0]]
        assert q.op_type == "QuantizeLinear" and inits[q.input[2]].dtype == E4M3
    # onnxruntime's reading: the products of the e4m3 values, dequantized
    feeds = batches(1)[0]
    onnx.save(quantized, tmp_path / "q.onnx")
    y, z, s = run_onnxruntime(tmp_path / "q.onnx", feeds).values()

    def fake(a: np.ndarray, scale: float) -> np.ndarray:
        return (a / np.float32(scale)).astype(E4M3).astype(np.float32) * np.float32(scale)

    def weight(name: str) -> np.ndarray:
        dq = producer[nodes[name].input[1]]
        shape = (1, -1) if name != "fc2" else (-1, 1)
        return inits[dq.input[0]].astype(np.float32) * inits[dq.input[1]].reshape(shape)

    w1, b1, b2 = weight("fc1"), inits["b1"], inits["b2"]
    h = fake(feeds["x"], 0.01) @ w1 + b1
    r = fake(np.maximum(h, 0), 0.02)
    np.testing.assert_allclose(y, r @ weight("fc2").T + b2, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(z, r @ weight("fc3"), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s, h @ h.T, rtol=1e-5, atol=1e-4)


def test_polykit_runs_every_quantized_linear_layer_as_an_fp8_layer_close_to_onnxruntime(tmp_path):
    model = mlp_with_attention()
    quantized = insert_fp8_qdq(model, calibrate_fp8(model, batches(2)))
    plan = build_plan(quantized, BuilderConfig(target="cpu"))
    fp8 = [layer for layer in plan.layers if layer.precision == "fp8"]
    assert len(fp8) == 3 and {layer.kind for layer in fp8} == {"QMatMul"}
    feeds = batches(5)[4]
    onnx.save(quantized, tmp_path / "q.onnx")
    want = run_onnxruntime(tmp_path / "q.onnx", feeds)
    got = Engine(plan).create_execution_context().execute(feeds)
    for name in ("y", "z", "s"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5)


def test_an_opset_without_float8_is_refused_with_the_upgrade_to_run():
    with pytest.raises(UsageError, match="opset 19 or later; the model has opset 17") as info:
        insert_fp8_qdq(mlp_with_attention(opset=17), {"x": 0.01})
    assert "--upgrade-opset" in info.value.hint


def test_a_model_without_linear_layers_has_nothing_to_calibrate():
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    with pytest.raises(UsageError, match="no MatMul or Gemm"):
        calibrate_fp8(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), batches(1))

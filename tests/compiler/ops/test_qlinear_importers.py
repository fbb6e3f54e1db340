"""QLinearMatMul / QLinearConv importers: the rewritten graph matches ONNX's reference operator
(onnxruntime's u8s8 conv saturates int16 partial sums on cpus without VNNI, so it is no oracle here)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

from polykit.compiler.ir import dtypes
from polykit.compiler.graph.evaluator import evaluate_graph
from polykit.compiler.graph.onnx_import import load_onnx

RNG = np.random.default_rng(21)


def _model(op, feeds, inits, opset=21, **attrs):
    names = list(feeds) + list(inits)
    order = {"QLinearMatMul": ["a", "a_scale", "a_zp", "b", "b_scale", "b_zp", "y_scale", "y_zp"],
             "QLinearConv": ["x", "x_scale", "x_zp", "w", "w_scale", "w_zp", "y_scale", "y_zp", "B"]}[op]
    node = helper.make_node(op, [n for n in order if n in names], ["y"], **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, dtypes.to_onnx(v.dtype), v.shape) for n, v in feeds.items()],
        [onnx.ValueInfoProto(name="y")],
        [onnx.numpy_helper.from_array(v, n) for n, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def _check(model, feeds):
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    got = evaluate_graph(load_onnx(model), feeds)["y"]
    assert got.dtype == want.dtype and got.shape == want.shape
    # polykit forms the scale factor in float64, the reference in float32: a value on a rounding
    # boundary may land one step away
    assert np.abs(got.astype(np.int32) - want.astype(np.int32)).max() <= 1
    return got, want


@pytest.mark.parametrize("qtype", [np.uint8, np.int8])
def test_qlinear_matmul_matches_the_onnx_reference(qtype):
    info = np.iinfo(qtype)
    a = RNG.integers(info.min, info.max, (3, 5, 7)).astype(qtype)
    inits = {"a_scale": np.array(0.02, np.float32), "a_zp": np.array(3, qtype),
             "b": RNG.integers(info.min, info.max, (7, 4)).astype(qtype), "b_scale": np.array(0.01, np.float32),
             "b_zp": np.array(-2 if qtype == np.int8 else 9, qtype), "y_scale": np.array(0.5, np.float32),
             "y_zp": np.array(5, qtype)}
    got, want = _check(_model("QLinearMatMul", {"a": a}, inits), {"a": a})
    assert (got == want).mean() > 0.99


def test_qlinear_conv_with_per_channel_weights_and_bias_matches_the_onnx_reference():
    x = RNG.integers(0, 255, (1, 3, 8, 8)).astype(np.uint8)
    inits = {"x_scale": np.array(0.01, np.float32), "x_zp": np.array(100, np.uint8),
             "w": RNG.integers(-100, 100, (4, 3, 3, 3)).astype(np.int8),
             "w_scale": RNG.uniform(0.005, 0.02, 4).astype(np.float32), "w_zp": np.zeros(4, np.int8),
             "y_scale": np.array(0.05, np.float32), "y_zp": np.array(128, np.uint8),
             "B": RNG.integers(-500, 500, 4).astype(np.int32)}
    got, want = _check(_model("QLinearConv", {"x": x}, inits, opset=10, pads=[1, 1, 1, 1], strides=[2, 2]), {"x": x})
    assert got.shape == (1, 4, 4, 4) and (got == want).mean() > 0.99


def test_qlinear_matmul_becomes_integer_matmul_and_quantize():
    inits = {"a_scale": np.array(0.02, np.float32), "a_zp": np.array(3, np.uint8),
             "b": np.ones((7, 4), np.uint8), "b_scale": np.array(0.01, np.float32), "b_zp": np.array(1, np.uint8),
             "y_scale": np.array(0.5, np.float32), "y_zp": np.array(5, np.uint8)}
    graph = load_onnx(_model("QLinearMatMul", {"a": np.zeros((2, 7), np.uint8)}, inits))
    ops = [n.op_type for n in graph.nodes]
    assert "QLinearMatMul" not in ops and ops[0] == "MatMulInteger" and ops[-1] == "QuantizeLinear"

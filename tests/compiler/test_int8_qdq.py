"""Explicit quantization: models carrying QuantizeLinear/DequantizeLinear (onnxruntime's
quantize_static among them) import, fold into INT8 layers and match onnxruntime."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.runtime.engine import Runtime

from .int8_models import convnet, feeds_for, mlp, qat_conv_nodes, quantize_with_onnxruntime

FLOAT_PRODUCTS = {"Conv", "Gemm", "MatMul"}


def run_plan(plan, feeds):
    with Runtime(plan.target).deserialize_engine(plan) as engine:
        return engine.create_execution_context().execute(feeds)


def run_onnxruntime(path, feeds, *, as_written: bool = True):
    """onnxruntime's outputs; `as_written`: its Q/DQ nodes run as the model has them (basic graph
    optimizations only), else fused into its own int8 kernels (QLinearConv, QGemm, ...)."""
    options = ort.SessionOptions()
    if as_written:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def output_step(path: str) -> float:
    """The scale of the DequantizeLinear that writes the model's output: one quantization step."""
    model = onnx.load(path)
    out = model.graph.output[0].name
    dq = next(n for n in model.graph.node if out in n.output)
    assert dq.op_type == "DequantizeLinear"
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    return float(inits[dq.input[1]])


VARIANTS = pytest.mark.parametrize("make, activations, per_channel", [
    (convnet, "uint8", True), (convnet, "int8", False), (mlp, "uint8", False), (mlp, "int8", True),
], ids=["convnet-uint8-per-channel", "convnet-int8", "mlp-uint8", "mlp-int8-per-channel"])


@VARIANTS
def test_quantize_static_models_run_on_int8_layers_and_match_onnxruntime(tmp_path, make, activations, per_channel):
    path = quantize_with_onnxruntime(make(), tmp_path / "q.onnx", activations=activations, per_channel=per_channel)
    plan = build_plan(path, BuilderConfig(target="cpu"))
    kinds = [layer.kind for layer in plan.layers]
    assert not FLOAT_PRODUCTS & set(kinds), kinds
    assert {"QConv", "QMatMul"} & set(kinds)
    assert all(layer.precision == "int8" for layer in plan.layers if layer.kind.startswith("Q") and layer.domain)
    step = output_step(path)
    for seed in (11, 12, 13):
        feeds = feeds_for(make(), seed)
        (ours,), (theirs,) = run_plan(plan, feeds).values(), run_onnxruntime(path, feeds).values()
        assert np.abs(ours - theirs).max() <= step * 1.001


@VARIANTS
def test_reduce_range_models_match_onnxruntimes_own_int8_kernels(tmp_path, make, activations, per_channel):
    # onnxruntime's x86 u8s8/s8s8 kernels saturate int16 pair sums unless weights are 7-bit
    # (reduce_range); with them, its QLinearConv / QGemm and polykit's INT8 layers agree
    path = quantize_with_onnxruntime(make(), tmp_path / "q.onnx", activations=activations, per_channel=per_channel,
                                     reduce_range=True)
    plan = build_plan(path, BuilderConfig(target="cpu"))
    for seed in (11, 12):
        feeds = feeds_for(make(), seed)
        (ours,), (theirs,) = run_plan(plan, feeds).values(), run_onnxruntime(path, feeds, as_written=False).values()
        assert np.abs(ours - theirs).max() <= output_step(path) * 1.001


def test_fused_requantization_writes_the_next_layers_int8_input(tmp_path):
    path = quantize_with_onnxruntime(convnet(), tmp_path / "q.onnx", activations="uint8", per_channel=True)
    plan = build_plan(path, BuilderConfig(target="cpu"))
    conv1 = next(layer for layer in plan.layers if layer.name == "conv1")
    assert conv1.kind == "QConv" and conv1.out_dtypes == ("uint8",)
    assert plan.tensors[conv1.inputs[0]].dtype == "uint8"  # it reads the quantized input itself


def test_fp32_layers_keep_a_quantized_conv_in_float(tmp_path):
    path = quantize_with_onnxruntime(convnet(), tmp_path / "q.onnx", activations="int8", per_channel=True)
    plan = build_plan(path, BuilderConfig(target="cpu", fp32_layers=("conv1",)))
    kinds = {layer.name: layer.kind for layer in plan.layers}
    assert kinds["conv1"] != "QConv" and kinds["conv2"] == "QConv"
    feeds = feeds_for(convnet(), 21)
    (ours,), (theirs,) = run_plan(plan, feeds).values(), run_onnxruntime(path, feeds).values()
    assert np.abs(ours - theirs).max() <= output_step(path) * 1.001


def _qdq_model(nodes, inits, x_shape, y_shape, opset=21):
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def test_a_one_entry_scale_is_per_tensor_whatever_the_axis(tmp_path):
    # onnxruntime's quantizer writes a rank-1 bias with a [1] scale and no axis (default 1)
    inits = {"b": np.array([7, -3, 12, 0], np.int32), "s": np.array([0.25], np.float32),
             "z": np.array(0, np.int32)}
    nodes = [helper.make_node("DequantizeLinear", ["b", "s", "z"], ["bias"], name="bias_dq"),
             helper.make_node("Add", ["x", "bias"], ["y"], name="add")]
    path = tmp_path / "bias.onnx"
    onnx.save(_qdq_model(nodes, inits, [2, 4], [2, 4]), str(path))
    feeds = {"x": np.arange(8, dtype=np.float32).reshape(2, 4)}
    (ours,) = run_plan(build_plan(str(path), BuilderConfig(target="cpu")), feeds).values()
    np.testing.assert_array_equal(ours, run_onnxruntime(path, feeds)["y"])


def test_blocked_weights_and_per_axis_activations_run_as_written(tmp_path):
    rng = np.random.default_rng(2)
    inits = {"wq": rng.integers(-127, 128, (8, 6)).astype(np.int8),
             "ws": rng.uniform(0.01, 0.05, (2, 6)).astype(np.float32),  # blocks of 4 along K
             "xs": rng.uniform(0.01, 0.05, 8).astype(np.float32), "xz": np.zeros(8, np.int8)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="xq", axis=1),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"], name="xdq", axis=1),
             helper.make_node("DequantizeLinear", ["wq", "ws"], ["w"], name="wdq", axis=0, block_size=4),
             helper.make_node("MatMul", ["xd", "w"], ["y"], name="mm")]
    path = tmp_path / "blocked.onnx"
    onnx.save(_qdq_model(nodes, inits, [3, 8], [3, 6]), str(path))
    plan = build_plan(str(path), BuilderConfig(target="cpu"))
    # no INT8 layer: the activation's per-axis Q/DQ run as layers, the blocked weight stays packed (weight-only)
    assert [layer.kind for layer in plan.layers] == ["QuantizeLinear", "DequantizeLinear", "WeightOnlyMatMul"]
    feeds = {"x": rng.standard_normal((3, 8)).astype(np.float32)}
    np.testing.assert_allclose(run_plan(plan, feeds)["y"], run_onnxruntime(path, feeds)["y"], rtol=1e-5, atol=1e-6)


def test_a_residual_add_between_quantized_convs_stays_float_and_correct(tmp_path):
    from tests.compiler.int8_models import small_resnet

    path = quantize_with_onnxruntime(small_resnet(), tmp_path / "q.onnx", activations="uint8", per_channel=True,
                                     batches=3)
    plan = build_plan(path, BuilderConfig(target="cpu"))
    assert "Conv" not in [layer.kind for layer in plan.layers]
    feeds = feeds_for(small_resnet(), 4)
    (ours,), (theirs,) = run_plan(plan, feeds).values(), run_onnxruntime(path, feeds).values()
    assert np.abs(ours - theirs).max() <= output_step(path) * 1.001


def test_without_int8_tactics_the_model_runs_in_float_with_a_warning(tmp_path, caplog, monkeypatch):
    import polykit.compiler.builder.quantize as quantize

    path = quantize_with_onnxruntime(mlp(), tmp_path / "q.onnx", activations="uint8", per_channel=False)
    monkeypatch.setattr(quantize, "target_runs_int8", lambda target: False)
    with caplog.at_level(logging.WARNING, logger="polykit"):
        plan = build_plan(load_onnx(path), BuilderConfig(target="cpu"))
    assert "no INT8 tactics" in caplog.text
    assert not {"QConv", "QMatMul"} & {layer.kind for layer in plan.layers}
    feeds = feeds_for(mlp(), 3)
    (ours,), (theirs,) = run_plan(plan, feeds).values(), run_onnxruntime(path, feeds).values()
    assert np.abs(ours - theirs).max() <= output_step(path) * 1.001


def test_constant_node_scales_and_a_quantized_float_weight_fold_too(tmp_path):
    # as a QAT export writes it: scales in Constant nodes, the weight QuantizeLinear'd from float
    rng = np.random.default_rng(6)
    nodes = qat_conv_nodes()
    inits = {"w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3,
             "ws": rng.uniform(0.002, 0.004, 4).astype(np.float32), "wz": np.zeros(4, np.int8)}
    path = tmp_path / "qat.onnx"
    onnx.save(_qdq_model(nodes, inits, [1, 3, 8, 8], [1, 4, 8, 8]), str(path))
    plan = build_plan(str(path), BuilderConfig(target="cpu"))
    conv = next(layer for layer in plan.layers if layer.name == "conv")
    assert conv.kind == "QConv" and conv.out_dtypes == ("int8",)
    feeds = {"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)}
    np.testing.assert_array_equal(run_plan(plan, feeds)["y"], run_onnxruntime(path, feeds)["y"])

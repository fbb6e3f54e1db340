"""Implicit INT8 builds (BuilderConfig.int8): calibrated CNNs close to fp32 on the cpu target,
dynamic ranges, per-channel weights, layers kept in float, targets without INT8 tactics."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.compiler.passes.insert_qdq import quantize_weight
from polykit.errors import BuildError, UsageError
from polykit.runtime.engine import Runtime

from .int8_models import convnet, feeds_for, small_resnet

INT8_KINDS = {"QConv", "QMatMul"}


def run(plan, feeds):
    with Runtime(plan.target).deserialize_engine(plan) as engine:
        return next(iter(engine.create_execution_context().execute(feeds).values()))


def cosine(a, b):
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.mark.parametrize("calibrator", ["entropy", "minmax", "percentile"])
def test_calibrated_resnet_on_cpu_is_int8_and_close_to_fp32(calibrator):
    model = load_onnx(small_resnet())
    batches = [feeds_for(small_resnet(), seed) for seed in range(8)]
    fp32 = build_plan(model, BuilderConfig(target="cpu"))
    int8 = build_plan(model, BuilderConfig(target="cpu", int8=True, calibration_data=batches, calibrator=calibrator))
    kinds = [layer.kind for layer in int8.layers]
    assert kinds.count("QConv") == 17 and kinds.count("QMatMul") == 1  # every conv and the classifier
    assert not {"Conv", "Gemm", "MatMul"} & set(kinds)
    for seed in (100, 101):
        feeds = feeds_for(small_resnet(), seed)
        assert cosine(run(int8, feeds), run(fp32, feeds)) >= 0.99


def test_tensor_ranges_alone_quantize_without_data():
    graph = load_onnx(convnet())
    ranges = {"x": (-1.5, 1.2), "r1": (0.0, 3.0), "f": (0.0, 2.0)}
    plan = build_plan(graph, BuilderConfig(target="cpu", int8=True, tensor_ranges=ranges))
    quantize_x = next(layer for layer in plan.layers if layer.kind == "QuantizeLinear" and layer.inputs[0] == "x")
    assert float(plan.weights[quantize_x.inputs[1]]) == np.float32(1.5 / 127)
    feeds = feeds_for(convnet(), 5)
    assert cosine(run(plan, feeds), run(build_plan(graph, BuilderConfig(target="cpu")), feeds)) >= 0.99


def test_a_range_overrides_the_calibrated_scale_of_its_tensor():
    graph = load_onnx(convnet())
    batches = [feeds_for(convnet(), seed) for seed in range(2)]
    plan = build_plan(graph, BuilderConfig(target="cpu", int8=True, calibration_data=batches,
                                           tensor_ranges={"x": (-8.0, 2.0)}))
    quantize_x = next(layer for layer in plan.layers if layer.kind == "QuantizeLinear" and layer.inputs[0] == "x")
    assert float(plan.weights[quantize_x.inputs[1]]) == np.float32(8.0 / 127)


def test_ranges_of_unknown_tensors_and_bad_ranges_are_errors():
    graph = load_onnx(convnet())
    with pytest.raises(BuildError, match="'nope'"):
        build_plan(graph, BuilderConfig(target="cpu", int8=True, tensor_ranges={"nope": (-1, 1), "x": (-1, 1)}))
    with pytest.raises(UsageError, match="min <= max"):
        BuilderConfig(tensor_ranges={"x": (2.0, 1.0)})
    with pytest.raises(UsageError, match="calibrator"):
        BuilderConfig(calibrator="kl")
    with pytest.raises(UsageError, match="percentile"):
        BuilderConfig(percentile=0)


def test_int8_without_data_cache_or_ranges_says_what_to_give():
    with pytest.raises(UsageError, match="--calibration-data"):
        build_plan(load_onnx(convnet()), BuilderConfig(target="cpu", int8=True))


def test_weights_are_quantized_symmetrically_per_output_channel_from_max_abs():
    w = np.array([[0.5, -1.0, 0.25], [0.0, 0.0, 0.0], [2.0, 1.0, -0.5]], np.float32)
    q, scale = quantize_weight(w, axis=0)
    np.testing.assert_array_equal(scale, np.float32([1.0 / 127, 1.0, 2.0 / 127]))
    np.testing.assert_array_equal(q, [[64, -127, 32], [0, 0, 0], [127, 64, -32]])  # 63.5 rounds to even
    q1, scale1 = quantize_weight(w, axis=1)
    np.testing.assert_array_equal(scale1, np.float32([2.0, 1.0, 0.5]) / 127)
    assert q.dtype == np.int8 and np.abs(q1).max() == 127


def test_fp32_layers_stay_float_in_an_int8_build():
    plan = build_plan(load_onnx(convnet()), BuilderConfig(target="cpu", int8=True, fp32_layers=("conv2",),
                                                          tensor_ranges={"x": (-2, 2), "r1": (0, 3), "f": (0, 2)}))
    kinds = {layer.name: layer.kind for layer in plan.layers}
    assert kinds["conv1"] == "QConv" and kinds["fc"] == "QMatMul" and kinds["conv2"] == "Conv"


@pytest.mark.parametrize("quantized", ["int8", "fp8"])
@pytest.mark.parametrize("precision, half", [("fp32", {}), ("tf32", {}), ("fp16", {"fp16": True}),
                                             ("bf16", {"bf16": True})])
def test_a_node_layer_precisions_names_is_not_quantized(quantized, precision, half):
    # TensorRT's per-layer precision: a layer asked to run in a float type is not an INT8 / FP8 layer
    # (`debug precision --int8 / --fp8` writes its answer as such a --layer-precisions value)
    ranges = {"x": (-2, 2), "r1": (0, 3), "f": (0, 2)}
    plan = build_plan(load_onnx(convnet()), BuilderConfig(target="cpu", tensor_ranges=ranges, **{quantized: True},
                                                          layer_precisions={"conv2": precision}, **half))
    layers = {layer.name: layer for layer in plan.layers}
    assert layers["conv1"].kind == "QConv" and layers["fc"].kind == "QMatMul"
    assert layers["conv2"].kind == "Conv" and layers["conv2"].precision == ("fp32" if not half else precision)


def test_int8_plans_are_deterministic_and_record_the_calibrator():
    graph = load_onnx(convnet())
    batches = [feeds_for(convnet(), seed) for seed in range(3)]
    config = BuilderConfig(target="cpu", int8=True, calibration_data=batches, calibrator="percentile",
                           builder_optimization_level=0)
    first, again = build_plan(graph, config), build_plan(graph, config)
    assert first.serialize() == again.serialize()
    recorded = first.metadata["builder_config"]
    assert recorded["int8"] and recorded["calibrator"] == "percentile" and "calibration_data" not in recorded


def test_a_target_without_int8_tactics_ignores_int8_with_a_warning(caplog, monkeypatch):
    import polykit.compiler.builder.quantize as quantize

    monkeypatch.setattr(quantize, "target_runs_int8", lambda target: False)
    with caplog.at_level(logging.WARNING, logger="polykit"):
        plan = build_plan(load_onnx(convnet()), BuilderConfig(target="cpu", int8=True))
    assert "--int8 is ignored" in caplog.text
    assert not INT8_KINDS & {layer.kind for layer in plan.layers}


def test_cuda_builds_int8_layers_and_runs_the_ones_its_kernels_refuse_in_float(caplog):
    # a cuda plan builds without a GPU (priorities choose); convnet's conv2 is grouped, which the
    # cuda INT8 kernels refuse: it alone runs in float, with a warning naming it
    with caplog.at_level(logging.WARNING, logger="polykit"):
        plan = build_plan(load_onnx(convnet()), BuilderConfig(target="cuda", int8=True,
                                                              tensor_ranges={"x": (-2, 2), "r1": (0, 3), "f": (0, 2)}))
    layers = {layer.name: layer for layer in plan.layers}
    assert "no cuda INT8 tactic runs 'conv2'" in caplog.text
    assert layers["conv1"].kind == "QConvNHWC" and layers["conv1"].tactic == "cuda.int8.mma_conv_nhwc"
    # grouped: float, channels last on the grouped tactic (its Q/DQ read the NHWC int8 tensors)
    assert layers["conv2"].kind == "ConvNHWC" and layers["conv2"].tactic.startswith("cuda.conv_nhwc.grouped_p")
    assert layers["conv2"].in_dtypes[0] == "float32"
    # the classifier's GEMM (symmetric INT8, K % 16 == 0) runs channels-last as a 1x1 conv over its rows
    assert layers["fc"].kind == "QConvNHWC" and layers["fc"].attrs["kernel_shape"] == [1, 1]
    assert layers["fc"].tactic == "cuda.int8.mma_conv_nhwc" and layers["fc"].attrs.get("symmetric") == 1


def test_an_int8_layer_no_tactic_runs_stays_quantized_and_equals_the_int8_layer(monkeypatch):
    # cpu stands in for cuda, whose kernels refuse grouped convs: the refused conv2 must still read
    # r1 and w2 quantized (its Q/DQ as layers, the conv in float), not the float model's r1 and w2,
    # which put every output ~1 % off the INT8 plan (the cuda-vs-cpu mismatch of test_int8_gpu.py)
    import polykit.compiler.builder.layer_precision as layer_precision

    ranges = {"x": (-2, 2), "r1": (0, 3), "f": (0, 2)}
    int8_plan = build_plan(load_onnx(convnet()), BuilderConfig(target="cpu", int8=True, tensor_ranges=ranges))
    runs = layer_precision.has_tactic
    monkeypatch.setattr(layer_precision, "has_tactic",
                        lambda layer, *a, **k: int(layer.attrs.get("group", 1)) == 1 and runs(layer, *a, **k))
    refused = build_plan(load_onnx(convnet()), BuilderConfig(target="cpu", int8=True, tensor_ranges=ranges))
    layers = {layer.name: layer for layer in refused.layers}
    assert layers["conv2"].kind == "Conv" and layers["conv1"].kind == "QConv"
    assert layers["conv1"].out_dtypes == ("int8",)  # requantized for conv2's DequantizeLinear
    assert "DequantizeLinear" in {layer.kind for layer in refused.layers}
    for seed in (1, 2):
        feeds = feeds_for(convnet(), seed)
        np.testing.assert_allclose(run(refused, feeds), run(int8_plan, feeds), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("half", ["fp16", "bf16"])
def test_int8_with_half_precision_keeps_int8_layers_quantized_and_the_rest_half(half):
    """conv2's float output feeds the half pool: an fp16 build's INT8 layer writes it as float16 itself (its Cast in
    the epilogue: passes/absorb_quantized_casts.py), a bf16 build's writes float32 and a Cast follows."""
    ranges = {"x": (-2, 2), "r1": (0, 3), "f": (0, 2)}
    plan = build_plan(load_onnx(convnet()), BuilderConfig(target="cpu", int8=True, tensor_ranges=ranges, **{half: True}))
    layers = {layer.name: layer for layer in plan.layers}
    assert layers["conv2"].kind == "QConv"
    assert layers["conv2"].out_dtypes == (("float16",) if half == "fp16" else ("float32",))
    assert layers["pool"].out_dtypes == ("float16" if half == "fp16" else "bfloat16",)
    feeds = feeds_for(convnet(), 2)
    assert cosine(run(plan, feeds), run(build_plan(load_onnx(convnet()), BuilderConfig(target="cpu")), feeds)) >= 0.99

"""Weight-only quantization (issue 35, point 3) on the cpu target: DequantizeLinear of a constant
int4 / uint4 / float4_e2m1fn / int8 / uint8 weight feeding MatMul or Gemm becomes one
WeightOnlyMatMul whose weight stays packed in the plan, and computes what onnxruntime (or ONNX's
reference evaluator, for float4) and the float-dequantized build compute."""

from __future__ import annotations

import logging

import numpy as np
import onnxruntime as ort
import pytest
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.compiler.plan.profiles import Profile
from polykit.runtime.engine import Runtime
from tests.compiler.weight_only_models import mlp, quantized, weight_only

KIND = "WeightOnlyMatMul"
#: float32 results of one dot product of K terms in another order: |error| <= K * eps * sum |x w|
RTOL, ATOL = 1e-5, 1e-5


def run(plan, feeds):
    with Runtime(plan.target).deserialize_engine(plan) as engine:
        context = engine.create_execution_context()
        try:
            return context.execute(feeds)["y"]
        finally:
            context.close()


def onnxruntime_output(model, feeds):
    """onnxruntime running the Q/DQ as written: its default level fuses DequantizeLinear + MatMul into
    MatMulNBits with accuracy_level 4, which quantizes the activations to int8 (docs/INT8.md)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(["y"], feeds)[0]


def inputs(shape, seed=1, dtype=np.float32):
    return {"x": np.random.default_rng(seed).standard_normal(shape).astype(dtype)}


def kinds(plan):
    return [layer.kind for layer in plan.layers]


def float_build(model, **cfg):
    """The same model with the weight dequantized at build time (the layer pinned to float)."""
    return build_plan(load_onnx(model), BuilderConfig(target="cpu", fp32_layers=("fc",), **cfg))


@pytest.mark.parametrize("weight_type", ["int4", "uint4", "int8", "uint8"])
@pytest.mark.parametrize("block", [16, 32, None, 0], ids=["block16", "block32", "per_channel", "per_tensor"])
def test_integer_weights_stay_packed_and_match_onnxruntime(weight_type, block):
    model = weight_only(weight_type, block=block, x_shape=(2, 3, None))
    plan = build_plan(load_onnx(model), BuilderConfig(target="cpu"))
    assert kinds(plan) == [KIND]
    assert not [w for w in plan.weights.values() if w.dtype.kind == "f" and w.size >= 72 * 40]  # no float weight
    feeds = inputs((2, 3, 72))
    got = run(plan, feeds)
    np.testing.assert_allclose(got, onnxruntime_output(model, feeds), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(got, run(float_build(model), feeds), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("block", [16, None, 0], ids=["block16", "per_channel", "per_tensor"])
def test_float4_weights_stay_packed_and_match_the_onnx_reference(block):
    """onnxruntime 1.32 has no DequantizeLinear(23) kernel: ONNX's reference evaluator reads the model."""
    model = weight_only("float4_e2m1fn", block=block, x_shape=(5, None))
    plan = build_plan(load_onnx(model), BuilderConfig(target="cpu"))
    assert kinds(plan) == [KIND] and plan.layers[0].attrs["weight_type"] == "float4_e2m1fn"
    feeds = inputs((5, 72))
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    np.testing.assert_allclose(run(plan, feeds), want, rtol=RTOL, atol=ATOL)


def test_int4_weights_take_half_a_byte_each_in_the_plan():
    model = weight_only("int4", k=256, n=256, block=32, x_shape=(2, None))
    packed, folded = build_plan(load_onnx(model), BuilderConfig(target="cpu")), float_build(model)
    layer = packed.layers[0]
    assert packed.weights[layer.inputs[1]].nbytes == 256 * 256 // 2
    assert packed.weights[layer.inputs[2]].shape == (256, 8) and packed.weights[layer.inputs[3]].shape == (256, 8)
    weight_bytes = sum(w.nbytes for w in packed.weights.values())
    assert weight_bytes == 256 * 128 + 256 * 8 * 4 + 256 * 8  # packed weight, float32 scales, int8 zero points
    assert sum(w.nbytes for w in folded.weights.values()) == 256 * 256 * 4
    assert len(packed.serialize()) < len(folded.serialize()) / 5


@pytest.mark.parametrize("trans_b, bias", [(True, True), (False, True), (True, False)])
def test_gemm_with_trans_b_and_a_bias_folds(trans_b, bias):
    model = weight_only("int4", op="Gemm", x_shape=(4, None), trans_b=trans_b, bias=bias, block=8, k=40)
    plan = build_plan(load_onnx(model), BuilderConfig(target="cpu"))
    assert kinds(plan) == [KIND] and bool(plan.layers[0].inputs[4]) == bias
    feeds = inputs((4, 40))
    np.testing.assert_allclose(run(plan, feeds), onnxruntime_output(model, feeds), rtol=RTOL, atol=ATOL)


def test_half_activations_with_half_scales():
    model = weight_only("int4", elem="float16", x_shape=(3, None), block=32, k=64)
    plan = build_plan(load_onnx(model), BuilderConfig(target="cpu"))
    assert kinds(plan) == [KIND]
    feeds = inputs((3, 64), dtype=np.float16)
    got = run(plan, feeds)
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), onnxruntime_output(model, feeds).astype(np.float32),
                               rtol=2e-3, atol=2e-3)


def test_an_fp16_build_runs_the_layer_on_half_activations_scales_and_bias():
    """--fp16 (W4A16): the precision pass gives the layer float16 X, scales and bias; the weight stays packed."""
    model = weight_only("int4", op="Gemm", x_shape=(6, None), trans_b=True, bias=True, block=32, k=64)
    plan = build_plan(load_onnx(model), BuilderConfig(target="cpu", fp16=True))
    layer = next(layer for layer in plan.layers if layer.kind == KIND)
    assert layer.in_dtypes == ("float16", "uint8", "float16", "int8", "float16")
    feeds = inputs((6, 64))
    np.testing.assert_allclose(run(plan, feeds), onnxruntime_output(model, feeds), rtol=1e-2, atol=1e-2)


def test_a_dynamic_batch_and_sequence_serve_every_shape_of_the_profile():
    model = mlp("int4")
    profile = Profile({"x": ((1, 1, 64), (2, 8, 64), (4, 17, 64))})
    plan = build_plan(load_onnx(model), BuilderConfig(target="cpu", profiles=(profile,)))
    assert kinds(plan).count(KIND) == 2
    for i, shape in enumerate(((1, 1, 64), (3, 5, 64), (4, 17, 64))):
        feeds = inputs(shape, seed=i)
        np.testing.assert_allclose(run(plan, feeds), onnxruntime_output(model, feeds), rtol=1e-4, atol=1e-5)


def test_weights_quantized_in_blocks_along_n_stay_as_written():
    model = weight_only("int4", block=8, x_shape=(2, 3, None))
    dq = model.graph.node[0]
    next(a for a in dq.attribute if a.name == "axis").i = 1  # blocks along N: not a K-blocked GEMM weight
    scale = next(t for t in model.graph.initializer if t.name == "w_scale")
    zero = next(t for t in model.graph.initializer if t.name == "w_zero")
    model.graph.initializer.remove(scale)
    model.graph.initializer.remove(zero)
    rng = np.random.default_rng(3)
    model.graph.initializer.extend([numpy_helper.from_array(rng.uniform(0.01, 0.05, (72, 5)).astype(np.float32),
                                                            "w_scale"), quantized("w_zero", "int4", (72, 5), rng)])
    plan = build_plan(load_onnx(model), BuilderConfig(target="cpu"))
    assert KIND not in kinds(plan)
    feeds = inputs((2, 3, 72))
    np.testing.assert_allclose(run(plan, feeds), onnxruntime_output(model, feeds), rtol=RTOL, atol=ATOL)


def test_pinned_layers_keep_their_float_weight():
    plan = float_build(weight_only("int4", x_shape=(2, 3, None)))
    assert kinds(plan) == ["MatMul"]


def test_a_target_that_cannot_run_the_layer_builds_it_in_float(monkeypatch, caplog):
    from polykit.compiler.builder import layer_precision

    real = layer_precision.has_tactic
    monkeypatch.setattr(layer_precision, "has_tactic", lambda layer, target, arch: layer.kind != KIND
                        and real(layer, target, arch))
    model = weight_only("uint4", x_shape=(2, 3, None))
    with caplog.at_level(logging.WARNING, logger="polykit"):
        plan = build_plan(load_onnx(model), BuilderConfig(target="cpu"))
    assert kinds(plan) == ["MatMul"]
    assert "no cpu weight-only tactic runs 'fc'" in caplog.text
    feeds = inputs((2, 3, 72))
    np.testing.assert_allclose(run(plan, feeds), onnxruntime_output(model, feeds), rtol=RTOL, atol=ATOL)

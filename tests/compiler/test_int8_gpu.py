"""INT8 on the cuda target (gpu-marked): INT8 layers on the tensor-core tactics (kernels/cuda/int8/int8.py),
equal to the cpu target's exact integer layers; calibration runs the fp32 engine on the GPU."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.calibrate import calibrate
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.compiler.passes.insert_qdq import constant_tensors, int8_candidates
from polykit.compiler.builder.quantize import target_runs_int8
from polykit.runtime.engine import Runtime

from .int8_models import convnet, feeds_for, mlp, quantize_with_onnxruntime, small_resnet

pytestmark = pytest.mark.gpu

RANGES = {"x": (-2.0, 2.0), "r1": (0.0, 3.0), "f": (0.0, 2.0)}


def run(plan, feeds):
    with Runtime(plan.target).deserialize_engine(plan) as engine:
        return next(iter(engine.create_execution_context().execute(feeds).values()))


def test_calibration_on_the_gpu_gives_the_cpus_scales():
    graph = load_onnx(small_resnet())
    names = list(dict.fromkeys(x for _, x in int8_candidates(graph, constant_tensors(graph))))
    batches = [feeds_for(small_resnet(), seed) for seed in range(4)]
    on_gpu = calibrate(graph, names, batches, "cuda", "minmax")
    on_cpu = calibrate(graph, names, batches, "cpu", "minmax")
    for name in names:
        assert on_gpu[name] == pytest.approx(on_cpu[name], rel=1e-4)


def test_int8_on_cuda_runs_int8_layers_channels_last_and_equals_the_cpu_plan():
    graph = load_onnx(convnet())
    plan = build_plan(graph, BuilderConfig(target="cuda", int8=True, tensor_ranges=RANGES))
    assert target_runs_int8("cuda")
    tactics = {layer.name: layer.tactic for layer in plan.layers if layer.kind == "QConvNHWC"}
    # conv1, and the classifier's QMatMul as a 1x1 QConvNHWC; the tuner times the mma.sync conv against
    # the sm_90a ones (int8_sm90.py; int8_gemm_sm90.py's for a conv over rows: the classifier) where the GPU has them
    assert set(tactics) == {"conv1", "fc"}, tactics
    assert all(t.startswith(("cuda.int8.mma_conv_nhwc", "cuda.int8.sm90_", "cuda.int8.gemm_sm90_", "cuda.int8.gemm_rolled_sm90_"))
               for t in tactics.values()), tactics
    # the grouped conv2 (no cuda INT8 tactic) must stay quantized: it reads DQ(r1 int8) and DQ(w2 int8),
    # as the cpu plan's INT8 conv2 does; reading float r1 and w2 put every output ~1 % off. It runs in float,
    # channels-last since grouped convs have NHWC tactics (cuda.conv_nhwc.grouped_*)
    producers = {out: layer for layer in plan.layers for out in layer.outputs}
    conv2 = next(layer for layer in plan.layers if layer.name == "conv2")
    assert conv2.kind in ("Conv", "ConvNHWC") and producers[conv2.inputs[0]].kind == "DequantizeLinear", conv2
    reference = build_plan(graph, BuilderConfig(target="cpu", int8=True, tensor_ranges=RANGES, channels_last=True))
    feeds = feeds_for(convnet(), 3)
    got, want = run(plan, feeds), run(reference, feeds)
    # the INT8 layers are exact; the grouped conv runs in float on both targets (summation order differs)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("activations", ["uint8", "int8"])
def test_a_quantize_static_mlp_on_cuda_equals_the_cpu_target_exactly(tmp_path, activations):
    # Q, two INT8 layers (one requantizing), nothing in float between them: bit for bit
    path = quantize_with_onnxruntime(mlp(), tmp_path / "q.onnx", activations=activations, per_channel=True)
    plan = build_plan(path, BuilderConfig(target="cuda"))
    tactics = [layer.tactic for layer in plan.layers if layer.kind == "QMatMul"]
    # the tuner may pick the split-K variant (int8_splitk.py); any INT8 tactic must give the cpu's bits
    assert len(tactics) == 2 and all(t.startswith("cuda.int8.mma_matmul") for t in tactics), tactics
    cpu = build_plan(path, BuilderConfig(target="cpu"))
    for seed in (1, 2):
        feeds = feeds_for(mlp(), seed)
        np.testing.assert_array_equal(run(plan, feeds), run(cpu, feeds))


def test_a_quantize_static_resnet_on_cuda_runs_int8_convs_close_to_the_cpu_target(tmp_path):
    # its batch norms and residual Adds run in float between Q/DQ: a float ulp may flip a step
    path = quantize_with_onnxruntime(small_resnet(), tmp_path / "q.onnx", activations="uint8", per_channel=True)
    plan = build_plan(path, BuilderConfig(target="cuda"))
    assert sum(layer.tactic.startswith("cuda.int8.mma_conv") for layer in plan.layers) == 17
    feeds = feeds_for(small_resnet(), 1)
    got, want = run(plan, feeds), run(build_plan(path, BuilderConfig(target="cpu")), feeds)
    assert float((got * want).sum() / np.linalg.norm(got) / np.linalg.norm(want)) >= 0.9999


def test_a_quantize_static_model_runs_on_cuda_within_one_step_of_onnxruntime(tmp_path):
    path = quantize_with_onnxruntime(mlp(), tmp_path / "q.onnx", activations="uint8", per_channel=True)
    plan = build_plan(path, BuilderConfig(target="cuda"))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    step = float(load_onnx(path).initializers["y_scale"])
    for seed in (1, 2):
        feeds = feeds_for(mlp(), seed)
        assert np.abs(run(plan, feeds) - session.run(None, feeds)[0]).max() <= step * 1.001

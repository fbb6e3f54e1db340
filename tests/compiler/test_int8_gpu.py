"""INT8 on the cuda target (gpu-marked). Until cuda has INT8 tactics, cuda builds fall back to
float with a logged warning (docs/INT8.md); calibration runs the fp32 engine on the GPU."""

from __future__ import annotations

import logging

import numpy as np
import onnxruntime as ort
import pytest

from polykit.compiler.builder import build_plan
from polykit.compiler.calibrate import calibrate
from polykit.compiler.config import BuilderConfig
from polykit.compiler.onnx_import import load_onnx
from polykit.compiler.passes.insert_qdq import constant_tensors, int8_candidates
from polykit.compiler.quantize import target_runs_int8
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


def test_int8_on_cuda_builds_int8_layers_or_falls_back_to_float_with_a_warning(caplog):
    graph = load_onnx(convnet())
    with caplog.at_level(logging.WARNING, logger="polykit"):
        plan = build_plan(graph, BuilderConfig(target="cuda", int8=True, tensor_ranges=RANGES))
    kinds = {layer.kind for layer in plan.layers}
    if target_runs_int8("cuda"):
        assert "QConv" in kinds
    else:
        assert "cuda target has no INT8 tactics" in caplog.text and not {"QConv", "QMatMul"} & kinds
    reference = build_plan(graph, BuilderConfig(target="cpu", int8=True, tensor_ranges=RANGES))
    feeds = feeds_for(convnet(), 3)
    got, want = run(plan, feeds), run(reference, feeds)
    cos = float((got * want).sum() / np.linalg.norm(got) / np.linalg.norm(want))
    assert cos >= 0.99


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

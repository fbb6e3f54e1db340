"""benchmarks/weight_only_gemm.py's decoder chain (`--chain L`): L weight-only layers one after another, each its
own int4 weight, whose values keep their size (cpu plan against onnxruntime), and whose cuda plan (built off the
GPU) runs every layer as a WeightOnlyMatMul and, with the MatMuls pinned to float, none."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort

from benchmarks.weight_only_gemm import weight_only_chain
from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.runtime.engine import Runtime


def test_the_chain_keeps_its_values_in_size_and_the_cpu_plan_matches_onnxruntime():
    model = weight_only_chain("int4", 256, 4, 128, 3)
    onnx.checker.check_model(model)
    x = np.random.default_rng(0).standard_normal((3, 256)).astype(np.float16)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC  # the Q/DQ as written
    want = ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0].astype(np.float32)
    assert 0.3 < float(np.std(want)) < 3.0  # four layers later, neither grown nor shrunk by orders of magnitude
    plan = build_plan(model, BuilderConfig(target="cpu"))
    assert Counter(layer.kind for layer in plan.layers)["WeightOnlyMatMul"] == 4
    (got,) = Runtime().deserialize_engine(plan.serialize()).create_execution_context().execute({"x": x}).values()
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=2e-2, atol=2e-2 * float(np.abs(want).max()))


def test_the_cuda_chain_plans_run_every_layer_weight_only_or_every_layer_as_the_fp16_gemm():
    model = weight_only_chain("int4", 256, 3, 128, 1)
    weight_only = build_plan(model, BuilderConfig(target="cuda", builder_optimization_level=0))
    assert Counter(layer.kind for layer in weight_only.layers)["WeightOnlyMatMul"] == 3
    fp16 = build_plan(model, BuilderConfig(target="cuda", builder_optimization_level=0,
                                           fp32_layers=tuple(f"fc{i}" for i in range(3))))
    kinds = Counter(layer.kind for layer in fp16.layers)
    assert not kinds["WeightOnlyMatMul"] and kinds["MatMul"] + kinds["Gemm"] == 3

"""GPU: the fault plugin's cuda tactics run the SIMT kernels they wrap bit for bit, and add the
error (0.01 * max|y|) on the layers POLYKIT_FAULT_LAYERS matches, in float32 and float16."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.runtime.engine import Engine
from tests.cli_models import REPO

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fault_plugin")]

CONVNET = str(REPO / "tests" / "data" / "torch" / "convnet_ts.onnx")
WRAPPED = {"Conv": "cuda.conv.igemm_simt", "MatMul": "cuda.gemm.simt", "Gemm": "cuda.gemm.simt"}


def _run(plan, feeds):
    with Engine(plan) as engine, engine.create_execution_context() as ctx:
        return ctx.execute(feeds)


def _simt_twin(model, plan, cfg):
    """The same build with every fault tactic replaced by the tactic it wraps."""
    return build_plan(model, replace(cfg, tactic_replay={l.name: WRAPPED[l.kind] for l in plan.layers
                                                         if l.tactic.startswith("fault.")}))


@pytest.mark.parametrize("fp16", [False, True])
def test_cuda_fault_tactics_are_exact_until_a_layer_matches(monkeypatch, fp16):
    cfg = BuilderConfig(target="cuda", builder_optimization_level=0, fp16=fp16, channels_last=False)
    plan = build_plan(CONVNET, cfg)
    assert {l.tactic for l in plan.layers if l.kind in WRAPPED} == {"fault.Conv", "fault.Gemm"}
    feeds = {"image": np.random.default_rng(3).uniform(-1, 1, (2, 3, 32, 32)).astype(np.float32)}
    exact = _run(_simt_twin(CONVNET, plan, cfg), feeds)["logits"]
    np.testing.assert_array_equal(_run(plan, feeds)["logits"], exact)
    monkeypatch.setenv("POLYKIT_FAULT_LAYERS", "blocks.0/c1/Conv$")  # a fused Conv (+ Relu epilogue)
    # the run above matched bit for bit; the fault added to the first block reaches the logits
    # attenuated by the layers after it (6.7e-4 measured on an H100, fp32 and fp16)
    assert np.abs(_run(plan, feeds)["logits"] - exact).max() > 1e-4


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_the_cuda_error_is_one_hundredth_of_the_outputs_max_abs(monkeypatch, dtype):
    rng = np.random.default_rng(5)
    w = numpy_helper.from_array((rng.standard_normal((256, 96)) / 16).astype(dtype), "w")
    elem = TensorProto.FLOAT if dtype == np.float32 else TensorProto.FLOAT16
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "mm",
                              [helper.make_tensor_value_info("x", elem, [300, 256])],
                              [helper.make_tensor_value_info("y", elem, [300, 96])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    cfg = BuilderConfig(target="cuda", builder_optimization_level=0)
    plan = build_plan(model, cfg)
    assert plan.layer("mm").tactic == "fault.MatMul"
    feeds = {"x": rng.uniform(-1, 1, (300, 256)).astype(dtype)}
    exact = _run(_simt_twin(model, plan, cfg), feeds)["y"].astype(np.float64)
    monkeypatch.setenv("POLYKIT_FAULT_LAYERS", "^mm$")
    wrong = _run(plan, feeds)["y"].astype(np.float64)
    np.testing.assert_allclose(wrong - exact, 0.01 * np.abs(exact).max(), rtol=1e-3 if dtype == np.float32 else 0.1,
                               atol=1e-6 if dtype == np.float32 else 2e-3)

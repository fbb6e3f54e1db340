"""FP8 on the cuda target (gpu-marked; the lead runs these on an H100 / H200): an --fp8 ResNet and an
explicit FP8 Q/DQ conv chain on the sm_90a e4m3 tactics (kernels/cuda/int8/fp8_sm90.py), close to the
cpu target's FP8 plan (which sums exactly) and to fp32."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.runtime.engine import Runtime

from .fp8_models import conv_chain, matmul_batched
from .int8_models import feeds_for, small_resnet
from .test_int8_build import cosine

pytestmark = pytest.mark.gpu


def run(plan, feeds):
    with Runtime(plan.target).deserialize_engine(plan) as engine:
        return next(iter(engine.create_execution_context().execute(feeds).values()))


def sm90() -> bool:
    from polykit.runtime.cuda import driver

    return driver.current_device().arch.startswith("sm_90")


def fp8_wgmma(tactic: str) -> bool:
    """An FP8 sm_90 tactic of any family (the conv tiles, the GEMM tiles, their fast-accumulation forms): timing
    picks among them."""
    return tactic.startswith("cuda.fp8.") and "sm90_" in tactic


def test_an_fp8_resnet_runs_its_convs_on_e4m3_wgmma_close_to_the_cpu_plan():
    if not sm90():
        pytest.skip("the FP8 tactics need sm_90a")
    model = load_onnx(small_resnet())
    batches = [feeds_for(small_resnet(), seed) for seed in range(4)]
    plan = build_plan(model, BuilderConfig(target="cuda", fp8=True, calibration_data=batches))
    convs = [layer for layer in plan.layers if layer.kind == "QConvNHWC"]  # 17 convs and the classifier
    assert len(convs) == 18 and all(fp8_wgmma(layer.tactic) for layer in convs), \
        [(layer.name, layer.tactic) for layer in convs]
    cpu = build_plan(model, BuilderConfig(target="cpu", fp8=True, calibration_data=batches))
    fp32 = build_plan(model, BuilderConfig(target="cpu"))
    for seed in (100, 101):
        feeds = feeds_for(small_resnet(), seed)
        got = run(plan, feeds)
        assert cosine(got, run(cpu, feeds)) >= 0.999
        assert cosine(got, run(fp32, feeds)) >= 0.99


def test_an_explicit_fp8_conv_chain_on_cuda_matches_the_cpu_plan(tmp_path):
    if not sm90():
        pytest.skip("the FP8 tactics need sm_90a")
    path, _ = conv_chain(tmp_path / "c.onnx")
    # 5 input channels: the channels-last pass pads them to 16 with e4m3 zeros
    plan = build_plan(path, BuilderConfig(target="cuda"))
    assert any(fp8_wgmma(layer.tactic) for layer in plan.layers)
    cpu = build_plan(path, BuilderConfig(target="cpu"))
    x = np.random.default_rng(3).standard_normal((2, 5, 13, 11)).astype(np.float32)
    got, want = run(plan, {"x": x}), run(cpu, {"x": x})
    assert cosine(got, want) >= 0.999


def test_an_fp8_batched_matmul_on_cuda_runs_as_a_1x1_conv_and_matches_the_cpu_plan(tmp_path):
    if not sm90():
        pytest.skip("the FP8 tactics need sm_90a")
    path, _ = matmul_batched(tmp_path / "m.onnx", per_channel=True, k=32)
    plan = build_plan(path, BuilderConfig(target="cuda"))
    (conv,) = [layer for layer in plan.layers if layer.kind == "QConvNHWC"]
    assert fp8_wgmma(conv.tactic), conv.tactic
    cpu = build_plan(path, BuilderConfig(target="cpu"))
    x = np.random.default_rng(6).standard_normal((2, 3, 5, 32)).astype(np.float32)
    got, want = run(plan, {"x": x}), run(cpu, {"x": x})
    # test_fp8_sm90.TOL_SUM (2**-12) of the largest possible sum |x * w|: 32 products, |x| <= 2.5 (the Q's range)
    inits = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}
    w_max = float(np.abs(inits["w5"].astype(np.float32) * inits["ws6"]).max())
    np.testing.assert_allclose(got, want, rtol=2.0 ** -20, atol=2.0 ** -12 * 32 * 2.5 * w_max)

"""benchmarks/weight_only_gemm.py's decoder chain (`--chain L`): L weight-only layers one after another, each its
own int4 weight, whose values keep their size (cpu plan against onnxruntime), and whose cuda plan (built off the
GPU) runs every layer as a WeightOnlyMatMul and, with the MatMuls pinned to float, none. `--torch`'s parts that run
without torch or a GPU: its parsing, the weights torch is fed (the model's, and tinygemm's int4 operands that
dequantize to them) and the ratios / lines assembled from timings."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from benchmarks.weight_only_gemm import (TORCH_SIDES, dequantize, parse_args, tinygemm_operands, torch_lines,
                                         torch_ratios, weight_layers, weight_only_chain)
from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.errors import PolykitError
from polykit.runtime.engine import Runtime
from tests.compiler.weight_only_models import weight_only


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


def test_torch_option_defaults_off_and_names_the_sides_timed():
    assert TORCH_SIDES[parse_args(["--ms", "1,16", "--chain", "8"]).torch] == ()  # existing invocations unchanged
    assert TORCH_SIDES[parse_args(["--torch", "eager"]).torch] == ("fp16_eager",)
    assert set(TORCH_SIDES[parse_args(["--torch", "all"]).torch]) == {"fp16_eager", "fp16_compile", "int4pack"}
    for bad in (["--torch", "int4"], ["--chain", "2", "--n", "64", "--k", "128"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


@pytest.mark.parametrize("weight", ["int4", "uint4", "int8"])
def test_the_weights_torch_gets_are_the_models(weight):
    """x @ dequantize(weight_layers(model)) is the model's output (onnxruntime): torch's fp16 side multiplies by
    the weights polykit's plans carry."""
    model = weight_only(weight, k=256, n=64, block=128, x_shape=(3, None), elem="float16")
    x = np.random.default_rng(1).standard_normal((3, 256)).astype(np.float16)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    (layer,) = weight_layers(model)
    got = x.astype(np.float32) @ dequantize(*layer)
    np.testing.assert_allclose(got, want.astype(np.float32), rtol=1e-2, atol=1e-2 * float(np.abs(want).max()))
    assert len(weight_layers(weight_only_chain(weight, 256, 3, 128, 1))) == 3


@pytest.mark.parametrize("weight", ["int4", "uint4"])
def test_tinygemm_operands_dequantize_to_the_onnx_weight(weight):
    """tinygemm's convention, (q_u - 8) * scale + zero with q_u two a byte (even k high), gives back ONNX's
    (q - z) * s; weights that are not 4-bit integers are refused (recorded as torch_int4pack's error)."""
    (layer,) = weight_layers(weight_only(weight, k=256, n=64, block=64, x_shape=(1, None), elem="float16"))
    packed, scales_zeros = tinygemm_operands(*layer, weight)
    assert packed.dtype == np.uint8 and packed.shape == (64, 128) and scales_zeros.shape == (4, 64, 2)
    q_u = np.empty((64, 256), np.float32)
    q_u[:, ::2], q_u[:, 1::2] = packed >> 4, packed & 15
    scale, zero = (np.repeat(scales_zeros[..., i], 64, axis=0) for i in range(2))
    np.testing.assert_allclose((q_u.T - 8) * scale + zero, dequantize(*layer), rtol=1e-6, atol=1e-7)
    (fp4,) = weight_layers(weight_only("float4_e2m1fn", k=256, n=64, block=64, x_shape=(1, None)))
    with pytest.raises(PolykitError, match="int4 / uint4"):
        tinygemm_operands(*fp4, "float4_e2m1fn")


def test_torch_ratios_and_lines_from_fake_timings():
    """W4A16 against torch is torch's time over polykit's (one layer: the profiled layer's; the chain: its layer,
    PDL off and on); a torch side that raised is printed with its error and gets no ratio."""
    row = {"chain_layers": 8, "weight_only_layers_ms": 0.010, "weight_only_chain_layer_ms": 0.008,
           "weight_only_chain_pdl_layer_ms": 0.005, "torch_fp16_eager_ms": 0.030, "torch_fp16_eager_rel_diff": 1e-3,
           "torch_fp16_eager_chain_layer_ms": 0.020, "torch_int4pack": {"error": "RuntimeError: no kernel"},
           "torch_int4pack_chain_layer_ms": 0.010}
    ratios = torch_ratios(row)
    assert ratios == pytest.approx({"w4a16_vs_torch_fp16_eager": 3.0, "w4a16_chain_vs_torch_fp16_eager": 2.5,
                                    "w4a16_chain_pdl_vs_torch_fp16_eager": 4.0, "w4a16_chain_vs_torch_int4pack": 1.25,
                                    "w4a16_chain_pdl_vs_torch_int4pack": 2.0})
    one, chain = torch_lines({**row, **ratios}, ("fp16_eager", "int4pack"))
    assert "fp16_eager 30.0 us (rel diff 1.00e-03), W4A16 3.00x" in one and "int4pack RuntimeError: no kernel" in one
    assert "chain of 8" in chain and "W4A16 2.50x 4.00x PDL on" in chain and "int4pack 10.0 us" in chain


def test_chain_checks_count_non_finite_outputs_compare_pdl_and_the_forms():
    torch = pytest.importorskip("torch")
    from benchmarks.weight_only_gemm import chain_checks

    f = torch.tensor([[1.0, 2.0, 2.0]])
    outs = {("fp16_gemm", False): f, ("fp16_gemm", True): torch.tensor([[1.0, float("inf"), 2.0]]),
            ("weight_only", False): torch.tensor([[1.0, 2.0, 2.0 + 3e-3]]), ("weight_only", True): f.clone()}
    got = chain_checks(outs, torch)
    assert got["fp16_gemm_chain_nonfinite"] == 0 and got["fp16_gemm_chain_pdl_nonfinite"] == 1
    assert got["fp16_gemm_chain_pdl_identical"] is False and got["weight_only_chain_pdl_identical"] is False
    assert got["chain_rel_diff"] == pytest.approx(1e-3, rel=1e-3)  # PDL off's outputs: 3e-3 / 3
    # PDL alone: no identity to check; the fp16 chain's inf makes the difference NaN (what the benchmark printed at
    # M = 16 for torch's side, 2026-12-08: the non-finite counts now say which output held it)
    only_pdl = chain_checks({k: v for k, v in outs.items() if k[1]}, torch)
    assert "fp16_gemm_chain_pdl_identical" not in only_pdl and np.isnan(only_pdl["chain_rel_diff"])

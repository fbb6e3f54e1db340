"""The cuda WeightOnlyMatMul tactics (weight_only.cu): they compile with NVRTC (no GPU needed), and on
a GPU they compute the cpu reference's values on random packed weights of every type, odd shapes
and outputs poisoned first.

The dequantized weight is the reference's bit for bit (one rounding to the scale's type); the float32
sums run in another order than numpy's BLAS, so outputs agree to float32 rounding of the output's scale (ELEM = float: an output that
cancels to near zero carries the rounding of its large terms) or
to one rounding step of the 16-bit output (float16, bfloat16).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from polykit.compiler.ops.quant.weight_only import KIND, WEIGHT_TYPES
from polykit.kernels.cuda.int8.weight_only import ROW_TILES, compile_variants
from tests.kernels.weight_only_cases import BF16, random_layer
#: activation dtype -> (rtol, atol) against the reference
TOLERANCE = {np.dtype(np.float32): (2e-5, 2e-5), np.dtype(np.float16): (2e-3, 2e-3), BF16: (1.6e-2, 1e-2)}


def test_every_variant_compiles_with_nvrtc(shared_kernel_cache):
    from polykit.runtime.cuda.nvrtc import compile_many, unique_units

    units = unique_units(compile_variants())
    assert len(units) == 3 * len(ROW_TILES)
    cubins = compile_many(units, "sm_80", workers=min(2, os.cpu_count() or 1))
    assert len(cubins) == len(units) and all(blob[:4] == b"\x7fELF" for blob in cubins.values())


@pytest.mark.parametrize("fp16", [False, True])
def test_a_cuda_build_runs_weight_only_layers_on_these_tactics(fp16):
    """No GPU needed: an untimed cuda build lowers an INT4 MLP to WeightOnlyMatMul layers that a
    cuda.weight_only tactic runs (float16 ones in an --fp16 build: W4A16)."""
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.compiler.graph.onnx_import import load_onnx
    from tests.compiler.weight_only_models import mlp

    plan = build_plan(load_onnx(mlp("int4")), BuilderConfig(target="cuda", input_shapes={"x": (1, 4, 64)}, fp16=fp16,
                                                            builder_optimization_level=0))
    layers = [layer for layer in plan.layers if layer.kind == KIND]
    assert len(layers) == 2 and all(layer.tactic.startswith("cuda.weight_only.m") for layer in layers)
    assert {layer.in_dtypes[0] for layer in layers} == {"float16" if fp16 else "float32"}


def check(layer, inputs, tactic):
    from polykit.runtime.cuda.harness import assert_matches_reference, reference_layer

    rtol, atol = TOLERANCE[inputs["X"].dtype]
    if inputs["X"].dtype == np.float32:  # a float32 sum's rounding scales with the sum's terms, not its result
        atol += 2e-6 * float(np.abs(reference_layer(layer, inputs)["Y"]).max(initial=0.0))
    assert_matches_reference(layer, inputs, tactic=tactic, rtol=rtol, atol=atol)


# (X shape, N, block): M of 1..17 and rows folded from batch dims, N not a multiple of the 8 columns a
# block owns, K not a multiple of a 16-byte chunk, blocks that straddle chunks (7, 24), per channel (None)
CASES = [((1, 1), 1, None), ((1, 72), 37, 16), ((3, 100), 130, 7), ((2, 8, 64), 9, 32), ((16, 256), 64, 128),
         ((17, 96), 33, 24), ((5, 4096), 40, 128)]


@pytest.mark.gpu
@pytest.mark.parametrize("weight_type", list(WEIGHT_TYPES))
@pytest.mark.parametrize("x_shape,n,block", CASES)
@pytest.mark.parametrize("rows", ROW_TILES)
def test_float32_activations_equal_the_reference(x_shape, n, block, weight_type, rows):
    layer, inputs = random_layer(x_shape, n, weight_type, block)
    check(layer, inputs, f"cuda.weight_only.m{rows}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("weight_type", ["int4", "uint4", "float4_e2m1fn", "int8"])
@pytest.mark.parametrize("rows", ROW_TILES)
def test_half_activations_and_scales_equal_the_reference(dtype, weight_type, rows):
    layer, inputs = random_layer((4, 3, 200), 70, weight_type, 32, dtype=dtype, seed=rows)
    check(layer, inputs, f"cuda.weight_only.m{rows}")


@pytest.mark.gpu
@pytest.mark.parametrize("zero_point,bias", [(False, False), (False, True), (True, False)])
def test_without_zero_points_or_bias(zero_point, bias):
    layer, inputs = random_layer((6, 136), 50, "int4", 16, zero_point=zero_point, bias=bias)
    check(layer, inputs, "cuda.weight_only.m4")


@pytest.mark.gpu
def test_more_rows_than_the_grid_holds_step_over_m():
    layer, inputs = random_layer((70000, 32), 3, "uint4", 32, seed=5)
    check(layer, inputs, "cuda.weight_only.m1")


@pytest.mark.gpu
def test_a_gpt2_sized_int4_mlp_plan_matches_its_float_dequantized_build():
    """The issue's acceptance: a plan with INT4 weight-only MatMuls (GPT-2's 768 -> 3072 -> 768 MLP)
    on the cuda target against the float-dequantized build of the same model on the cpu target."""
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.compiler.graph.onnx_import import load_onnx
    from polykit.runtime.engine import Runtime
    from tests.compiler.weight_only_models import mlp

    model = load_onnx(mlp("int4", d=768, hidden=3072, block=128))
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 7, 768)).astype(np.float32)}
    gpu = build_plan(model, BuilderConfig(target="cuda", input_shapes={"x": (1, 7, 768)}))
    assert [layer.kind for layer in gpu.layers].count(KIND) == 2
    cpu = build_plan(model, BuilderConfig(target="cpu", input_shapes={"x": (1, 7, 768)}, fp32_layers=("fc0", "fc1")))
    outputs = []
    for plan in (gpu, cpu):
        with Runtime(plan.target).deserialize_engine(plan) as engine:
            outputs.append(np.asarray(engine.create_execution_context().execute(feeds)["y"]))
    np.testing.assert_allclose(outputs[0], outputs[1], rtol=1e-4, atol=1e-4)

"""The Hopper channels-last convolution tactics (cuda.conv_nhwc.sm90_*): geometry rules (CPU)
and every tile against the float64 reference, outputs poisoned (GPU, compute capability 9.0)."""

from __future__ import annotations

from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest

from polykit.compiler.ir import POLYKIT_DOMAIN, Node
from polykit.compiler.plan_records import LayerDesc
from polykit.kernels.cuda.conv_sm90 import CONV_TILES, X3_CONV_TILES, plan_conv

rng = np.random.default_rng(23)
BF16 = np.dtype(ml_dtypes.bfloat16)


def test_plan_conv_maps_nhwc_convolutions_onto_the_gemm():
    geo = plan_conv({"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}, (2, 9, 9, 16), (24, 3, 3, 16),
                    (2, 5, 5, 24))
    assert (geo.M, geo.N, geo.K) == (2 * 5 * 5, 24, 9 * 16)
    assert geo.strides == (2, 2) and geo.pads == (1, 1) and geo.dilations == (1, 1)


@pytest.mark.parametrize("x,w,attrs", [((1, 8, 8, 12), (8, 3, 3, 12), {}),          # C not a multiple of 8
                                       ((1, 8, 8, 16), (8, 3, 3, 8), {"group": 2}),  # grouped
                                       ((1, 8, 16), (8, 3, 16), {})])                # 1-D
def test_plan_conv_declines_what_the_kernel_cannot_take(x, w, attrs):
    assert plan_conv(attrs, x, w, (1, 6, 6, 8)) is None


def require_sm90():
    from tests.kernels.cuda import on_sm90

    if not on_sm90():
        pytest.skip("needs a compute capability 9.0 GPU")


def rand(shape, dtype):
    return rng.standard_normal(shape).astype(np.float32).astype(dtype)


def run_case(tile, x, w, attrs, dtype, epilogue=None, extra=None, precision="fp16", prefix="sm90"):
    from polykit.kernels.registry import run_reference
    from polykit.runtime.cuda.harness import infer_output_specs, run_layer

    inputs = {"X": rand(x, dtype), "W": rand(w, dtype), "B": rand((w[0],), dtype)}
    names = ("X", "W", "B")
    if extra:
        inputs.update(extra)
        names += tuple(extra)
    attrs = dict(attrs, kernel_shape=list(w[1:3]))
    if epilogue:
        attrs["epilogue"] = epilogue
    layer = LayerDesc("conv", "ConvNHWC", names, ("Y",), attrs, domain=POLYKIT_DOMAIN, precision=precision)
    specs = infer_output_specs(layer, inputs)
    layer = replace(layer, in_dtypes=tuple(np.dtype(inputs[n].dtype).name for n in names),
                    out_dtypes=(np.dtype(dtype).name,), in_shapes=tuple(tuple(inputs[n].shape) for n in names),
                    out_shapes=(specs["Y"][0],))
    out = run_layer(layer, inputs, tactic=f"cuda.conv_nhwc.{prefix}_{tile.label}", output_specs=specs)["Y"]
    node = Node("ConvNHWC", list(names), ["Y"], dict(layer.attrs), "conv", POLYKIT_DOMAIN)
    ref = run_reference(node, [inputs[n].astype(np.float64) for n in names])[0]
    out = np.asarray(out, np.float64)
    assert not np.isnan(out).any(), "unwritten (NaN) elements"
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


CASES = [  # (x NHWC, w KRSC, attrs)
    ((2, 9, 11, 8), (5, 3, 3, 8), {"pads": [1, 1, 1, 1]}),
    ((1, 13, 10, 16), (9, 3, 2, 16), {"strides": [2, 3], "pads": [0, 1, 2, 0], "dilations": [2, 1]}),
    ((2, 8, 8, 24), (70, 1, 1, 24), {}),
    ((3, 7, 7, 64), (136, 3, 3, 64), {"pads": [1, 1, 1, 1]}),
    ((2, 28, 28, 64), (256, 1, 1, 64), {}),
    ((1, 17, 16, 8), (16, 7, 7, 8), {"strides": [2, 2], "pads": [3, 3, 3, 3]}),  # the padded stem
    ((2, 15, 15, 128), (64, 3, 3, 128), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
]


@pytest.mark.gpu
@pytest.mark.parametrize("tile", CONV_TILES, ids=lambda t: t.label)
@pytest.mark.parametrize("x,w,attrs", CASES)
def test_sm90_conv_matches_float64_reference(tile, x, w, attrs):
    require_sm90()
    assert run_case(tile, x, w, attrs, np.float16) <= 2e-3


@pytest.mark.gpu
@pytest.mark.parametrize("tile", CONV_TILES, ids=lambda t: t.label)
@pytest.mark.parametrize("x,w,attrs", CASES)
def test_sm90_conv_tf32_matches_float64_reference(tile, x, w, attrs):
    """float32 storage, tf32 math (the operands' low 13 mantissa bits ignored): 4 channels a chunk."""
    require_sm90()
    assert run_case(tile, x, w, attrs, np.float32, precision="tf32") <= 3e-3


@pytest.mark.gpu
@pytest.mark.parametrize("tile", X3_CONV_TILES, ids=lambda t: t.label)
@pytest.mark.parametrize("x,w,attrs", CASES)
def test_sm90x3_conv_has_fp32_accuracy(tile, x, w, attrs):
    """float32 layers of precision fp32 on tf32 tensor cores, each operand split in two (3xTF32):
    the error stays at float32's level (tf32 alone: ~1e-3)."""
    require_sm90()
    assert run_case(tile, x, w, attrs, np.float32, precision="fp32", prefix="sm90x3") <= 2e-6


def test_sm90_conv_takes_float32_as_tf32_or_fp32_by_tactic():
    from polykit.kernels.cuda.conv_sm90 import _supports

    attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    base = LayerDesc("conv", "ConvNHWC", ("X", "W", "B"), ("Y",), attrs, domain=POLYKIT_DOMAIN,
                     in_dtypes=("float32",) * 3, out_dtypes=("float32",),
                     in_shapes=((1, 8, 8, 16), (32, 3, 3, 16), (32,)), out_shapes=((1, 8, 8, 32),))
    tf32, x3 = _supports(CONV_TILES[0], False), _supports(X3_CONV_TILES[0], True)
    assert tf32(replace(base, precision="tf32")) and not tf32(replace(base, precision="fp32"))
    assert x3(replace(base, precision="fp32")) and not x3(replace(base, precision="tf32"))
    half = replace(base, precision="fp16", in_dtypes=("float16",) * 3, out_dtypes=("float16",))
    assert not x3(half) and tf32(half)


@pytest.mark.gpu
def test_sm90_conv_bf16():
    require_sm90()
    assert run_case(CONV_TILES[0], (2, 9, 11, 16), (24, 3, 3, 16), {"pads": [1, 1, 1, 1]}, BF16) <= 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("tile", CONV_TILES[:2], ids=lambda t: t.label)
def test_sm90_conv_with_residual_relu_epilogue(tile):
    require_sm90()
    body = [{"op": "Add", "inputs": ["raw", "skip"], "outputs": ["s"], "attrs": {}},
            {"op": "Relu", "inputs": ["s"], "outputs": ["Y"], "attrs": {}}]
    extra = {"skip": rand((2, 14, 14, 96), np.float16)}
    err = run_case(tile, (2, 14, 14, 32), (96, 3, 3, 32), {"pads": [1, 1, 1, 1]}, np.float16,
                   epilogue={"input": "raw", "body": body}, extra=extra)
    assert err <= 2e-3

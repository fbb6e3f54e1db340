"""GPU: the channels-last tactics (ConvNHWC, MaxPoolNHWC, AveragePoolNHWC) against the reference
kernels, outputs poisoned first."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.plan.records import LayerDesc

pytestmark = pytest.mark.gpu

rng = np.random.default_rng(17)
SIMT, MMA = "cuda.conv_nhwc.igemm_simt", "cuda.conv_nhwc.igemm_mma"


def rand(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def check(layer, inputs, tactic=None, **tol):
    from polykit.runtime.cuda.harness import assert_matches_reference

    return assert_matches_reference(layer, inputs, tactic=tactic, **tol)


def conv_layer(attrs, inputs=("X", "W", "B"), precision="fp32", epilogue=None):
    attrs = dict(attrs, epilogue=epilogue) if epilogue else attrs
    return LayerDesc("conv", "ConvNHWC", inputs, ("Y",), attrs, domain=POLYKIT_DOMAIN, precision=precision)


def conv_inputs(x, w, dtype=np.float32):
    """NHWC X (N, H, W, C) and KRSC W (M, kH, kW, C/group), with a bias."""
    return {"X": rand(*x, dtype=dtype), "W": rand(*w, dtype=dtype), "B": rand(w[0], dtype=dtype)}


# (x NHWC, w KRSC, attrs): C of 8 / 16 / 24 as to_channels_last makes them, odd spatial sizes and M
CASES = [
    ((1, 1, 1, 8), (1, 1, 1, 8), {}),
    ((2, 9, 11, 8), (5, 3, 3, 8), {"pads": [1, 1, 1, 1]}),
    ((1, 13, 10, 16), (9, 3, 2, 16), {"strides": [2, 3], "pads": [0, 1, 2, 0], "dilations": [2, 1]}),
    ((2, 8, 8, 24), (70, 1, 1, 24), {}),
    ((1, 15, 15, 16), (33, 3, 3, 16), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 17, 16, 8), (16, 7, 7, 8), {"strides": [2, 2], "pads": [3, 3, 3, 3]}),  # a padded 3-channel stem
]
# few output tiles, deep reductions: split K (gemm.split_k)
SPLIT_CASES = [
    ((1, 5, 5, 96), (40, 3, 3, 96), {"pads": [1, 1, 1, 1]}),
    ((1, 3, 4, 136), (7, 3, 3, 136), {"strides": [2, 1], "pads": [1, 0, 1, 2]}),
]


@pytest.mark.parametrize("tactic", [SIMT, SIMT + "_wide"])
@pytest.mark.parametrize("x,w,attrs", CASES + SPLIT_CASES)
def test_igemm_simt_matches_reference(x, w, attrs, tactic):
    check(conv_layer(attrs), conv_inputs(x, w), tactic, rtol=1e-4, atol=2e-4)


@pytest.mark.parametrize("x,w,attrs", CASES + SPLIT_CASES)
def test_igemm_mma_matches_reference(x, w, attrs):
    check(conv_layer(attrs, precision="fp16"), conv_inputs(x, w), MMA, rel=3e-3)


@pytest.mark.parametrize("tactic,precision", [(SIMT, "fp32"), (MMA, "fp16")])
def test_half_storage_without_bias(tactic, precision):
    inputs = conv_inputs((2, 12, 12, 16), (6, 3, 3, 16), dtype=np.float16)
    del inputs["B"]
    check(conv_layer({"pads": [1, 1, 1, 1]}, ("X", "W"), precision), inputs, tactic, rel=2e-3)


def test_grouped_conv_on_the_simt_tactic():
    check(conv_layer({"group": 2, "pads": [1, 1, 1, 1]}), conv_inputs((1, 7, 9, 16), (12, 3, 3, 8)), SIMT,
          rtol=1e-4, atol=1e-4)


EPI_BODY = [{"op": "Add", "inputs": ["raw", "skip"], "outputs": ["s"], "attrs": {}},
            {"op": "Relu", "inputs": ["s"], "outputs": ["Y"], "attrs": {}}]


# (x, w, attrs, skip shape): a residual of the output's shape, per-channel, and broadcasts over pixels
EPI_CASES = [
    ((2, 7, 9, 16), (24, 3, 3, 16), {"pads": [1, 1, 1, 1]}, (2, 7, 9, 24)),
    ((2, 7, 9, 16), (24, 3, 3, 16), {"pads": [1, 1, 1, 1]}, (24,)),
    ((2, 7, 9, 16), (24, 3, 3, 16), {"pads": [1, 1, 1, 1]}, (1, 7, 1, 24)),
    ((2, 7, 9, 16), (24, 3, 3, 16), {"pads": [1, 1, 1, 1]}, (2, 1, 9, 1)),
    ((1, 11, 9, 8), (13, 3, 3, 8), {"strides": [2, 2], "pads": [2, 2, 2, 2], "dilations": [2, 2]}, (1, 6, 5, 13)),
]


@pytest.mark.parametrize("tactic,precision", [(SIMT, "fp32"), (MMA, "fp16")])
@pytest.mark.parametrize("x,w,attrs,skip_shape", EPI_CASES)
def test_residual_relu_epilogue_reads_nhwc_extra_inputs(tactic, precision, x, w, attrs, skip_shape):
    layer = conv_layer(attrs, ("X", "W", "B", "skip"), precision, epilogue={"input": "raw", "body": EPI_BODY})
    tol = {"rel": 3e-3} if precision == "fp16" else {"rtol": 1e-4, "atol": 1e-4}
    check(layer, {**conv_inputs(x, w), "skip": rand(*skip_shape)}, tactic, **tol)


def test_split_k_with_a_residual_epilogue_applies_it_once():
    layer = conv_layer({"pads": [1, 1, 1, 1]}, ("X", "W", "B", "skip"), epilogue={"input": "raw", "body": EPI_BODY})
    check(layer, {**conv_inputs((1, 5, 5, 96), (40, 3, 3, 96)), "skip": rand(1, 5, 5, 40)}, SIMT, rtol=1e-4, atol=2e-4)


POOLS = [
    ((1, 1, 1, 8), {"kernel_shape": [1, 1]}),
    ((2, 9, 11, 24), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 10, 7, 16), {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1}),
    ((1, 8, 8, 5), {"kernel_shape": [2, 2], "dilations": [2, 2], "pads": [1, 0, 0, 1]}),
]


@pytest.mark.parametrize("kind", ["MaxPoolNHWC", "AveragePoolNHWC"])
@pytest.mark.parametrize("shape,attrs", POOLS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_window_pool_nhwc_matches_reference(kind, shape, attrs, dtype):
    layer = LayerDesc("pool", kind, ("X",), ("Y",), dict(attrs), domain=POLYKIT_DOMAIN)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == np.float32 else {"rtol": 1e-3, "atol": 1e-3}
    check(layer, {"X": rand(*shape, dtype=dtype)}, "cuda.pool_nhwc.window", **tol)


@pytest.mark.parametrize("shape,attrs", POOLS[1:])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_average_pool_nhwc_counting_pads_matches_reference(shape, attrs, dtype):
    layer = LayerDesc("pool", "AveragePoolNHWC", ("X",), ("Y",), dict(attrs, count_include_pad=1),
                      domain=POLYKIT_DOMAIN)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == np.float32 else {"rtol": 1e-3, "atol": 1e-3}
    check(layer, {"X": rand(*shape, dtype=dtype)}, "cuda.pool_nhwc.window", **tol)


# 8-bit max pools (between INT8 layers): C % 16 == 0 takes the 16-channel kernel, the rest the scalar one
INT8_POOLS = [((2, 9, 9, 32), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),  # ResNet's
              ((1, 7, 6, 48), {"kernel_shape": [2, 3], "pads": [0, 1, 1, 0], "dilations": [2, 1]}),
              ((1, 6, 5, 24), {"kernel_shape": [3, 3], "strides": [2, 1], "pads": [1, 1, 1, 1]})]


@pytest.mark.parametrize("shape,attrs", INT8_POOLS)
@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_max_pool_nhwc_on_8_bit_integers_equals_the_reference_exactly(shape, attrs, dtype):
    layer = LayerDesc("pool", "MaxPoolNHWC", ("X",), ("Y",), dict(attrs), domain=POLYKIT_DOMAIN)
    info = np.iinfo(dtype)
    x = rng.integers(info.min, int(info.max) + 1, size=shape).astype(dtype)
    check(layer, {"X": x}, "cuda.pool_nhwc.window", rtol=0, atol=0)

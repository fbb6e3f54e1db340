"""GPU: the pooling tactics against the reference kernels, outputs poisoned first."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.plan.records import LayerDesc

pytestmark = pytest.mark.gpu

rng = np.random.default_rng(5)


def rand(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def check(layer, inputs, tactic=None, **tol):
    from polykit.runtime.cuda.harness import assert_matches_reference

    return assert_matches_reference(layer, inputs, tactic=tactic, **tol)


WINDOWS = [
    ((1, 1, 1, 1), {"kernel_shape": [1, 1]}),
    ((2, 3, 9, 11), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 4, 10, 7), {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1}),
    ((1, 2, 8, 8), {"kernel_shape": [2, 2], "dilations": [2, 2], "auto_pad": "SAME_LOWER"}),
    ((3, 2, 15), {"kernel_shape": [4], "strides": [3], "pads": [2, 1]}),
    ((1, 2, 5, 6, 7), {"kernel_shape": [2, 3, 2], "strides": [1, 2, 2], "pads": [0, 1, 1, 1, 0, 1]}),
]


@pytest.mark.parametrize("kind", ["MaxPool", "AveragePool", "LpPool"])
@pytest.mark.parametrize("shape,attrs", WINDOWS)
def test_window_pool_matches_reference(kind, shape, attrs):
    check(LayerDesc("pool", kind, ("X",), ("Y",), dict(attrs)), {"X": rand(*shape)}, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape,attrs", WINDOWS[1:4])
def test_average_pool_counting_pads_matches_reference(shape, attrs):
    layer = LayerDesc("pool", "AveragePool", ("X",), ("Y",), dict(attrs, count_include_pad=1))
    check(layer, {"X": rand(*shape)}, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape,attrs", WINDOWS[1:3])
def test_max_pool_indices_match_reference(shape, attrs):
    layer = LayerDesc("pool", "MaxPool", ("X",), ("Y", "I"), dict(attrs))
    check(layer, {"X": rand(*shape)}, rtol=0, atol=0)


@pytest.mark.parametrize("shape,attrs", [WINDOWS[1], WINDOWS[2], WINDOWS[4], WINDOWS[5]])
def test_max_pool_column_major_indices_match_reference(shape, attrs):
    layer = LayerDesc("pool", "MaxPool", ("X",), ("Y", "I"), dict(attrs, storage_order=1))
    check(layer, {"X": rand(*shape)}, rtol=0, atol=0)


def test_lp_pool_with_p3_and_fp16_storage():
    layer = LayerDesc("pool", "LpPool", ("X",), ("Y",), {"kernel_shape": [3, 3], "p": 3})
    check(layer, {"X": rand(2, 3, 7, 7, dtype=np.float16)}, rel=2e-3)


@pytest.mark.parametrize("kind", ["GlobalMaxPool", "GlobalAveragePool", "GlobalLpPool"])
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (2, 3, 7, 9), (1, 5, 1000), (2, 2, 3, 4, 5)])
def test_global_pool_matches_reference(kind, shape):
    check(LayerDesc("pool", kind, ("X",), ("Y",), {}), {"X": rand(*shape)}, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("shape,attrs", WINDOWS[1:3])
def test_max_pool_on_8bit_integers_matches_reference(dtype, shape, attrs):
    x = rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max, size=shape).astype(dtype)
    check(LayerDesc("pool", "MaxPool", ("X",), ("Y",), dict(attrs)), {"X": x}, rtol=0, atol=0)


#: 3x3 windows, which the 16-byte channels-last kernels unroll: ResNet's stem pool, a dilated one with
#: uneven pads, one whose ceil_mode windows hang past the input, and windows mostly in the padding
UNROLLED_3X3 = [((2, 15, 13, 16), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
                ((1, 9, 8, 32), {"dilations": [2, 2], "pads": [2, 0, 1, 2]}),
                ((3, 8, 10, 16), {"strides": [2, 3], "ceil_mode": 1}),
                ((1, 2, 2, 16), {"pads": [2, 2, 0, 0]})]


@pytest.mark.parametrize("kind", ["MaxPoolNHWC", "AveragePoolNHWC"])
@pytest.mark.parametrize("shape,attrs", UNROLLED_3X3)
def test_unrolled_3x3_nhwc_pools_on_16_bit_storage_match_reference(kind, shape, attrs):
    from polykit.compiler.ir.graph import POLYKIT_DOMAIN

    layer = LayerDesc("pool", kind, ("X",), ("Y",), dict(attrs, kernel_shape=[3, 3]), domain=POLYKIT_DOMAIN)
    check(layer, {"X": rand(*shape, dtype=np.float16)}, tactic="cuda.pool_nhwc.window", rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("shape,attrs", UNROLLED_3X3)
def test_unrolled_3x3_nhwc_max_pool_on_int8_equals_the_reference(shape, attrs):
    from polykit.compiler.ir.graph import POLYKIT_DOMAIN

    layer = LayerDesc("pool", "MaxPoolNHWC", ("X",), ("Y",), dict(attrs, kernel_shape=[3, 3]), domain=POLYKIT_DOMAIN)
    check(layer, {"X": rng.integers(-128, 128, size=shape).astype(np.int8)}, tactic="cuda.pool_nhwc.window",
          rtol=0, atol=0)


@pytest.mark.parametrize("shape,attrs", [((2, 9, 11, 32), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
                                         ((2, 5, 8, 24), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [2, 2, 2, 2]})],
                         ids=["v16", "bytes"])
def test_nhwc_max_pool_on_e4m3_equals_the_reference(shape, attrs):
    """float8_e4m3fn (an FP8 plan's pool: pool.cu's byte keys), every finite code among the inputs (the NaNs'
    bytes: the emulated test, tests/kernels/cuda/test_pool_e4m3_emulated.py), the 16-channel and the byte kernel."""
    from polykit.compiler.ir.graph import POLYKIT_DOMAIN

    e4m3 = pytest.importorskip("ml_dtypes").float8_e4m3fn
    codes = rng.integers(0, 256, size=shape, dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x7E  # no NaN: the harness compares values
    layer = LayerDesc("pool", "MaxPoolNHWC", ("X",), ("Y",), attrs, domain=POLYKIT_DOMAIN)
    check(layer, {"X": codes.view(e4m3)}, tactic="cuda.pool_nhwc.window", rtol=0, atol=0)

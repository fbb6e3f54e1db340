"""Quantize family: parameter geometry on the host, and on the GPU per-tensor / per-axis / blocked
(de)quantization and DynamicQuantizeLinear against the reference (outputs poisoned)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.int8 import quantize as qk

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)

rng = np.random.default_rng(59)


def check(layer, inputs, **tol):
    from polykit.runtime.cuda.harness import assert_matches_reference

    return assert_matches_reference(layer, inputs, **(tol or {"rtol": 0, "atol": 0}))


def test_param_geometry_per_tensor_axis_and_block():
    assert qk.param_geometry({}, (2, 3, 4), ()) == [0, 1, 1, 1, 1]
    assert qk.param_geometry({"axis": 1}, (2, 3, 4), (1,)) == [0, 1, 1, 1, 1]
    assert qk.param_geometry({"axis": 1}, (2, 3, 4), (3,)) == [1, 4, 3, 1, 1]
    assert qk.param_geometry({"axis": -1, "block_size": 2}, (2, 3, 5), (2, 3, 3)) == [2, 1, 5, 2, 3]


def test_param_geometry_matches_the_reference_broadcast():
    """The kernel's index formula, run with numpy, picks the same scale per element as the reference."""
    x_shape, p_shape, attrs = (2, 6, 3), (2, 2, 3), {"axis": 1, "block_size": 4}
    mode, inner, d, block, dp = qk.param_geometry(attrs, x_shape, p_shape)
    i = np.arange(int(np.prod(x_shape)))
    q = i // inner
    o, dd, inn = q // d, q % d, i % inner
    idx = (o * dp + dd // block) * inner + inn
    p = rng.standard_normal(p_shape)
    want = np.repeat(p, 4, axis=1)[:, :6, :]
    np.testing.assert_array_equal(p.reshape(-1)[idx].reshape(x_shape), want)


def _q_layer(kind, n_inputs=3, **attrs):
    return LayerDesc("q", kind, ("X", "S", "Z")[:n_inputs], ("Y",), dict(attrs))


@pytest.mark.gpu
@pytest.mark.parametrize("zp_dtype", [np.uint8, np.int8, np.int16, np.uint16])
def test_quantize_per_tensor_saturates_and_rounds_half_to_even(zp_dtype):
    x = rng.standard_normal((3, 50)).astype(np.float32) * 300
    x[0, :6] = [0.5, 1.5, 2.5, -0.5, -1.5, 1e9]  # ties to even, saturation
    inputs = {"X": x, "S": np.array(1.0, np.float32), "Z": np.array(3, zp_dtype)}
    check(_q_layer("QuantizeLinear"), inputs)


@pytest.mark.gpu
@pytest.mark.parametrize("zp_dtype", [np.int8, np.uint8, None])
def test_quantize_of_a_float32_image_takes_four_elements_a_thread_and_equals_the_reference(zp_dtype):
    """quantize_f32_8bit (float32 x and scale per tensor, 8-bit output, x.size % 4 == 0): quotients on
    ties, past both saturation bounds and infinities, and a scale that makes every quotient inexact."""
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32) * 40
    s = np.float32(0.37)
    x.reshape(-1)[:12] = np.float32([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 1e9, -1e9, np.inf, -np.inf, 127.5, 126.5]) * s
    inputs = {"X": x, "S": np.array(s)}
    if zp_dtype is not None:
        inputs["Z"] = np.array(-3 if zp_dtype == np.int8 else 120, zp_dtype)
    layer = _q_layer("QuantizeLinear", len(inputs))
    assert qk.ENTRIES[1] == "quantize_f32_8bit"
    check(layer, inputs)


@pytest.mark.gpu
def test_quantize_without_zero_point_gives_uint8():
    x = rng.uniform(-2, 300, size=(4, 7)).astype(np.float32)
    check(_q_layer("QuantizeLinear", 2), {"X": x, "S": np.array(0.7, np.float32)})


@pytest.mark.gpu
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_quantize_per_axis_matches_reference(axis):
    x = rng.standard_normal((3, 4, 5)).astype(np.float32) * 10
    n = x.shape[axis]
    inputs = {"X": x, "S": rng.uniform(0.05, 0.2, n).astype(np.float32), "Z": rng.integers(-5, 5, n).astype(np.int8)}
    check(_q_layer("QuantizeLinear", axis=axis), inputs)


@pytest.mark.gpu
def test_quantize_blocked_matches_reference():
    x = rng.standard_normal((2, 7, 3)).astype(np.float32) * 10
    inputs = {"X": x, "S": rng.uniform(0.05, 0.2, (2, 2, 3)).astype(np.float32),
              "Z": rng.integers(0, 9, (2, 2, 3)).astype(np.uint8)}
    check(_q_layer("QuantizeLinear", axis=1, block_size=4), inputs)


@pytest.mark.gpu
def test_quantize_fp16_divides_in_fp16_and_fp32_input_with_fp16_scale():
    x = rng.standard_normal((5, 40)).astype(np.float32) * 40
    inputs = {"X": x, "S": np.array(0.3, np.float16), "Z": np.array(-2, np.int8)}
    check(_q_layer("QuantizeLinear"), inputs)
    check(_q_layer("QuantizeLinear"), dict(inputs, X=x.astype(np.float16)))


@pytest.mark.gpu
@pytest.mark.parametrize("x_dtype", [np.int8, np.uint8, np.int16, np.uint16])
@pytest.mark.parametrize("s_dtype", [np.float32, np.float16, np.float64])
def test_dequantize_per_tensor_matches_reference(x_dtype, s_dtype):
    info = np.iinfo(x_dtype)
    x = rng.integers(info.min, info.max, size=(3, 33)).astype(x_dtype)
    inputs = {"X": x, "S": np.array(0.037, s_dtype), "Z": np.array(7, x_dtype)}
    check(_q_layer("DequantizeLinear"), inputs)


@pytest.mark.gpu
def test_dequantize_int32_per_axis_without_zero_point():
    x = rng.integers(-10 ** 6, 10 ** 6, size=(4, 6)).astype(np.int32)
    inputs = {"X": x, "S": rng.uniform(0.01, 0.1, 6).astype(np.float32)}
    check(_q_layer("DequantizeLinear", 2, axis=1), inputs)


@pytest.mark.gpu
def test_dequantize_blocked_matches_reference():
    x = rng.integers(-128, 127, size=(4, 10)).astype(np.int8)
    inputs = {"X": x, "S": rng.uniform(0.01, 0.1, (4, 3)).astype(np.float32),
              "Z": rng.integers(-3, 3, (4, 3)).astype(np.int8)}
    check(_q_layer("DequantizeLinear", axis=1, block_size=4), inputs)


@pytest.mark.gpu
@pytest.mark.parametrize("shape,lo,hi", [((3, 1000), -2.0, 5.0), ((100_000,), 0.5, 3.0), ((7, 9), -4.0, -1.0)])
def test_dynamic_quantize_matches_reference(shape, lo, hi):
    x = rng.uniform(lo, hi, size=shape).astype(np.float32)
    layer = LayerDesc("dq", "DynamicQuantizeLinear", ("X",), ("Y", "S", "Z"), {})
    check(layer, {"X": x})


@pytest.mark.gpu
@pytest.mark.parametrize("zp", [np.int8(-3), np.uint8(120), np.int8(0), np.zeros((), E4M3)],
                         ids=["int8", "uint8", "int8_zero", "e4m3"])
@pytest.mark.parametrize("channels", [16, 3, 6], ids=["pad16", "no_pad", "pad6_bytewise"])
def test_quantize_nhwc_of_an_image_equals_the_reference(zp, channels):
    """ai.polykit QuantizeNHWC (quantize_nhwc): float32 NCHW -> 8-bit NHWC with the channels past X's
    filled with the zero point; word stores (16, 3 channels: none padded) and byte stores (6); e4m3 (an --fp8
    plan's image): the quotient rounded to nearest even, saturated (1e9, inf: 448)."""
    x = rng.standard_normal((2, 3, 13, 11)).astype(np.float32) * 4
    s = np.float32(0.031)
    x.reshape(-1)[:8] = np.float32([0.5, 1.5, -2.5, 1e9, -1e9, np.inf, 127.5, -128.5]) * s
    layer = LayerDesc("q", "QuantizeNHWC", ("X", "S", "Z"), ("Y",), {"channels": channels}, domain="ai.polykit")
    check(layer, {"X": x, "S": np.array(s), "Z": np.array(zp)})


@pytest.mark.gpu
@pytest.mark.parametrize("zp", [np.int8(5), np.zeros((), E4M3)], ids=["int8", "e4m3"])
@pytest.mark.parametrize("c, channels", [(3, 16), (2, 32), (5, 32), (17, 32), (7, 20)],
                         ids=["image_pad16", "image_pad32", "pad32_zero_group", "two_groups_of_x", "pad20_bytewise"])
def test_quantize_nhwc_over_several_pixel_blocks_and_a_ragged_tail_equals_the_reference(c, channels, zp):
    """quantize_nhwc / quantize_nhwc_image (C <= 3, 16-byte stores), 8 pixels a thread: 3 images of 53 x 47
    pixels (2491: one full 2048-pixel block and a tail where threads own 1 or 2 pixels), 16-channel groups
    of X's channels, of zero points only, and a byte-stored group of 4 (20 channels)."""
    x = rng.uniform(-6, 6, (3, c, 53, 47)).astype(np.float32)
    s = np.float32(0.047)
    x.reshape(-1)[-6:] = np.float32([0.5, 1.5, -2.5, 126.5, -127.5, 1e6]) * s
    layer = LayerDesc("q", "QuantizeNHWC", ("X", "S", "Z"), ("Y",), {"channels": channels}, domain="ai.polykit")
    check(layer, {"X": x, "S": np.array(s), "Z": np.array(zp)})


@pytest.mark.gpu
@pytest.mark.parametrize("zp", [np.int8(-4), np.uint8(133), np.zeros((), E4M3)], ids=["int8", "uint8", "e4m3"])
@pytest.mark.parametrize("shape, block, pads, channels, shift", [
    ((2, 3, 29, 27), 2, [3, 3, 4, 4], 16, 0), ((3, 3, 83, 79), 2, [3, 3, 0, 0], 16, 0),
    ((1, 1, 13, 10), 4, [1, 2, 2, 0], 16, 0), ((2, 5, 9, 7), 2, [0, 1, 1, 0], 20, 0),
    ((1, 3, 12, 9), 4, [2, 3, 2, 0], 48, 0), ((2, 3, 11, 9), 2, [1, 3, 0, 0], 16, 1)],
    ids=["resnet_stem", "several_blocks", "s4_c1", "c5_bytewise", "s4_three_groups", "misaligned"])
def test_quantize_nhwc_with_block_and_pads_equals_the_reference_bit_for_bit(zp, shape, block, pads, channels, shift):
    """quantize_nhwc_s2d (QuantizeNHWC with `block` / `pads`: a space-to-depth stem's image): the padded,
    space-to-depth'd, quantized NHWC bytes of the reference, outputs poisoned; 16-byte group stores, byte stores
    (20 channels, an output 1 byte off alignment); ties, saturation, infinities and a NaN among the values."""
    from polykit.runtime.cuda.harness import reference_layer, run_layer

    s = np.float32(0.029)
    x = rng.uniform(-200, 200, shape).astype(np.float32) * s
    x.reshape(-1)[:10] = np.float32([0.5, 1.5, -2.5, 127.5, -128.5, 1e9, np.inf, -np.inf, np.nan, -460.0]) * s
    attrs = {"channels": channels, "block": block, "pads": pads}
    layer = LayerDesc("q", "QuantizeNHWC", ("X", "S", "Z"), ("Y",), attrs, domain="ai.polykit")
    inputs = {"X": x, "S": np.array(s), "Z": np.array(zp)}
    got = run_layer(layer, inputs, misalign={"Y": shift} if shift else None)["Y"]
    want = reference_layer(layer, inputs)["Y"]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))

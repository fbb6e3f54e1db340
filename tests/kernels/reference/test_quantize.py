"""Quantization reference kernels against onnxruntime and hand-computed values."""

from __future__ import annotations

import numpy as np
import onnx


from .oracle import ort_run, ours

RNG = np.random.default_rng(7)


def test_quantize_per_tensor_uint8_matches_onnxruntime():
    x = (RNG.standard_normal((3, 4)) * 20).astype(np.float32)
    inputs = [x, np.array(0.25, np.float32), np.array(128, np.uint8)]
    (got,), (want,) = ours("QuantizeLinear", inputs), ort_run("QuantizeLinear", inputs, opset=13)
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, want)


def test_quantize_per_axis_int8_matches_onnxruntime():
    x = (RNG.standard_normal((2, 3, 4)) * 50).astype(np.float32)
    scale = np.array([0.5, 1.0, 2.0], np.float32)
    zp = np.array([0, -3, 5], np.int8)
    inputs = [x, scale, zp]
    (got,), (want,) = ours("QuantizeLinear", inputs, {"axis": 1}), ort_run("QuantizeLinear", inputs, {"axis": 1}, opset=13)
    assert got.dtype == np.int8
    np.testing.assert_array_equal(got, want)


def test_quantize_rounds_half_to_even_and_saturates():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 1000.0, -1000.0], np.float32)
    (got,) = ours("QuantizeLinear", [x, np.array(1.0, np.float32), np.array(0, np.int8)])
    np.testing.assert_array_equal(got, [0, 2, 2, 0, -2, 127, -128])


def test_quantize_saturates_infinities_and_maps_nan_to_zero_by_polykits_rule():
    """NaN is where ONNX says nothing (onnxruntime gives the type's minimum): polykit's float ->
    integer rule (reference cast.py) applies to rint(x / scale) + zero_point, so NaN -> 0."""
    x = np.array([np.nan, np.inf, -np.inf, 1e30], np.float32)
    (got,) = ours("QuantizeLinear", [x, np.array(1.0, np.float32), np.array(3, np.int8)])
    np.testing.assert_array_equal(got, [0, 127, -128, 127])
    (got,) = ours("QuantizeLinear", [x, np.array(0.0, np.float32), np.array(3, np.uint8)])
    np.testing.assert_array_equal(got, [0, 255, 0, 255])


def test_quantize_without_zero_point_gives_uint8():
    x = np.array([-1.0, 3.0, 300.0], np.float32)
    (got,) = ours("QuantizeLinear", [x, np.array(1.0, np.float32)])
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, [0, 3, 255])


def test_quantize_output_dtype_attribute_without_zero_point():
    x = np.array([-1000.0, 3.0], np.float32)
    (got,) = ours("QuantizeLinear", [x, np.array(1.0, np.float32)], {"output_dtype": onnx.TensorProto.INT16})
    assert got.dtype == np.int16
    np.testing.assert_array_equal(got, [-1000, 3])


def test_quantize_blocked_repeats_scales_along_axis():
    x = np.arange(1, 13, dtype=np.float32).reshape(2, 6)
    scale = np.array([[1.0, 2.0], [4.0, 8.0]], np.float32)  # blocks of 3 along axis 1
    (got,) = ours("QuantizeLinear", [x, scale, np.zeros((2, 2), np.int8)], {"axis": 1, "block_size": 3})
    want = np.rint(x / np.repeat(scale, 3, axis=1)).astype(np.int8)
    np.testing.assert_array_equal(got, want)


def test_dequantize_per_axis_matches_onnxruntime():
    x = RNG.integers(-128, 127, (2, 3, 4)).astype(np.int8)
    scale = np.array([0.5, 0.1, 2.0], np.float32)
    zp = np.array([1, -2, 0], np.int8)
    inputs = [x, scale, zp]
    (got,), (want,) = ours("DequantizeLinear", inputs, {"axis": 1}), \
        ort_run("DequantizeLinear", inputs, {"axis": 1}, opset=13)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_dequantize_output_follows_scale_dtype():
    x = np.array([0, 10, 255], np.uint8)
    (got,) = ours("DequantizeLinear", [x, np.array(0.5, np.float16), np.array(10, np.uint8)])
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, np.array([-5, 0, 122.5], np.float16))


def test_dynamic_quantize_matches_onnxruntime():
    x = (RNG.standard_normal((4, 5)) * 3 + 1).astype(np.float32)
    got = ours("DynamicQuantizeLinear", [x], n_out=3)
    want = ort_run("DynamicQuantizeLinear", [x], opset=11, n_out=3)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-6)


def test_dynamic_quantize_of_all_positive_input_has_zero_point_zero():
    x = np.array([0.5, 1.0, 2.55], np.float32)
    y, scale, zp = ours("DynamicQuantizeLinear", [x], n_out=3)
    assert int(zp) == 0 and y[-1] == 255
    np.testing.assert_allclose(scale, 0.01, rtol=1e-6)


def test_dynamic_quantize_of_both_infinities_is_zero_by_polykits_rule():
    """Both infinities make the scale inf and -min / scale NaN: zero point and values are 0."""
    y, scale, zp = ours("DynamicQuantizeLinear", [np.array([-np.inf, 1.0, np.inf], np.float32)], n_out=3)
    assert np.isinf(scale) and int(zp) == 0
    np.testing.assert_array_equal(y, [0, 0, 0])

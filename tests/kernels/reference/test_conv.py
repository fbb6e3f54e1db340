"""Conv, ConvTranspose and ConvInteger reference kernels, checked against onnxruntime."""

from __future__ import annotations

import time

import numpy as np
import pytest

from polykit.errors import ShapeError

from . import oracle

RNG = np.random.default_rng(11)


def run(op, inputs, **attrs):
    return oracle.run(op, inputs, **attrs)[0]


def ort(op, inputs, opset=21, **attrs):
    return oracle.ort(op, inputs, opset=opset, **attrs)[0]


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def assert_close(ours, theirs, rtol=1e-4, atol=1e-4):
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    np.testing.assert_allclose(ours, theirs, rtol=rtol, atol=atol)


CONV_CASES = {
    "2d_plain": ((2, 3, 9, 8), (4, 3, 3, 3), {}),
    "2d_strided_padded": ((1, 3, 11, 10), (5, 3, 3, 2), {"strides": [2, 3], "pads": [1, 0, 2, 1]}),
    "2d_dilated": ((1, 2, 12, 12), (3, 2, 3, 3), {"dilations": [2, 3], "pads": [2, 2, 2, 2]}),
    "2d_groups": ((2, 6, 7, 7), (9, 2, 3, 3), {"group": 3, "pads": [1, 1, 1, 1]}),
    "2d_depthwise": ((1, 8, 10, 10), (8, 1, 3, 3), {"group": 8, "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "2d_same_upper": ((1, 3, 10, 9), (4, 3, 4, 3), {"auto_pad": "SAME_UPPER", "strides": [3, 2]}),
    "2d_same_lower": ((1, 3, 10, 9), (4, 3, 4, 4), {"auto_pad": "SAME_LOWER", "strides": [2, 2]}),
    "2d_valid": ((1, 3, 10, 9), (2, 3, 3, 3), {"auto_pad": "VALID", "strides": [2, 2]}),
    "1d": ((2, 4, 17), (6, 4, 5), {"strides": [2], "pads": [2, 1], "dilations": [2]}),
    "3d": ((1, 2, 6, 7, 5), (3, 2, 3, 2, 3), {"pads": [1, 0, 1, 1, 1, 0], "strides": [1, 2, 1]}),
    "1x1": ((2, 16, 5, 5), (8, 16, 1, 1), {}),
}


@pytest.mark.parametrize("name", sorted(CONV_CASES))
def test_conv_matches_onnxruntime(name):
    xs, ws, attrs = CONV_CASES[name]
    x, w, b = rand(*xs), rand(*ws), rand(ws[0])
    assert_close(run("Conv", [x, w, b], **attrs), ort("Conv", [x, w, b], **attrs))


def test_conv_without_bias_matches_onnxruntime():
    x, w = rand(1, 3, 8, 8), rand(2, 3, 3, 3)
    assert_close(run("Conv", [x, w], pads=[1, 1, 1, 1]), ort("Conv", [x, w], pads=[1, 1, 1, 1]))


def test_conv_keeps_float16_and_float64_dtypes():
    for dtype in (np.float16, np.float64):
        x, w = rand(1, 2, 6, 6, dtype=dtype), rand(3, 2, 3, 3, dtype=dtype)
        y = run("Conv", [x, w])
        assert y.dtype == dtype
        want = run("Conv", [x.astype(np.float32), w.astype(np.float32)])
        np.testing.assert_allclose(y.astype(np.float32), want, rtol=1e-2, atol=1e-2)


def test_conv_rejects_channels_that_do_not_fit_the_groups():
    with pytest.raises(ShapeError, match="group"):
        run("Conv", [rand(1, 4, 5, 5), rand(4, 3, 3, 3)], group=2)


def test_conv_of_a_rank_2_input_is_a_shape_error():
    with pytest.raises(ShapeError, match="rank"):
        run("Conv", [rand(3, 4), rand(2, 3, 3)])


def test_conv_of_a_resnet_sized_layer_takes_well_under_a_second_of_cpu():
    """The cost of the algorithm (vectorized, ~0.03 s), measured as this process's CPU time after
    a warm-up: wall time also counts other processes on a loaded machine and first-call imports."""
    x, w = rand(1, 64, 56, 56), rand(64, 64, 3, 3)
    run("Conv", [x[:, :, :8, :8], w], pads=[1, 1, 1, 1])
    start = time.process_time()
    run("Conv", [x, w], pads=[1, 1, 1, 1])
    assert time.process_time() - start < 1.0


TRANSPOSE_CASES = {
    "plain": ((1, 2, 4, 5), (2, 3, 3, 3), {}),
    "strided_padded": ((2, 3, 4, 4), (3, 2, 3, 3), {"strides": [2, 2], "pads": [1, 0, 1, 2]}),
    "output_padding": ((1, 2, 5, 4), (2, 2, 3, 3), {"strides": [3, 2], "output_padding": [1, 1]}),
    "dilated": ((1, 2, 4, 4), (2, 3, 2, 3), {"dilations": [2, 3], "strides": [2, 1]}),
    "groups": ((1, 4, 3, 3), (4, 3, 3, 3), {"group": 2, "strides": [2, 2]}),
    "output_shape": ((1, 2, 3, 3), (2, 2, 3, 3), {"strides": [3, 2], "output_shape": [10, 8]}),
    "same_upper": ((1, 2, 3, 4), (2, 2, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    "same_lower": ((1, 2, 3, 4), (2, 2, 4, 3), {"strides": [2, 3], "auto_pad": "SAME_LOWER"}),
    "1d": ((2, 3, 6), (3, 2, 4), {"strides": [2], "pads": [1, 2]}),
    "3d": ((1, 2, 3, 2, 3), (2, 2, 2, 3, 2), {"strides": [2, 1, 2]}),
}


@pytest.mark.parametrize("name", sorted(TRANSPOSE_CASES))
def test_conv_transpose_matches_onnxruntime(name):
    xs, ws, attrs = TRANSPOSE_CASES[name]
    group = attrs.get("group", 1)
    x, w, b = rand(*xs), rand(*ws), rand(ws[1] * group)
    assert_close(run("ConvTranspose", [x, w, b], **attrs), ort("ConvTranspose", [x, w, b], **attrs))


def test_conv_integer_with_zero_points_matches_onnxruntime():
    x = RNG.integers(0, 255, (1, 3, 7, 7), dtype=np.uint8)
    w = RNG.integers(0, 255, (4, 3, 3, 3), dtype=np.uint8)
    x_zp, w_zp = np.array(131, np.uint8), np.array(120, np.uint8)
    attrs = {"pads": [1, 1, 1, 1], "strides": [2, 1]}
    ours = run("ConvInteger", [x, w, x_zp, w_zp], **attrs)
    assert ours.dtype == np.int32
    np.testing.assert_array_equal(ours, ort("ConvInteger", [x, w, x_zp, w_zp], opset=10, **attrs))


def test_conv_integer_pads_with_the_input_zero_point():
    x = np.full((1, 1, 2, 2), 7, np.uint8)
    w = np.ones((1, 1, 3, 3), np.uint8)
    y = run("ConvInteger", [x, w, np.array(7, np.uint8)], pads=[1, 1, 1, 1])
    np.testing.assert_array_equal(y, np.zeros((1, 1, 2, 2), np.int32))

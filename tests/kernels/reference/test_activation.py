"""Activation reference kernels against onnxruntime and closed-form values."""

from __future__ import annotations

import numpy as np
import pytest


from .oracle import ort_run, ours

RNG = np.random.default_rng(7)


FLOAT_CASES = [
    ("Relu", {}), ("LeakyRelu", {"alpha": 0.2}), ("Sigmoid", {}), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}),
    ("HardSwish", {}), ("Tanh", {}), ("Elu", {"alpha": 0.7}), ("Selu", {}), ("Celu", {"alpha": 1.5}),
    ("Gelu", {}), ("Gelu", {"approximate": "tanh"}), ("Softplus", {}), ("Softsign", {}), ("Mish", {}),
    ("ThresholdedRelu", {"alpha": 0.5}), ("Shrink", {"bias": 0.3, "lambd": 0.6}),
]


@pytest.mark.parametrize("op,attrs", FLOAT_CASES, ids=[f"{o}-{a}" for o, a in FLOAT_CASES])
def test_float_activation_matches_onnxruntime(op, attrs):
    x = (RNG.standard_normal((3, 4, 5)) * 3).astype(np.float32)
    (got,), (want,) = ours(op, [x], attrs), ort_run(op, [x], attrs)
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_swish_is_x_times_sigmoid_of_alpha_x():
    x = RNG.standard_normal(10).astype(np.float32)
    (got,) = ours("Swish", [x], {"alpha": 1.7})
    np.testing.assert_allclose(got, x / (1 + np.exp(-1.7 * x.astype(np.float64))), rtol=1e-6)


def test_float16_activation_keeps_float16():
    x = RNG.standard_normal(8).astype(np.float16)
    (got,) = ours("Gelu", [x])
    assert got.dtype == np.float16


def test_sigmoid_and_softplus_stay_finite_for_huge_inputs():
    x = np.array([-1000.0, -50.0, 0.0, 50.0, 1000.0], np.float32)
    (sig,), (sp,) = ours("Sigmoid", [x]), ours("Softplus", [x])
    np.testing.assert_allclose(sig, [0, 1.9287e-22, 0.5, 1, 1], rtol=1e-4)
    np.testing.assert_allclose(sp, [0, 1.9287e-22, np.log(2), 50, 1000], rtol=1e-4)


def test_relu_keeps_integer_dtype():
    x = np.array([-3, -1, 0, 2, 5], np.int8)
    (got,) = ours("Relu", [x])
    assert got.dtype == np.int8
    np.testing.assert_array_equal(got, [0, 0, 0, 2, 5])


def test_prelu_broadcasts_per_channel_slope():
    x = RNG.standard_normal((2, 3, 4, 4)).astype(np.float32)
    slope = RNG.uniform(0.1, 0.5, (3, 1, 1)).astype(np.float32)
    (got,), (want,) = ours("PRelu", [x, slope]), ort_run("PRelu", [x, slope], opset=16)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_clip_with_both_bounds_matches_onnxruntime():
    x = RNG.standard_normal((4, 5)).astype(np.float32)
    lo, hi = np.array(-0.5, np.float32), np.array(0.7, np.float32)
    (got,), (want,) = ours("Clip", [x, lo, hi]), ort_run("Clip", [x, lo, hi], opset=13)
    np.testing.assert_array_equal(got, want)


def test_clip_with_only_max_leaves_low_values():
    x = np.array([-9.0, 0.5, 9.0], np.float32)
    (got,) = ours("Clip", [x, None, np.array(1.0, np.float32)])
    np.testing.assert_array_equal(got, [-9.0, 0.5, 1.0])


def test_clip_on_int32_keeps_dtype():
    x = np.array([-100, -3, 4, 100], np.int32)
    (got,) = ours("Clip", [x, np.array(-5, np.int32), np.array(5, np.int32)])
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, [-5, -3, 4, 5])


def test_clip_with_min_above_max_gives_max_everywhere():
    x = np.array([-2.0, 0.0, 3.0], np.float32)
    (got,) = ours("Clip", [x, np.array(2.0, np.float32), np.array(1.0, np.float32)])
    np.testing.assert_array_equal(got, [1.0, 1.0, 1.0])

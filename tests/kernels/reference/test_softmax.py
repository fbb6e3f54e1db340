"""Softmax / LogSoftmax / Hardmax reference kernels against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest


from .oracle import ort_run, ours

RNG = np.random.default_rng(7)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_softmax_family_matches_onnxruntime_on_each_axis(op, axis):
    x = (RNG.standard_normal((3, 4, 5)) * 4).astype(np.float32)
    (got,), (want,) = ours(op, [x], {"axis": axis}), ort_run(op, [x], {"axis": axis}, opset=13)
    assert got.dtype == x.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_softmax_defaults_to_last_axis():
    x = RNG.standard_normal((2, 6)).astype(np.float32)
    (got,) = ours("Softmax", [x])
    np.testing.assert_allclose(got.sum(axis=-1), 1.0, rtol=1e-6)


def test_softmax_is_stable_for_large_logits():
    x = np.array([[1000.0, 1001.0, 1002.0]], np.float32)
    (sm,), (lsm,) = ours("Softmax", [x]), ours("LogSoftmax", [x])
    np.testing.assert_allclose(sm, [[0.09003057, 0.24472847, 0.66524096]], rtol=1e-6)
    np.testing.assert_allclose(lsm, [[-2.40760596, -1.40760596, -0.40760596]], rtol=1e-6)


def test_hardmax_marks_only_the_first_of_tied_maxima():
    x = np.array([[3.0, 7.0, 7.0, 1.0]], np.float32)
    (got,) = ours("Hardmax", [x])
    np.testing.assert_array_equal(got, [[0, 1, 0, 0]])


def test_softmax_float16_keeps_dtype():
    x = RNG.standard_normal((2, 5)).astype(np.float16)
    (got,) = ours("Softmax", [x])
    assert got.dtype == np.float16


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
def test_softmax_family_of_an_empty_tensor_is_empty(op):
    (got,) = ours(op, [np.zeros((0, 4), np.float32)], {"axis": 0})
    assert got.shape == (0, 4) and got.dtype == np.float32

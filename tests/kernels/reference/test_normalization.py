"""Normalization reference kernels against onnxruntime and their defining formulas."""

from __future__ import annotations

import numpy as np
import pytest


from .oracle import ort_run, ours

RNG = np.random.default_rng(7)


def _params(c):
    return RNG.uniform(0.5, 1.5, c).astype(np.float32), RNG.standard_normal(c).astype(np.float32)


def test_batchnorm_inference_matches_onnxruntime():
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    scale, bias = _params(3)
    mean, var = RNG.standard_normal(3).astype(np.float32), RNG.uniform(0.5, 2, 3).astype(np.float32)
    inputs = [x, scale, bias, mean, var]
    (got,), (want,) = ours("BatchNormalization", inputs, {"epsilon": 1e-3}), \
        ort_run("BatchNormalization", inputs, {"epsilon": 1e-3}, opset=15)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_batchnorm_training_mode_updates_running_statistics():
    x = RNG.standard_normal((4, 2, 3)).astype(np.float32)
    scale, bias = _params(2)
    mean, var = np.zeros(2, np.float32), np.ones(2, np.float32)
    y, run_mean, run_var = ours("BatchNormalization", [x, scale, bias, mean, var],
                                {"training_mode": 1, "momentum": 0.8}, n_out=3)
    batch_mean, batch_var = x.mean(axis=(0, 2)), x.var(axis=(0, 2))
    np.testing.assert_allclose(run_mean, 0.2 * batch_mean, rtol=1e-5)
    np.testing.assert_allclose(run_var, 0.8 + 0.2 * batch_var, rtol=1e-5)
    want = (x - batch_mean[:, None]) / np.sqrt(batch_var[:, None] + 1e-5) * scale[:, None] + bias[:, None]
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)


def test_instancenorm_matches_onnxruntime():
    x = RNG.standard_normal((2, 3, 5, 4)).astype(np.float32)
    scale, bias = _params(3)
    (got,), (want,) = ours("InstanceNormalization", [x, scale, bias]), \
        ort_run("InstanceNormalization", [x, scale, bias], opset=6)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("axis", [-1, 1])
def test_layernorm_outputs_match_onnxruntime(axis):
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    norm_shape = x.shape[axis % 3:]
    scale, bias = RNG.uniform(0.5, 1.5, norm_shape).astype(np.float32), RNG.standard_normal(norm_shape).astype(np.float32)
    got = ours("LayerNormalization", [x, scale, bias], {"axis": axis}, n_out=3)
    want = ort_run("LayerNormalization", [x, scale, bias], {"axis": axis}, opset=17, n_out=3)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_layernorm_without_bias():
    x = RNG.standard_normal((3, 8)).astype(np.float32)
    scale = RNG.uniform(0.5, 1.5, 8).astype(np.float32)
    (got,), (want,) = ours("LayerNormalization", [x, scale]), ort_run("LayerNormalization", [x, scale], opset=17)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_layernorm_float16_statistics_are_float32():
    x = RNG.standard_normal((2, 4)).astype(np.float16)
    y, mean, inv_std = ours("LayerNormalization", [x, np.ones(4, np.float16)], n_out=3)
    assert y.dtype == np.float16 and mean.dtype == np.float32 and inv_std.dtype == np.float32


def test_groupnorm_scales_per_channel():
    x = RNG.standard_normal((2, 6, 3, 3)).astype(np.float32)
    scale, bias = _params(6)
    (got,) = ours("GroupNormalization", [x, scale, bias], {"num_groups": 3, "epsilon": 1e-4})
    g = x.reshape(2, 3, 2, 3, 3).astype(np.float64)
    norm = (g - g.mean(axis=(2, 3, 4), keepdims=True)) / np.sqrt(g.var(axis=(2, 3, 4), keepdims=True) + 1e-4)
    want = norm.reshape(x.shape) * scale[:, None, None] + bias[:, None, None]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_rmsnorm_matches_onnxruntime():
    x = RNG.standard_normal((2, 3, 8)).astype(np.float32)
    scale = RNG.uniform(0.5, 1.5, 8).astype(np.float32)
    (got,), (want,) = ours("RMSNormalization", [x, scale]), ort_run("RMSNormalization", [x, scale], opset=23)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("p", [1, 2])
def test_lpnorm_matches_onnxruntime(p):
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    (got,), (want,) = ours("LpNormalization", [x], {"p": p, "axis": 1}), \
        ort_run("LpNormalization", [x], {"p": p, "axis": 1}, opset=1)
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_lpnorm_of_a_zero_row_is_zero():
    x = np.array([[0.0, 0.0], [3.0, -4.0]], np.float32)
    (got,) = ours("LpNormalization", [x], {"p": 2, "axis": 1})
    np.testing.assert_allclose(got, [[0, 0], [0.6, -0.8]], rtol=1e-6)


def test_mvn_matches_onnxruntime():
    x = RNG.standard_normal((2, 3, 4, 4)).astype(np.float32)
    (got,), (want,) = ours("MeanVarianceNormalization", [x]), ort_run("MeanVarianceNormalization", [x], opset=13)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)

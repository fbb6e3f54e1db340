"""Random-op reference kernels: polykit's counter-based generator (determinism, statistics,
seed semantics)."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.ops.math.random import random_key
from polykit.compiler.ops.math.random_reference import uniforms

from .oracle import ours


def test_uniforms_are_the_splitmix64_stream():
    # element 0, first uniform, key 0: splitmix64 of the golden ratio constant
    z = 0x9E3779B97F4A7C15
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & (2 ** 64 - 1)
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & (2 ** 64 - 1)
    z ^= z >> 31
    assert uniforms(0, 1, 0)[0] == (z >> 11) * 2.0 ** -53


def test_seed_gives_the_key_and_unseeded_nodes_differ_by_output_name():
    assert random_key({"seed": 7.0}, "y") == 7 and random_key({"seed": -1.0}, "y") == 2 ** 64 - 1
    assert random_key({}, "a") != random_key({}, "b") and random_key({}, "a") == random_key({}, "a")


def test_random_uniform_like_is_deterministic_in_range_and_keeps_dtype():
    x = np.zeros((50, 40), np.float64)
    (a,) = ours("RandomUniformLike", [x], {"low": -2.0, "high": 3.0, "seed": 5.0})
    (b,) = ours("RandomUniformLike", [x], {"low": -2.0, "high": 3.0, "seed": 5.0})
    np.testing.assert_array_equal(a, b)
    assert a.dtype == np.float64 and a.min() >= -2.0 and a.max() < 3.0
    assert abs(a.mean() - 0.5) < 0.1 and abs(a.std() - 5 / np.sqrt(12)) < 0.1


def test_random_normal_has_the_asked_mean_and_scale():
    (y,) = ours("RandomNormal", [], {"shape": [200, 100], "mean": 1.5, "scale": 2.0, "seed": 3.0})
    assert y.shape == (200, 100) and y.dtype == np.float32
    assert abs(y.mean() - 1.5) < 0.05 and abs(y.std() - 2.0) < 0.05


@pytest.mark.parametrize("dtype", [None, 7, 9])
def test_bernoulli_draws_ones_with_the_given_probability(dtype):
    p = np.repeat(np.array([0.0, 0.2, 0.9, 1.0], np.float32), 5000)
    attrs = {"seed": 1.0, **({} if dtype is None else {"dtype": dtype})}
    (y,) = ours("Bernoulli", [p], attrs)
    assert y.dtype == {None: np.float32, 7: np.int64, 9: np.bool_}[dtype]
    rates = y.astype(np.float64).reshape(4, 5000).mean(axis=1)
    np.testing.assert_allclose(rates, [0.0, 0.2, 0.9, 1.0], atol=0.02)

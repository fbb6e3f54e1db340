"""Random tactics: on the GPU the same bits as the cpu reference (poisoned outputs)."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.models import random

rng = np.random.default_rng(64)


def test_every_random_kind_has_a_cuda_tactic():
    from polykit.kernels.tactics import candidates

    kinds = [*random.RANDOM_KINDS, "Bernoulli"]
    assert [k for k in kinds if not candidates("cuda", k, LayerDesc("r", k, ("x",), ("y",)))] == []


def check(layer, inputs, **tol):
    from polykit.runtime.cuda.harness import assert_matches_reference

    return assert_matches_reference(layer, inputs, **(tol or {"rtol": 0, "atol": 0}))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("attrs", [{"seed": 3.0, "low": -1.0, "high": 4.0}, {}])
def test_random_uniform_like_is_bit_identical_to_the_reference(dtype, attrs):
    check(LayerDesc("r", "RandomUniformLike", ("x",), ("y",), attrs), {"x": np.zeros((33, 70), dtype)})


@pytest.mark.gpu
def test_random_normal_matches_the_reference():
    layer = LayerDesc("r", "RandomNormal", (), ("y",), {"shape": [64, 129], "mean": 1.0, "scale": 3.0, "seed": 9.0})
    check(layer, {}, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("p_dtype", [np.float32, np.float64])
@pytest.mark.parametrize("out", [None, 7, 9, 10])
def test_bernoulli_is_bit_identical_to_the_reference(p_dtype, out):
    p = rng.uniform(0, 1, (40, 55)).astype(p_dtype)
    attrs = {"seed": 2.0, **({} if out is None else {"dtype": out})}
    check(LayerDesc("b", "Bernoulli", ("p",), ("y",), attrs), {"p": p})

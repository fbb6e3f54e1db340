"""LpNormalization / MeanVarianceNormalization: dim runs on the host, every walk on the GPU vs the reference."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.reduce import mathnorm as mn

rng = np.random.default_rng(61)


def check(layer, inputs, **tol):
    from polykit.runtime.cuda.harness import assert_matches_reference

    return assert_matches_reference(layer, inputs, **(tol or {"rtol": 1e-5, "atol": 1e-5}))


def test_split_runs_merges_neighbours_and_drops_unit_dims():
    assert mn.split_runs((2, 3, 4, 5), {1}) == ([(20, 1), (2, 60)], [(3, 20)])
    assert mn.split_runs((2, 3, 4, 5), {0, 2, 3}) == ([(3, 20)], [(20, 1), (2, 60)])
    assert mn.split_runs((2, 1, 4), {1}) == ([(8, 1)], [])


@pytest.mark.gpu
@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("shape,axis", [((3, 1000), -1), ((2, 8, 16, 16), 1), ((4, 5), 0), ((1, 7), 1),
                                        ((3, 4, 5), 1)])
def test_lp_normalization_matches_reference(p, shape, axis):
    x = rng.standard_normal(shape).astype(np.float32)
    check(LayerDesc("lp", "LpNormalization", ("X",), ("Y",), {"p": p, "axis": axis}), {"X": x})


@pytest.mark.gpu
def test_lp_normalization_zero_rows_give_zero():
    x = rng.standard_normal((4, 300)).astype(np.float32)
    x[1] = 0
    x[:, 5] = 0
    for shape_x, axis in ((x, 1), (x, 0)):
        check(LayerDesc("lp", "LpNormalization", ("X",), ("Y",), {"axis": axis}), {"X": shape_x})


@pytest.mark.gpu
@pytest.mark.parametrize("shape,axes", [((2, 3, 8, 9), None), ((2, 3, 8, 9), [2, 3]), ((4, 300), [1]),
                                        ((4, 300), [0]), ((2, 3, 4, 5), [1, 3]), ((5, 2, 600), [0, 1, 2])])
def test_mean_variance_normalization_matches_reference(shape, axes):
    x = (rng.standard_normal(shape) * 3 + 1.5).astype(np.float32)
    attrs = {} if axes is None else {"axes": axes}
    check(LayerDesc("mvn", "MeanVarianceNormalization", ("X",), ("Y",), attrs), {"X": x}, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,tol", [(np.float16, {"rel": 2e-3}), (np.float64, {"rtol": 1e-12, "atol": 1e-12})])
def test_math_norms_in_fp16_and_fp64(dtype, tol):
    x = rng.standard_normal((3, 4, 50)).astype(dtype)
    check(LayerDesc("lp", "LpNormalization", ("X",), ("Y",), {"axis": 1}), {"X": x}, **tol)
    check(LayerDesc("mvn", "MeanVarianceNormalization", ("X",), ("Y",), {"axes": [0, 2]}), {"X": x}, **tol)

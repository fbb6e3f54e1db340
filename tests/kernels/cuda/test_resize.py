"""Resize on the GPU against the reference: nearest/linear, every coordinate and nearest mode."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.plan_records import LayerDesc
from polykit.kernels.cuda.resize import COORD, NEAREST, supports

rng = np.random.default_rng(13)


def test_cubic_and_crop_modes_are_not_claimed():
    assert not supports(LayerDesc("r", "Resize", ("X",), ("Y",), {"mode": "cubic"}))
    assert not supports(LayerDesc("r", "Resize", ("X",), ("Y",), {"coordinate_transformation_mode": "tf_crop_and_resize"}))


def check(lay, feeds, **tol):
    from polykit.runtime.cuda.harness import assert_matches_reference

    return assert_matches_reference(lay, feeds, **tol)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("coord", list(COORD))
@pytest.mark.parametrize("scales", [[1, 1, 2.0, 2.0], [1, 1, 0.5, 0.75], [1, 1, 1.7, 0.6]])
def test_resize_with_scales(mode, coord, scales):
    x = rng.standard_normal((2, 3, 5, 8)).astype(np.float32)
    lay = LayerDesc("r", "Resize", ("X", "", "S"), ("Y",), {"mode": mode, "coordinate_transformation_mode": coord})
    check(lay, {"X": x, "S": np.array(scales, np.float32)}, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("rule", list(NEAREST))
@pytest.mark.parametrize("sizes", [[1, 2, 9, 13], [1, 2, 3, 2], [1, 2, 1, 1]])
def test_resize_nearest_with_sizes(rule, sizes):
    x = rng.standard_normal((1, 2, 6, 7)).astype(np.float32)
    lay = LayerDesc("r", "Resize", ("X", "", "", "Z"), ("Y",), {"mode": "nearest", "nearest_mode": rule,
                                                                 "coordinate_transformation_mode": "asymmetric"})
    check(lay, {"X": x, "Z": np.array(sizes, np.int64)}, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,tol", [(np.float16, 2e-3), (np.uint8, 0)])
def test_resize_linear_other_dtypes(dtype, tol):
    x = (rng.random((1, 3, 7, 9)) * 200).astype(dtype)
    lay = LayerDesc("r", "Resize", ("X", "", "", "Z"), ("Y",), {"mode": "linear"})
    check(lay, {"X": x, "Z": np.array([1, 3, 14, 5], np.int64)}, rtol=tol, atol=tol * 200 + (1 if dtype == np.uint8 else 0))


@pytest.mark.gpu
def test_resize_with_axes_attribute():
    x = rng.standard_normal((2, 3, 5, 8)).astype(np.float32)
    lay = LayerDesc("r", "Resize", ("X", "", "S"), ("Y",), {"mode": "linear", "axes": [2, 3]})
    check(lay, {"X": x, "S": np.array([1.5, 2.5], np.float32)}, rtol=1e-5, atol=1e-5)

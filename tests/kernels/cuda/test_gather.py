"""Gather / GatherElements on the GPU against the reference (int32 and int64 indices, negative ones)."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.plan.records import LayerDesc

rng = np.random.default_rng(17)


def check(lay, feeds):
    from polykit.runtime.cuda.harness import assert_matches_reference

    return assert_matches_reference(lay, feeds, rtol=0, atol=0)


def test_gather_tactics_registered():
    from polykit.kernels.tactics import find_tactic

    assert find_tactic("cuda", "Gather", "cuda.gather") and find_tactic("cuda", "GatherElements", "cuda.gather.elements")


@pytest.mark.gpu
@pytest.mark.parametrize("shape,axis,idx_shape", [((10, 4), 0, (3,)), ((30522, 64), 0, (2, 128)), ((3, 5, 7), 1, (2, 2)),
                                                  ((3, 5, 7), -1, ()), ((6,), 0, (9,))])
@pytest.mark.parametrize("index_dtype", [np.int64, np.int32])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64])
def test_gather_rows_and_inner_axes(shape, axis, idx_shape, index_dtype, dtype):
    dim = shape[axis]
    idx = rng.integers(-dim, dim, size=idx_shape).astype(index_dtype)
    data = (rng.standard_normal(shape) * 10).astype(dtype)
    check(LayerDesc("g", "Gather", ("D", "I"), ("Y",), {"axis": axis}), {"D": data, "I": idx})


@pytest.mark.gpu
@pytest.mark.parametrize("shape,axis,idx_shape", [((3, 4), 0, (2, 4)), ((3, 4), 1, (3, 7)), ((2, 3, 5), -1, (2, 3, 2)),
                                                  ((4, 5, 6), 1, (4, 1, 6))])
@pytest.mark.parametrize("index_dtype", [np.int64, np.int32])
def test_gather_elements(shape, axis, idx_shape, index_dtype):
    dim = shape[axis]
    idx = rng.integers(-dim, dim, size=idx_shape).astype(index_dtype)
    data = rng.standard_normal(shape).astype(np.float32)
    check(LayerDesc("ge", "GatherElements", ("D", "I"), ("Y",), {"axis": axis}), {"D": data, "I": idx})

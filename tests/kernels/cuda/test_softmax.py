"""GPU: Softmax / LogSoftmax / Hardmax kernels (row and column paths) against the reference."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.plan_records import LayerDesc
from polykit.kernels.cuda.softmax import split_at_axis

rng = np.random.default_rng(3)


def test_split_at_axis_gives_outer_length_inner():
    assert split_at_axis((2, 3, 4, 5), 1) == (2, 3, 20)
    assert split_at_axis((7,), 0) == (1, 7, 1)


def check(lay, feeds, **tol):
    from polykit.runtime.cuda.harness import assert_matches_reference

    return assert_matches_reference(lay, feeds, **tol)


SHAPES_AXES = [((7,), -1), ((3, 5, 17), -1), ((3, 5, 17), 1), ((2, 4, 1000), -1), ((64, 129), 0), ((1, 1), -1),
               ((2, 12, 128, 128), -1), ((5, 3, 2, 2), 1)]


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("shape,axis", SHAPES_AXES)
def test_softmax_family_matches_reference_fp32(op, shape, axis):
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    check(LayerDesc("s", op, ("X",), ("Y",), {"axis": axis}), {"X": x}, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("shape,axis", [((4, 77), -1), ((3, 9, 5), 1)])
def test_softmax_fp16_storage(shape, axis):
    x = rng.standard_normal(shape).astype(np.float16)
    check(LayerDesc("s", "Softmax", ("X",), ("Y",), {"axis": axis}, precision="fp16"), {"X": x}, rtol=3e-3, atol=1e-3)


@pytest.mark.gpu
def test_softmax_handles_minus_inf_masked_entries():
    x = rng.standard_normal((3, 10)).astype(np.float32)
    x[:, 5:] = -np.inf
    check(LayerDesc("s", "Softmax", ("X",), ("Y",), {"axis": -1}), {"X": x}, rtol=1e-6, atol=1e-7)

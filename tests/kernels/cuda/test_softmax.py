"""GPU: Softmax / LogSoftmax / Hardmax kernels (row and column paths) against the reference."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.reduce.softmax import split_at_axis

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


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("shape,axis", [((6, 7), -1), ((4, 300), -1), ((3, 9, 5), 1), ((64, 40, 3), 1), ((30, 9, 1), 1)])
def test_16bit_softmax_rounds_its_stages_like_the_reference(dtype, shape, axis):
    """x - max, exp and the quotient rounded to T, the sum as numpy sums T: over the innermost
    axis float16 in float rounded once, bfloat16 one rounded addition at a time; over another
    axis (the column kernel: (3, 9, 5) and (64, 40, 3) on axis 1) both one rounded addition at a
    time, as numpy adds whole rows; (30, 9, 1) on axis 1 is innermost for numpy and the row
    kernel alike. expf on the device and numpy's exp may differ by an ulp of float, which moves
    a 16-bit result by one ulp only for values next to a rounding boundary: at most 1 % of the
    elements, one ulp each (a sum rounded otherwise than numpy's is off by many ulps)."""
    from polykit.compiler.ir.dtypes import to_numpy
    from polykit.runtime.cuda.harness import reference_layer, run_layer
    from tests.kernels.cuda.ulps import ulps_apart

    dt = np.dtype(np.float16) if dtype == "float16" else np.dtype(to_numpy(16))
    x = (rng.standard_normal(shape) * 3).astype(dt)
    lay = LayerDesc("s", "Softmax", ("X",), ("Y",), {"axis": axis})
    got, want = run_layer(lay, {"X": x})["Y"], reference_layer(lay, {"X": x})["Y"]
    assert got.dtype == want.dtype == dt
    apart = ulps_apart(got, want)
    assert apart.max() <= 1, f"{dtype}: {apart.max():.0f} ulps apart at {np.unravel_index(apart.argmax(), shape)}"
    assert (apart > 0).mean() <= 0.01, f"{dtype}: {(apart > 0).sum()} of {apart.size} elements one ulp apart"

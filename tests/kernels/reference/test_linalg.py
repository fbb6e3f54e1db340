"""Det reference kernel against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from .oracle import ort_run, ours

RNG = np.random.default_rng(19)


@pytest.mark.parametrize("shape", [(3, 3), (4, 2, 2), (2, 3, 5, 5)])
def test_det_matches_onnxruntime(shape):
    x = RNG.standard_normal(shape).astype(np.float32)
    (got,), (want,) = ours("Det", [x]), ort_run("Det", [x], opset=22)
    assert got.dtype == np.float32 and got.shape == shape[:-2]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_det_of_a_singular_float64_matrix_is_zero():
    x = np.array([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [0.5, 1.0, 9.0]])
    (got,) = ours("Det", [x])
    assert got.dtype == np.float64 and abs(float(got)) < 1e-12

"""Det tactic: workspace size, and on the GPU against the reference."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.plan.records import LayerDesc, TensorDesc
from polykit.kernels.cuda.gemm import linalg

rng = np.random.default_rng(62)


def test_det_borrows_one_double_per_matrix_element():
    tensors = {"x": TensorDesc("x", "float32", (6, 4, 4), "activation")}
    assert linalg._lu_bytes(LayerDesc("d", "Det", ("x",), ("y",)), tensors, 1) == 8 * 6 * 16


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(3, 3), (7, 2, 2), (2, 3, 6, 6), (1, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_det_matches_reference(shape, dtype):
    from polykit.runtime.cuda.harness import assert_matches_reference

    x = rng.standard_normal(shape).astype(dtype)
    assert_matches_reference(LayerDesc("d", "Det", ("x",), ("y",)), {"x": x}, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_det_of_a_singular_matrix_and_a_zero_column_is_zero():
    from polykit.runtime.cuda.harness import run_layer

    x = np.array([[[1, 2], [2, 4]], [[0, 1], [0, 3]]], np.float32)
    np.testing.assert_array_equal(run_layer(LayerDesc("d", "Det", ("x",), ("y",)), {"x": x})["y"], [0, 0])

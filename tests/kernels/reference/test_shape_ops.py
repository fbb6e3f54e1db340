"""Reference kernels of the shape ops, checked against onnxruntime on random inputs."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.errors import RuntimeInputError

from .oracle import assert_same, ort, run

RNG = np.random.default_rng(3)
I64 = np.int64


def test_reshape_infers_the_minus_one_dim_and_copies_zeros():
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    shape = np.array([0, -1, 2], I64)
    assert_same(run("Reshape", [x, shape]), ort("Reshape", [x, shape]))


def test_reshape_with_allowzero_keeps_a_zero_dim():
    x = np.zeros((0, 3), np.float32)
    shape = np.array([3, 0], I64)
    assert_same(run("Reshape", [x, shape], allowzero=1), ort("Reshape", [x, shape], allowzero=1))


def test_reshape_to_a_different_element_count_is_a_runtime_input_error():
    with pytest.raises(RuntimeInputError, match="cannot reshape"):
        run("Reshape", [np.ones((2, 3), np.float32), np.array([4, 2], I64)])


@pytest.mark.parametrize("axis", [0, 2, -1, 3])
def test_flatten_at_axis(axis):
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    assert_same(run("Flatten", [x], axis=axis), ort("Flatten", [x], axis=axis))


def test_squeeze_given_axes():
    x = RNG.standard_normal((1, 3, 1, 2)).astype(np.float32)
    axes = np.array([-2, 0], I64)
    assert_same(run("Squeeze", [x, axes]), ort("Squeeze", [x, axes]))


def test_squeeze_without_axes_removes_every_size_1_axis():
    x = RNG.standard_normal((1, 3, 1, 2)).astype(np.float32)
    assert_same(run("Squeeze", [x]), ort("Squeeze", [x]))


def test_squeeze_of_a_non_unit_axis_is_a_runtime_input_error():
    with pytest.raises(RuntimeInputError):
        run("Squeeze", [np.ones((2, 1), np.float32), np.array([0], I64)])


def test_unsqueeze_with_unsorted_negative_axes():
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    axes = np.array([-1, 0, 2], I64)
    assert_same(run("Unsqueeze", [x, axes]), ort("Unsqueeze", [x, axes]))


def test_expand_broadcasts_both_ways():
    x = RNG.standard_normal((3, 1)).astype(np.float32)
    shape = np.array([2, 1, 4], I64)
    assert_same(run("Expand", [x, shape]), ort("Expand", [x, shape]))


def test_expand_to_an_incompatible_shape_is_a_runtime_input_error():
    with pytest.raises(RuntimeInputError):
        run("Expand", [np.ones((3,), np.float32), np.array([2], I64)])


@pytest.mark.parametrize("attrs", [{}, {"start": 1}, {"end": -1}, {"start": -2, "end": 10}, {"start": 3, "end": 1}])
def test_shape_slices_with_start_and_end(attrs):
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    assert_same(run("Shape", [x], **attrs), ort("Shape", [x], **attrs))


def test_size_counts_elements():
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    assert_same(run("Size", [x]), ort("Size", [x]))


def test_dropout_in_inference_is_identity_with_an_all_true_mask():
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    y, mask = run("Dropout", [x, np.array(0.3, np.float32)], n_out=2)
    np.testing.assert_array_equal(y, x)
    assert mask.dtype == np.bool_ and mask.all()


def test_dropout_in_training_mode_scales_kept_elements_and_is_seeded():
    x = RNG.standard_normal((50, 40)).astype(np.float32)
    args = [x, np.array(0.25, np.float32), np.array(True)]
    y, mask = run("Dropout", args, n_out=2, seed=5)
    np.testing.assert_allclose(y[mask], x[mask] / 0.75, rtol=1e-6)
    assert not y[~mask].any()
    assert 0.6 < mask.mean() < 0.9
    np.testing.assert_array_equal(run("Dropout", args, n_out=2, seed=5)[1], mask)

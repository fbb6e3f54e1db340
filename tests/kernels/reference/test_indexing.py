"""Reference kernels of the indexing ops, checked against onnxruntime on random inputs."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.errors import RuntimeInputError

from .oracle import assert_same, ort, run

RNG = np.random.default_rng(11)
I64 = np.int64


def test_gather_with_negative_indices_on_axis_1():
    x = RNG.standard_normal((3, 5, 2)).astype(np.float32)
    idx = np.array([[-1, 0], [4, -5]], I64)
    assert_same(run("Gather", [x, idx], axis=1), ort("Gather", [x, idx], axis=1))


def test_gather_with_a_scalar_index_drops_the_axis():
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    (y,) = run("Gather", [x, np.array(2, I64)])
    assert y.shape == (4,)
    np.testing.assert_array_equal(y, x[2])


def test_gather_out_of_range_is_a_runtime_input_error():
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    with pytest.raises(RuntimeInputError, match="out of range"):
        run("Gather", [x, np.array([3], I64)])


def test_gather_elements_along_the_last_axis():
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    idx = RNG.integers(-4, 4, (3, 6)).astype(np.int32)
    assert_same(run("GatherElements", [x, idx], axis=-1), ort("GatherElements", [x, idx], axis=-1))


@pytest.mark.parametrize("batch_dims", [0, 1, 2])
def test_gather_nd_with_batch_dims(batch_dims):
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    k = 4 - batch_dims - 1
    idx = np.stack([RNG.integers(0, x.shape[batch_dims + j], (2, 3, 2)[:batch_dims] + (6,)) for j in range(k)], -1)
    assert_same(run("GatherND", [x, idx], batch_dims=batch_dims), ort("GatherND", [x, idx], batch_dims=batch_dims))


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd_reductions(reduction):
    x = RNG.standard_normal((4, 3)).astype(np.float32)
    idx = np.array([[1], [3], [1]], I64) if reduction != "none" else np.array([[1], [3]], I64)
    upd = RNG.standard_normal((len(idx), 3)).astype(np.float32)
    assert_same(run("ScatterND", [x, idx, upd], reduction=reduction), ort("ScatterND", [x, idx, upd], reduction=reduction))


def test_scatter_nd_of_single_elements():
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    idx = np.array([[0, 1], [2, 3], [1, 0]], I64)
    upd = RNG.standard_normal(3).astype(np.float32)
    assert_same(run("ScatterND", [x, idx, upd]), ort("ScatterND", [x, idx, upd]))


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_elements_reductions_with_negative_indices(reduction):
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    idx = np.array([[-1, 0], [1, 1], [0, -4]], I64) if reduction != "none" else np.array([[-1, 0], [1, 2], [0, -3]], I64)
    upd = RNG.standard_normal((3, 2)).astype(np.float32)
    attrs = {"axis": 1, "reduction": reduction}
    assert_same(run("ScatterElements", [x, idx, upd], **attrs), ort("ScatterElements", [x, idx, upd], **attrs))


def test_scatter_elements_out_of_range_is_a_runtime_input_error():
    x = np.zeros((2, 2), np.float32)
    with pytest.raises(RuntimeInputError):
        run("ScatterElements", [x, np.array([[2]], I64), np.ones((1, 1), np.float32)])


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot_with_negative_and_out_of_range_indices(axis):
    idx = np.array([[0, -1, 7], [2, 9, -3]], I64)
    depth, values = np.array(5, I64), np.array([-2.0, 3.0], np.float32)
    assert_same(run("OneHot", [idx, depth, values], axis=axis), ort("OneHot", [idx, depth, values], axis=axis))


def test_non_zero_lists_coordinates_row_major():
    x = RNG.integers(0, 2, (3, 4)).astype(np.int32)
    assert_same(run("NonZero", [x]), ort("NonZero", [x]))


@pytest.mark.parametrize("axis", [None, 0, -1])
def test_compress_with_a_short_condition(axis):
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    cond = np.array([True, False, True])
    attrs = {} if axis is None else {"axis": axis}
    assert_same(run("Compress", [x, cond], **attrs), ort("Compress", [x, cond], **attrs))


@pytest.mark.parametrize("sorted_", [0, 1])
def test_unique_flattened_matches_onnxruntime(sorted_):
    x = RNG.integers(0, 5, (4, 3)).astype(np.float32)
    assert_same(run("Unique", [x], n_out=4, sorted=sorted_), ort("Unique", [x], n_out=4, sorted=sorted_))


def test_unique_along_an_axis():
    x = np.array([[1, 0, 0], [1, 0, 0], [2, 3, 4]], np.float32)
    assert_same(run("Unique", [x], n_out=4, axis=0), ort("Unique", [x], n_out=4, axis=0))


def test_unique_unsorted_keeps_first_occurrence_order_and_remaps_inverse():
    x = np.array([3, 1, 3, 2, 1], np.int64)
    y, first, inverse, counts = run("Unique", [x], n_out=4, sorted=0)
    np.testing.assert_array_equal(y, [3, 1, 2])
    np.testing.assert_array_equal(first, [0, 1, 3])
    np.testing.assert_array_equal(y[inverse], x)
    np.testing.assert_array_equal(counts, [2, 2, 1])

"""CumSum, TopK, Trilu, Einsum reference kernels against onnxruntime and numpy."""

from __future__ import annotations

import numpy as np
import pytest


from .oracle import ort_run, ours

RNG = np.random.default_rng(7)


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
def test_cumsum_matches_onnxruntime(exclusive, reverse):
    x = RNG.standard_normal((3, 5)).astype(np.float32)
    inputs, attrs = [x, np.array(1, np.int64)], {"exclusive": exclusive, "reverse": reverse}
    (got,), (want,) = ours("CumSum", inputs, attrs), ort_run("CumSum", inputs, attrs, opset=14)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_cumsum_int32_with_negative_axis():
    x = RNG.integers(-9, 9, (2, 4)).astype(np.int32)
    (got,) = ours("CumSum", [x, np.array(-1, np.int32)])
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, np.cumsum(x, axis=1))


@pytest.mark.parametrize("attrs", [{"axis": -1}, {"axis": 0, "largest": 0}, {"axis": 1}])
def test_topk_matches_onnxruntime(attrs):
    x = RNG.permutation(60).reshape(3, 4, 5).astype(np.float32)
    inputs = [x, np.array([3], np.int64)]
    got, want = ours("TopK", inputs, attrs, n_out=2), ort_run("TopK", inputs, attrs, opset=11, n_out=2)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("largest", [1, 0])
def test_topk_ties_keep_ascending_index_order(largest):
    x = np.array([[5.0, 1.0, 5.0, 1.0, 5.0]], np.float32)
    values, idx = ours("TopK", [x, np.array([3], np.int64)], {"largest": largest}, n_out=2)
    if largest:
        assert idx.tolist() == [[0, 2, 4]] and values.tolist() == [[5, 5, 5]]
    else:
        assert idx.tolist() == [[1, 3, 0]] and values.tolist() == [[1, 1, 5]]


def test_topk_on_uint8_largest():
    x = np.array([3, 250, 7, 250], np.uint8)
    values, idx = ours("TopK", [x, np.array([2], np.int64)], {"axis": 0}, n_out=2)
    assert values.tolist() == [250, 250] and idx.tolist() == [1, 3]


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [-1, 0, 2])
def test_trilu_on_a_batch_matches_onnxruntime(upper, k):
    x = RNG.standard_normal((2, 4, 5)).astype(np.float32)
    inputs = [x, np.array(k, np.int64)]
    (got,), (want,) = ours("Trilu", inputs, {"upper": upper}), ort_run("Trilu", inputs, {"upper": upper}, opset=14)
    np.testing.assert_array_equal(got, want)


EINSUMS = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("...ij,...jk", [(2, 3, 4), (2, 4, 5)]),
    ("ii->i", [(4, 4)]),
    ("ij->", [(3, 4)]),
    ("i,i", [(5,), (5,)]),
    ("bhqd,bhkd->bhqk", [(1, 2, 3, 4), (1, 2, 5, 4)]),
    ("ji", [(3, 4)]),
]


@pytest.mark.parametrize("equation,shapes", EINSUMS, ids=[e for e, _ in EINSUMS])
def test_einsum_matches_onnxruntime(equation, shapes):
    xs = [RNG.standard_normal(s).astype(np.float32) for s in shapes]
    (got,), (want,) = ours("Einsum", xs, {"equation": equation}), ort_run("Einsum", xs, {"equation": equation}, opset=12)
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_einsum_broadcasts_ellipsis_dims_like_numpy():
    a, b = RNG.standard_normal((2, 1, 3, 4)).astype(np.float32), RNG.standard_normal((5, 4, 2)).astype(np.float32)
    (got,) = ours("Einsum", [a, b], {"equation": "...ij,...jk->...ik"})
    np.testing.assert_allclose(got, np.einsum("...ij,...jk->...ik", a, b), rtol=1e-5, atol=1e-6)


def test_einsum_implicit_output_orders_uppercase_first():
    a = RNG.standard_normal((2, 3)).astype(np.float32)
    (got,) = ours("Einsum", [a], {"equation": "bA"})
    np.testing.assert_allclose(got, a.T)


def test_einsum_on_int64():
    a = RNG.integers(-5, 5, (3, 4)).astype(np.int64)
    b = RNG.integers(-5, 5, (4, 2)).astype(np.int64)
    (got,) = ours("Einsum", [a, b], {"equation": "ij,jk->ik"})
    np.testing.assert_array_equal(got, a @ b)


@pytest.mark.parametrize("exclusive,reverse,want", [
    (0, 0, [[1, 2, 6, 24], [0, 0, 0, 0]]),
    (1, 0, [[1, 1, 2, 6], [1, 0, 0, 0]]),
    (0, 1, [[24, 24, 12, 4], [0, 6, 6, 3]]),
    (1, 1, [[24, 12, 4, 1], [6, 6, 3, 1]]),
])
def test_cumprod_modes_with_a_zero_along_the_axis(exclusive, reverse, want):
    x = np.array([[1, 2, 3, 4], [0, 1, 2, 3]], np.int32)
    (got,) = ours("CumProd", [x, np.array(1, np.int64)], {"exclusive": exclusive, "reverse": reverse})
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)


def test_cumprod_float32_along_axis_0_matches_numpy():
    x = RNG.uniform(0.5, 1.5, (6, 3)).astype(np.float32)
    (got,) = ours("CumProd", [x, np.array(-2, np.int32)])
    np.testing.assert_allclose(got, np.cumprod(x.astype(np.float64), axis=0), rtol=1e-6)

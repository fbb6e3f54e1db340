"""Reduction and ArgMax/ArgMin reference kernels against onnxruntime and numpy."""

from __future__ import annotations

import numpy as np
import pytest


from .oracle import ort_run, ours

RNG = np.random.default_rng(7)


REDUCTIONS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
              "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"]


def _positive(shape):
    return RNG.uniform(0.5, 1.5, shape).astype(np.float32)


@pytest.mark.parametrize("op", REDUCTIONS)
@pytest.mark.parametrize("axes,keepdims", [([1], 1), ([0, 2], 0), ([-1], 1)])
def test_reduction_matches_onnxruntime(op, axes, keepdims):
    x = _positive((3, 4, 5))
    inputs = [x, np.array(axes, np.int64)]
    (got,), (want,) = ours(op, inputs, {"keepdims": keepdims}), ort_run(op, inputs, {"keepdims": keepdims}, opset=18)
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.parametrize("op", REDUCTIONS)
def test_reduction_without_axes_reduces_everything(op):
    x = _positive((2, 3))
    (got,), (want,) = ours(op, [x]), ort_run(op, [x], opset=18)
    assert got.shape == (1, 1)
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_empty_axes_with_noop_flag_return_input_unchanged():
    x = _positive((2, 3))
    (got,) = ours("ReduceSum", [x, np.array([], np.int64)], {"noop_with_empty_axes": 1})
    np.testing.assert_array_equal(got, x)


@pytest.mark.parametrize("op,identity", [("ReduceSum", 0.0), ("ReduceProd", 1.0), ("ReduceMax", -np.inf),
                                         ("ReduceMin", np.inf), ("ReduceLogSumExp", -np.inf)])
def test_reducing_an_empty_axis_gives_the_identity(op, identity):
    x = np.zeros((2, 0, 3), np.float32)
    (got,) = ours(op, [x, np.array([1], np.int64)], {"keepdims": 0})
    assert got.shape == (2, 3)
    np.testing.assert_array_equal(got, np.full((2, 3), identity, np.float32))


def test_integer_reduce_sum_keeps_dtype():
    x = RNG.integers(-50, 50, (4, 6)).astype(np.int32)
    (got,) = ours("ReduceSum", [x, np.array([1], np.int64)], {"keepdims": 0})
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, x.sum(axis=1))


def test_reduce_max_on_bool():
    x = np.array([[False, True], [False, False]])
    (got,) = ours("ReduceMax", [x, np.array([1], np.int64)], {"keepdims": 0})
    np.testing.assert_array_equal(got, [True, False])


def test_float32_sum_accumulates_in_float64():
    x = np.concatenate([[1e8], np.ones(1000), [-1e8]]).astype(np.float32)
    (got,) = ours("ReduceSum", [x, np.array([0], np.int64)], {"keepdims": 0})
    assert float(got) == 1000.0


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("attrs", [{"axis": 1}, {"axis": -1, "keepdims": 0}, {"axis": 0, "select_last_index": 1}])
def test_arg_reduce_matches_onnxruntime(op, attrs):
    x = RNG.integers(0, 3, (4, 5, 3)).astype(np.float32)  # many ties
    (got,), (want,) = ours(op, [x], attrs), ort_run(op, [x], attrs, opset=13)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, want)


def test_argmax_select_last_index_picks_last_tie():
    x = np.array([[2.0, 9.0, 9.0, 1.0]], np.float32)
    (first,), (last,) = ours("ArgMax", [x], {"axis": 1}), ours("ArgMax", [x], {"axis": 1, "select_last_index": 1})
    assert first.tolist() == [[1]] and last.tolist() == [[2]]

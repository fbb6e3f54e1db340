"""GPU: Reduce* and ArgMax/ArgMin kernels against the reference, outputs poisoned first."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.plan_records import LayerDesc
from polykit.kernels.cuda import reduce as red

rng = np.random.default_rng(5)


def rand(shape, dtype=np.float32, lo=-2.0, hi=2.0):
    x = rng.uniform(lo, hi, size=shape)
    x[np.abs(x) < 1e-3] = 0.25
    return x.astype(dtype)


def test_block_size_grows_with_reduction_length():
    assert [red.block_for(r) for r in (1, 33, 100, 129, 10**6)] == [32, 64, 128, 256, 256]


def test_every_reduce_kind_has_a_cuda_tactic():
    from polykit.kernels.tactics import find_tactic

    assert all(find_tactic("cuda", k, "cuda.reduce") for k in red.OPS)


def check(lay, feeds, **tol):
    from polykit.runtime.cuda.harness import assert_matches_reference

    return assert_matches_reference(lay, feeds, **tol)


CASES = [((7,), [0], 1), ((3, 5, 17), [2], 0), ((3, 5, 17), [0, 2], 1), ((4, 300), [1], 0), ((4, 300), [0], 1),
         ((2, 3, 4, 5), [1, 3], 0), ((2, 3, 4, 5), [-1, -2], 1), ((6, 1, 9), [1], 0), ((1, 1), [0, 1], 1)]
POSITIVE = {"ReduceLogSum", "ReduceProd"}


@pytest.mark.gpu
@pytest.mark.parametrize("op", list(red.OPS))
@pytest.mark.parametrize("shape,axes,keepdims", CASES)
def test_reduce_over_axes_matches_reference_fp32(op, shape, axes, keepdims):
    x = rand(shape, lo=0.5, hi=1.5) if op in POSITIVE else rand(shape)
    lay = LayerDesc("r", op, ("X", "axes"), ("Y",), {"keepdims": keepdims})
    check(lay, {"X": x, "axes": np.array(axes, np.int64)}, rtol=2e-5, atol=2e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceLogSumExp"])
def test_reduce_without_axes_reduces_everything(op):
    check(LayerDesc("r", op, ("X",), ("Y",), {"keepdims": 0}), {"X": rand((5, 33, 7))}, rtol=2e-5, atol=2e-5)


@pytest.mark.gpu
def test_empty_axes_with_noop_copies_input():
    lay = LayerDesc("r", "ReduceSum", ("X", "axes"), ("Y",), {"noop_with_empty_axes": 1})
    check(lay, {"X": rand((3, 4)), "axes": np.zeros((0,), np.int64)}, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceL2"])
def test_reduce_fp16_storage(op):
    lay = LayerDesc("r", op, ("X", "axes"), ("Y",), {"keepdims": 1}, precision="fp16")
    check(lay, {"X": rand((4, 257), np.float16), "axes": np.array([1], np.int64)}, rtol=3e-3, atol=3e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceMean"])
def test_reduce_integers_exactly(dtype, op):
    x = rng.integers(-4, 5, size=(3, 6, 5)).astype(dtype)
    x[x == 0] = 1
    lay = LayerDesc("r", op, ("X", "axes"), ("Y",), {"keepdims": 0})
    check(lay, {"X": x, "axes": np.array([1], np.int64)}, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("shape,axis", [((7,), 0), ((3, 5, 17), 1), ((3, 5, 17), -1), ((4, 1000), 1), ((9, 2), 0)])
@pytest.mark.parametrize("last", [0, 1])
def test_arg_extremes_with_ties(op, shape, axis, last):
    x = rng.integers(-3, 4, size=shape).astype(np.float32)  # many ties
    lay = LayerDesc("a", op, ("X",), ("Y",), {"axis": axis, "keepdims": 1, "select_last_index": last})
    check(lay, {"X": x}, rtol=0, atol=0)

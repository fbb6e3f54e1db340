"""GPU: Reduce* and ArgMax/ArgMin kernels against the reference, outputs poisoned first."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.reduce import reduce as red

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


BF16_CASES = [((4, 300), [1]), ((3, 5, 17), [0, 2]), ((2, 3, 4, 5), [1]), ((64, 9), [0]), ((5, 33, 7), None)]
#: bfloat16 reductions whose device result is the reference's bit for bit (module docstring of reduce.cu)
BF16_EXACT = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceL1", "ReduceL2", "ReduceSumSquare")


@pytest.mark.gpu
@pytest.mark.parametrize("op", list(red.OPS))
@pytest.mark.parametrize("shape,axes", BF16_CASES)
def test_reduce_bfloat16_equals_the_float64_reference_rounded_once(op, shape, axes):
    """bf16 accumulates in fp64 on the device: a sum of bf16 values (8-bit significands) is exact
    in any order, so sums, means, extremes and norms are the reference's float64 result rounded
    once to bf16 (through float, as ml_dtypes casts), bit for bit. ReduceProd (300 factors round
    in fp64, in another order than numpy's) and the log/exp ones (the device's double log/exp
    and numpy's may differ by an ulp of double) may move a result next to a bf16 rounding
    boundary by one bf16 ulp: at most one element in 20, one ulp each."""
    from polykit.compiler.ir.dtypes import to_numpy
    from polykit.runtime.cuda.harness import reference_layer, run_layer
    from tests.kernels.cuda.ulps import bit_mismatches, ulps_apart

    x = rand(shape, to_numpy(16), lo=0.5, hi=1.5) if op in POSITIVE else rand(shape, to_numpy(16))
    feeds = {"X": x} if axes is None else {"X": x, "axes": np.array(axes, np.int64)}
    lay = LayerDesc("r", op, tuple(feeds), ("Y",), {"keepdims": 1})
    got, want = run_layer(lay, feeds)["Y"], reference_layer(lay, feeds)["Y"]
    if op in BF16_EXACT:
        assert bit_mismatches(got, want) == "", op
        return
    apart = ulps_apart(got, want)
    assert apart.max() <= 1, f"{op}: {apart.max():.0f} bf16 ulps apart at {np.unravel_index(apart.argmax(), want.shape)}"
    assert (apart > 0).mean() <= 0.05, f"{op}: {(apart > 0).sum()} of {apart.size} elements one ulp apart"


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("last", [0, 1])
def test_arg_extremes_of_bfloat16_with_ties(op, last):
    from polykit.compiler.ir.dtypes import to_numpy

    x = rng.integers(-3, 4, size=(5, 40, 3)).astype(to_numpy(16))  # many ties
    lay = LayerDesc("a", op, ("X",), ("Y",), {"axis": 1, "keepdims": 1, "select_last_index": last})
    check(lay, {"X": x}, rtol=0, atol=0)


def test_reduce_and_arg_kernels_take_bfloat16_storage():
    """The layers ONNX's bf16 Attention expansions hit (ReduceMax over a bf16 mask) get a bf16 kernel."""
    from polykit.kernels.cuda.base import DeviceTensor
    from polykit.compiler.ir.dtypes import to_numpy
    from tests.kernels.cuda.recording_launcher import RecordingLauncher

    bf16 = np.dtype(to_numpy(16))
    rec = RecordingLauncher()
    tensors = {"X": DeviceTensor(0x1000, (4, 18), bf16), "axes": DeviceTensor(0x2000, (1,), np.dtype(np.int64)),
               "Y": DeviceTensor(0x3000, (4, 1), bf16), "I": DeviceTensor(0x4000, (4, 1), np.dtype(np.int64))}
    red.enqueue_reduce(LayerDesc("r", "ReduceMax", ("X", "axes"), ("Y",), {"keepdims": 1}), rec, tensors)
    red.enqueue_arg(LayerDesc("a", "ArgMax", ("X",), ("I",), {"axis": 1}), rec, tensors)
    assert [name for name, _ in rec.launches] == ["reduce_bf16", "argmax_bf16"]

"""Small tensor kernels on the GPU against the reference (Constant, ConstantOfShape, Shape, Size,
Dropout, EyeLike, OneHot, Range, ReverseSequence, CastLike); constant writing without a GPU."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.base import DeviceTensor
from polykit.kernels.cuda.movement.tensor_misc import write_constant

rng = np.random.default_rng(33)


class RecordingLauncher:
    """Records launches instead of running them (host-side logic of the tactics)."""

    def __init__(self):
        self.launches = []

    def launch(self, kernel, grid, block, args, shared_mem=0):
        self.launches.append((kernel.name, list(args)))

    def workspace(self, nbytes):
        raise AssertionError("no workspace expected")


def check(lay, feeds, **tol):
    from polykit.runtime.cuda.harness import assert_matches_reference

    return assert_matches_reference(lay, feeds, **(tol or {"rtol": 0, "atol": 0}))


def test_every_small_tensor_kind_has_a_cuda_tactic():
    from polykit.kernels.tactics import candidates

    kinds = ["Constant", "ConstantOfShape", "Shape", "Size", "Dropout", "EyeLike", "OneHot", "Range",
             "ReverseSequence", "CastLike", "BitCast"]
    lay = lambda kind: LayerDesc("l", kind, ("x",), ("y",), {"value": np.ones(2, np.float32)})  # noqa: E731
    assert [k for k in kinds if not candidates("cuda", k, lay(k))] == []


def test_dropout_with_a_training_mode_input_is_not_the_inference_tactic():
    from polykit.kernels.tactics import candidates

    found = candidates("cuda", "Dropout", LayerDesc("d", "Dropout", ("x", "r", "t"), ("y", "m")))
    assert "cuda.misc.dropout" not in [t.name for t in found]  # training.py's tactic runs these


def test_write_constant_of_one_repeated_value_is_one_fill_launch():
    rec = RecordingLauncher()
    write_constant(rec, DeviceTensor(4096, (1000,), np.dtype(np.float32)), np.full(1000, 1.5, np.float32), "t")
    assert [(name, args[1:]) for name, args in rec.launches] == [("fill_4", [1000, int(np.float32(1.5).view(np.int32))])]


def test_write_constant_splits_distinct_values_into_512_byte_chunks():
    value = rng.standard_normal(200).astype(np.float64)  # 1600 bytes
    rec = RecordingLauncher()
    write_constant(rec, DeviceTensor(8192, (200,), np.dtype(np.float64)), value, "t")
    assert [name for name, _ in rec.launches] == ["write_words"] * 4
    got = b"".join(np.array(args[2:], np.int64).tobytes()[:args[1]] for _, args in rec.launches)
    assert got == value.tobytes()
    assert [args[0].ptr for _, args in rec.launches] == [8192, 8704, 9216, 9728]


@pytest.mark.gpu
@pytest.mark.parametrize("value", [rng.standard_normal((3, 50)).astype(np.float32), np.arange(7, dtype=np.int64),
                                   np.array(2.5, np.float16), np.array([True, False, True])])
def test_constant_writes_its_value(value):
    check(LayerDesc("c", "Constant", (), ("y",), {"value": value}), {})


@pytest.mark.gpu
@pytest.mark.parametrize("fill", [None, np.array([7], np.int64), np.array([-1.25], np.float16), np.array([True])])
def test_constant_of_shape_fills(fill):
    attrs = {} if fill is None else {"value": fill}
    check(LayerDesc("c", "ConstantOfShape", ("s",), ("y",), attrs), {"s": np.array([3, 1, 5], np.int64)})


@pytest.mark.gpu
@pytest.mark.parametrize("attrs", [{}, {"start": 1}, {"start": -2, "end": -1}])
def test_shape_writes_the_static_dims(attrs):
    check(LayerDesc("s", "Shape", ("x",), ("y",), attrs), {"x": rng.standard_normal((2, 3, 5, 7)).astype(np.float32)})


@pytest.mark.gpu
def test_size_writes_the_element_count():
    check(LayerDesc("s", "Size", ("x",), ("y",)), {"x": rng.standard_normal((3, 11)).astype(np.float16)})


@pytest.mark.gpu
def test_dropout_in_inference_copies_and_writes_an_all_true_mask():
    x = rng.standard_normal((5, 7)).astype(np.float32)
    check(LayerDesc("d", "Dropout", ("x", "r"), ("y", "m")), {"x": x, "r": np.array(0.3, np.float32)})


@pytest.mark.gpu
@pytest.mark.parametrize("shape,k", [((4, 4), 0), ((3, 6), 2), ((5, 3), -1), ((1, 1), 3)])
@pytest.mark.parametrize("dtype", [1, 7, 10, 9])
def test_eye_like(shape, k, dtype):
    check(LayerDesc("e", "EyeLike", ("x",), ("y",), {"k": k, "dtype": dtype}), {"x": np.zeros(shape, np.float32)})


@pytest.mark.gpu
@pytest.mark.parametrize("axis", [-1, 0, 1])
@pytest.mark.parametrize("index_dtype", [np.int64, np.int32, np.float32])
def test_one_hot_with_negative_indices(axis, index_dtype):
    idx = rng.integers(-5, 5, size=(3, 4)).astype(index_dtype)
    feeds = {"i": idx, "d": np.array(5, np.int64), "v": np.array([-2.0, 3.5], np.float32)}
    check(LayerDesc("o", "OneHot", ("i", "d", "v"), ("y",), {"axis": axis}), feeds)


@pytest.mark.gpu
@pytest.mark.parametrize("start,limit,delta,dtype", [(0.5, 10.0, 0.7, np.float32), (-3.0, 3.0, 0.1, np.float64),
                                                     (10, -7, -3, np.int32), (1, 1000, 7, np.int64),
                                                     (5, 60, 4, np.int16), (1.0, 30.0, 1.5, np.float16),
                                                     (2.0, 40.0, 3.0, np.dtype(ml_dtypes.bfloat16))])
def test_range(start, limit, delta, dtype):
    feeds = {"a": np.array(start, dtype), "b": np.array(limit, dtype), "c": np.array(delta, dtype)}
    check(LayerDesc("r", "Range", ("a", "b", "c"), ("y",)), feeds)


@pytest.mark.gpu
@pytest.mark.parametrize("shape,time_axis,batch_axis", [((5, 3, 4), 0, 1), ((3, 6, 2), 1, 0), ((4, 4), 0, 1)])
def test_reverse_sequence(shape, time_axis, batch_axis):
    lens = rng.integers(0, shape[time_axis] + 1, size=shape[batch_axis]).astype(np.int64)
    feeds = {"x": rng.standard_normal(shape).astype(np.float32), "l": lens}
    check(LayerDesc("r", "ReverseSequence", ("x", "l"), ("y",), {"time_axis": time_axis, "batch_axis": batch_axis}),
          feeds)


BF16 = np.dtype(ml_dtypes.bfloat16)


def test_range_has_kernels_for_16_bit_floats():
    from polykit.kernels.cuda.movement.tensor_misc import RANGE_CODES

    assert RANGE_CODES[np.dtype(np.float16)] == "f16" and RANGE_CODES[BF16] == "bf16"


def test_cast_like_has_a_code_for_bfloat16():
    from polykit.kernels.cuda.movement.tensor_misc import CAST_CODES

    assert CAST_CODES[BF16] == 12


CASTS = [(np.float32, np.float16), (np.float16, np.float32), (np.float32, np.int32), (np.float64, np.float32),
         (np.int64, np.float32), (np.int32, np.int8), (np.uint8, np.float64), (np.float32, np.bool_),
         (np.bool_, np.float16), (np.int64, np.uint64), (np.float32, np.uint8), (np.float32, BF16), (BF16, np.float32),
         (BF16, np.int32), (np.float16, BF16)]


@pytest.mark.gpu
@pytest.mark.parametrize("src,dst", CASTS)
def test_cast_like(src, dst):
    if src == np.bool_:
        x = rng.random((7, 9)) > 0.5
    elif np.issubdtype(src, np.integer):
        x = rng.integers(0 if np.issubdtype(dst, np.unsignedinteger) else -100, 100, size=(7, 9)).astype(src)
    else:
        x = rng.standard_normal((7, 9)) * 50
        x = (np.abs(x) if np.issubdtype(dst, np.unsignedinteger) else x).astype(src)
        x[0, :3] = 0
    check(LayerDesc("c", "CastLike", ("x", "t"), ("y",)), {"x": x, "t": np.zeros(1, dst)})


@pytest.mark.gpu
@pytest.mark.parametrize("src,to", [(np.float32, 6), (np.float64, 7), (np.uint16, 5), (np.bool_, 2)])
def test_bit_cast_copies_the_bytes(src, to):
    x = (rng.standard_normal((3, 37)) * 1000).astype(src)
    check(LayerDesc("b", "BitCast", ("x",), ("y",), {"to": to}), {"x": x})

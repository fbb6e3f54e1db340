"""Reference kernels of the constant-producing ops, checked against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.errors import NodeAttributeError, RuntimeInputError

from .oracle import assert_same, ort, run

RNG = np.random.default_rng(5)
I64 = np.int64


def test_constant_returns_its_value_tensor():
    value = RNG.standard_normal((2, 3)).astype(np.float32)
    (y,) = run("Constant", [], value=value)
    np.testing.assert_array_equal(y, value)


@pytest.mark.parametrize("key,value,dtype,shape", [
    ("value_float", 1.5, np.float32, ()), ("value_floats", [1.0, 2.5], np.float32, (2,)),
    ("value_int", 7, np.int64, ()), ("value_ints", [3, -1, 4], np.int64, (3,)),
    ("value_string", "abc", object, ()), ("value_strings", ["a", "bc"], object, (2,)),
])
def test_constant_accepts_each_attribute_form(key, value, dtype, shape):
    (y,) = run("Constant", [], **{key: value})
    assert y.dtype == np.dtype(dtype) and y.shape == shape
    np.testing.assert_array_equal(y, np.asarray(value, dtype=dtype))


def test_constant_with_two_value_attributes_is_an_attribute_error():
    with pytest.raises(NodeAttributeError, match="exactly one"):
        run("Constant", [], value_int=1, value_float=2.0)


def test_constant_of_shape_defaults_to_float32_zeros():
    (y,) = run("ConstantOfShape", [np.array([2, 3], I64)])
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, np.zeros((2, 3), np.float32))


def test_constant_of_shape_fills_with_the_value_dtype():
    shape, value = np.array([3, 1, 2], I64), np.array([-4], np.int32)
    assert_same(run("ConstantOfShape", [shape], value=value), ort("ConstantOfShape", [shape], value=_tensor(value)))


def _tensor(a):
    from onnx import numpy_helper

    return numpy_helper.from_array(a)


@pytest.mark.parametrize("start,limit,delta,dtype", [
    (0, 10, 3, np.int32), (10, -3, -4, np.int64), (1.5, 4.0, 0.5, np.float32), (5.0, 1.0, 2.0, np.float64),
    (-2.0, 2.0, 0.3, np.float32),
])
def test_range_matches_onnxruntime(start, limit, delta, dtype):
    args = [np.array(start, dtype), np.array(limit, dtype), np.array(delta, dtype)]
    ours, theirs = run("Range", args), ort("Range", args)
    assert ours[0].dtype == theirs[0].dtype and ours[0].shape == theirs[0].shape
    np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-6, atol=1e-6)  # ours rounds once, ORT per step


def test_range_with_zero_delta_is_a_runtime_input_error():
    with pytest.raises(RuntimeInputError):
        run("Range", [np.array(0, I64), np.array(3, I64), np.array(0, I64)])


@pytest.mark.parametrize("k", [-2, 0, 3])
def test_eye_like_with_offset_diagonal(k):
    x = RNG.standard_normal((4, 5)).astype(np.float32)
    assert_same(run("EyeLike", [x], k=k), ort("EyeLike", [x], k=k))


def test_eye_like_takes_the_dtype_attribute():
    x = RNG.standard_normal((3, 3)).astype(np.float32)
    assert_same(run("EyeLike", [x], dtype=6), ort("EyeLike", [x], dtype=6))

"""Reference kernels of Cast and CastLike, checked against onnxruntime (where ONNX defines the
result) and against polykit's float -> integer rule (reference cast.py's docstring) where it
does not."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from polykit.errors import PolykitError

from .oracle import assert_same, ort, run

RNG = np.random.default_rng(13)
I64 = np.int64


TYPES = {1: np.float32, 10: np.float16, 11: np.float64, 2: np.uint8, 3: np.int8, 5: np.int16, 6: np.int32,
         7: np.int64, 12: np.uint32, 9: np.bool_}


@pytest.mark.parametrize("to", sorted(TYPES))
def test_cast_from_float32_matches_onnxruntime(to):
    x = (RNG.standard_normal((4, 5)) * 50).astype(np.float32)
    if TYPES[to] in (np.uint8, np.uint32):
        x = np.abs(x)
    if TYPES[to] in (np.int8, np.uint8):
        x = np.clip(x, -100, 100)
    x[0, 0] = 0.0
    assert_same(run("Cast", [x], to=to), ort("Cast", [x], to=to))


@pytest.mark.parametrize("src", [np.int64, np.bool_, np.float16, np.uint8])
def test_cast_to_float64_from_each_source_type(src):
    x = RNG.integers(0, 3, (3, 4)).astype(src)
    assert_same(run("Cast", [x], to=11), ort("Cast", [x], to=11))


def test_cast_float_to_int_truncates_toward_zero():
    x = np.array([-2.7, -0.5, 0.5, 2.7], np.float32)
    (y,) = run("Cast", [x], to=6)
    np.testing.assert_array_equal(y, [-2, 0, 0, 2])


#: every integer type: ONNX type code -> dtype
INT_TYPES = {2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32, 7: np.int64, 12: np.uint32,
             13: np.uint64, 21: ml_dtypes.uint4, 22: ml_dtypes.int4, 25: ml_dtypes.uint2, 26: ml_dtypes.int2}


def rule(x, dtype) -> list[int]:
    """polykit's float -> integer rule, written from its statement with Python's exact integers:
    NaN -> 0, truncate toward zero, saturate to the type's range (Inf included)."""
    info = ml_dtypes.iinfo(dtype)
    out = []
    for v in np.asarray(x, np.float64).tolist():
        if math.isnan(v):
            out.append(0)
        elif math.isinf(v):
            out.append(info.max if v > 0 else info.min)
        else:
            out.append(min(max(math.trunc(v), info.min), info.max))
    return out


def edges(dtype) -> np.ndarray:
    """NaN, the infinities, the range's ends and the floats around them, past int32/int64/uint64."""
    info = ml_dtypes.iinfo(dtype)
    ends = [float(info.min), float(info.max)]
    near = [e + d for e in ends for d in (-1.5, -1.0, -0.5, 0.5, 1.0, 1.5)]
    return np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, -0.5, 0.5, -1.0, 300.0, -300.0, 70000.0, 1e10,
                     -1e10, 2.0 ** 31, -2.0 ** 31 - 1, 2.0 ** 63, -2.0 ** 63, -2.0 ** 64, 2.0 ** 64, 1e300, -1e300,
                     *ends, *near])


@pytest.mark.parametrize("src", [np.float16, np.float32, np.float64, ml_dtypes.bfloat16])
@pytest.mark.parametrize("to", sorted(INT_TYPES))
def test_cast_from_floats_to_every_integer_type_follows_polykits_rule(to, src):
    every_half = np.arange(65536, dtype=np.uint16).view(np.float16)
    with np.errstate(over="ignore", invalid="ignore"):  # 1e300 -> inf; float16's signalling NaNs
        x = np.concatenate([edges(INT_TYPES[to]), every_half.astype(np.float64)]).astype(src)
    (y,) = run("Cast", [x], to=to)
    assert y.dtype == np.dtype(INT_TYPES[to])
    assert y.astype(object if to == 13 else np.int64).tolist() == rule(x, INT_TYPES[to])


def test_cast_agrees_with_onnxruntime_on_nan_to_8_and_16_bit_integers_but_saturates_where_it_wraps():
    """onnxruntime 1.32 on x86 converts through int32: NaN -> 0 as here, but 300 -> int8 wraps to
    44 (here 127) and NaN -> int32 is INT32_MIN (here 0); ONNX defines neither."""
    x = np.array([np.nan, 300.0, -300.0], np.float32)
    assert run("Cast", [x], to=3)[0].tolist() == [0, 127, -128]
    assert run("Cast", [x], to=6)[0].tolist() == [0, 300, -300]
    assert ort("Cast", [x[:1]], to=3)[0].tolist() == [0]


def test_castlike_from_floats_follows_the_same_rule():
    x = np.array([np.nan, np.inf, -np.inf, 1e10, -1e10, 7.9, -8.9, 8.0], np.float32)
    (y,) = run("CastLike", [x, np.zeros(1, ml_dtypes.int4)])
    assert y.astype(np.int64).tolist() == [0, 7, -8, 7, -8, 7, -8, 7]


def test_cast_parses_strings_into_numbers():
    x = np.array(["1.5", "-2", "1e3", "NaN", "INF"], dtype=object)
    (y,) = run("Cast", [x], to=1)
    np.testing.assert_array_equal(y, np.array([1.5, -2.0, 1000.0, np.nan, np.inf], np.float32))


def test_cast_prints_numbers_as_strings():
    (y,) = run("Cast", [np.array([3, -7], np.int32)], to=8)
    assert y.dtype == object and list(y) == ["3", "-7"]


def test_cast_to_an_unsupported_type_names_the_node():
    with pytest.raises(PolykitError, match="COMPLEX64"):
        run("Cast", [np.ones(2, np.float32)], to=14)


def test_strings_to_integers_follow_the_float_rule():
    x = np.array(["2.7", "-2.7", "NaN", "INF", "-1e30"], dtype=object)
    assert run("Cast", [x], to=5)[0].tolist() == [2, -2, 0, 32767, -32768]


def test_cast_like_takes_the_dtype_of_its_second_input():
    x = (RNG.standard_normal((3, 2)) * 10).astype(np.float32)
    like = np.zeros(1, np.int16)
    assert_same(run("CastLike", [x, like]), ort("CastLike", [x, like]))


def test_cast_like_to_an_unsupported_dtype_is_a_polykit_error():
    with pytest.raises(PolykitError, match="element type"):
        run("CastLike", [np.ones(2, np.float32), np.ones(2, np.complex64)])


@pytest.mark.parametrize("src,to,want", [(np.float32, 6, np.int32), (np.int64, 11, np.float64),
                                         (np.bool_, 2, np.uint8), (np.uint16, 10, np.float16)])
def test_bit_cast_reinterprets_the_bytes_and_keeps_the_shape(src, to, want):
    x = (RNG.standard_normal((2, 3)) * 1000).astype(src)
    (got,) = run("BitCast", [x], to=to)
    assert got.dtype == want and got.shape == x.shape
    assert got.tobytes() == x.tobytes()


def test_bit_cast_of_a_scalar_stays_a_scalar():
    (got,) = run("BitCast", [np.array(1.0, np.float32)], to=6)
    assert got.shape == () and int(got) == 0x3F800000


def test_bit_cast_between_widths_is_a_shape_error():
    from polykit.compiler.ir.graph import Node
    from polykit.compiler.ops.registry import InferContext, find_shape_rule
    from polykit.errors import ShapeError

    node = Node("BitCast", ["x"], ["y"], {"to": 7}, name="bc")
    with pytest.raises(ShapeError, match="same bit width"):
        find_shape_rule("", "BitCast")(InferContext(node, [np.dtype(np.float32)], [(3,)], [None]))

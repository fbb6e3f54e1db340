"""Reference kernels of Cast and CastLike, checked against onnxruntime."""

from __future__ import annotations

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

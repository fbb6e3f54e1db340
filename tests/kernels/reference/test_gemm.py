"""Gemm, MatMul and MatMulInteger reference kernels, checked against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.errors import ShapeError

from . import oracle

RNG = np.random.default_rng(5)


def run(op, inputs, **attrs):
    return oracle.run(op, inputs, **attrs)[0]


def ort(op, inputs, opset=21, **attrs):
    return oracle.ort(op, inputs, opset=opset, **attrs)[0]


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def assert_close(ours, theirs):
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


GEMM_CASES = {
    "plain": ((3, 4), (4, 5), (5,), {}),
    "trans_a": ((4, 3), (4, 5), (3, 5), {"transA": 1}),
    "trans_b": ((3, 4), (5, 4), (1, 5), {"transB": 1}),
    "both_scaled": ((4, 3), (5, 4), (3, 1), {"transA": 1, "transB": 1, "alpha": 0.5, "beta": -2.0}),
    "scalar_c": ((2, 6), (6, 3), (), {"alpha": 1.5}),
}


@pytest.mark.parametrize("name", sorted(GEMM_CASES))
def test_gemm_matches_onnxruntime(name):
    a_shape, b_shape, c_shape, attrs = GEMM_CASES[name]
    a, b, c = rand(*a_shape), rand(*b_shape), rand(*c_shape)
    assert_close(run("Gemm", [a, b, c], **attrs), ort("Gemm", [a, b, c], **attrs))


def test_gemm_without_c_matches_onnxruntime():
    a, b = rand(3, 4), rand(4, 2)
    assert_close(run("Gemm", [a, b]), ort("Gemm", [a, b]))


MATMUL_CASES = {
    "2d": ((3, 4), (4, 5)),
    "batched": ((2, 3, 4), (2, 4, 5)),
    "broadcast_batch": ((2, 1, 3, 4), (5, 4, 6)),
    "vector_left": ((4,), (2, 4, 3)),
    "vector_right": ((2, 3, 4), (4,)),
    "vectors": ((4,), (4,)),
}


@pytest.mark.parametrize("name", sorted(MATMUL_CASES))
def test_matmul_matches_onnxruntime(name):
    a_shape, b_shape = MATMUL_CASES[name]
    a, b = rand(*a_shape), rand(*b_shape)
    assert_close(run("MatMul", [a, b]), ort("MatMul", [a, b]))


def test_matmul_of_int32_is_exact():
    a = RNG.integers(-1000, 1000, (3, 4), dtype=np.int32)
    b = RNG.integers(-1000, 1000, (4, 2), dtype=np.int32)
    y = run("MatMul", [a, b])
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, a.astype(np.int64) @ b)


def test_matmul_keeps_float16():
    a, b = rand(2, 8, dtype=np.float16), rand(8, 3, dtype=np.float16)
    y = run("MatMul", [a, b])
    assert y.dtype == np.float16
    np.testing.assert_allclose(y, a.astype(np.float32) @ b.astype(np.float32), rtol=1e-2, atol=1e-2)


def test_matmul_and_gemm_of_bfloat16_accumulate_in_float_not_int():
    import ml_dtypes

    bf16 = np.dtype(ml_dtypes.bfloat16)
    a, b = rand(2, 8).astype(bf16), rand(8, 3).astype(bf16)
    want = (a.astype(np.float64) @ b.astype(np.float64)).astype(bf16)
    for op in ("MatMul", "Gemm"):
        y = run(op, [a, b])
        assert y.dtype == bf16
        np.testing.assert_array_equal(y.astype(np.float32), want.astype(np.float32))


def test_matmul_rejects_mismatched_inner_dims():
    with pytest.raises(ShapeError, match="cannot multiply"):
        run("MatMul", [rand(2, 3), rand(4, 2)])


def test_matmul_integer_with_a_per_column_b_zero_point_matches_onnxruntime():
    a = RNG.integers(0, 255, (4, 6), dtype=np.uint8)
    b = RNG.integers(-128, 127, (6, 3), dtype=np.int8)
    a_zp = np.array(17, np.uint8)
    b_zp = RNG.integers(-128, 127, (3,), dtype=np.int8)
    ours = run("MatMulInteger", [a, b, a_zp, b_zp])
    assert ours.dtype == np.int32
    np.testing.assert_array_equal(ours, ort("MatMulInteger", [a, b, a_zp, b_zp], opset=10))


def test_matmul_integer_subtracts_a_per_row_a_zero_point_from_each_row():
    a = RNG.integers(0, 255, (4, 6), dtype=np.uint8)
    b = RNG.integers(0, 255, (6, 3), dtype=np.uint8)
    a_zp = RNG.integers(0, 255, (4,), dtype=np.uint8)
    want = (a.astype(np.int64) - a_zp[:, None]) @ b.astype(np.int64)
    np.testing.assert_array_equal(run("MatMulInteger", [a, b, a_zp]), want.astype(np.int32))


def test_matmul_integer_batched_with_scalar_zero_points_matches_onnxruntime():
    a = RNG.integers(0, 255, (2, 3, 5), dtype=np.uint8)
    b = RNG.integers(0, 255, (5, 4), dtype=np.uint8)
    zp = np.array(128, np.uint8)
    np.testing.assert_array_equal(run("MatMulInteger", [a, b, zp, zp]), ort("MatMulInteger", [a, b, zp, zp], opset=10))

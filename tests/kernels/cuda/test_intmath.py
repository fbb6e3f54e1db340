"""MatMulInteger and ConvInteger on the GPU against the reference (int8/uint8 pairs, scalar and
per-row/column/channel zero points, broadcast batches, groups); batch geometry without a GPU."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.int8.intmath import batch_geometry

rng = np.random.default_rng(9)


def ints(shape, dtype):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, size=shape).astype(dtype)


def check(lay, feeds):
    from polykit.runtime.cuda.harness import assert_matches_reference

    return assert_matches_reference(lay, feeds, rtol=0, atol=0)


def test_batch_geometry_broadcasts_a_single_matrix_with_stride_zero():
    nbatch, nb, dims, sa, sb = batch_geometry((2, 1, 3, 4), (5, 4, 6), 3, 6, 4, "t")
    assert (nbatch, nb, dims[:2], sa[:2], sb[:2]) == (10, 2, [2, 5], [12, 0], [0, 24])


def test_integer_products_have_cuda_tactics():
    from polykit.kernels.tactics import candidates

    assert candidates("cuda", "MatMulInteger", LayerDesc("m", "MatMulInteger", ("a", "b"), ("y",)))
    assert candidates("cuda", "ConvInteger", LayerDesc("c", "ConvInteger", ("x", "w"), ("y",)))


PAIRS = [(np.uint8, np.int8), (np.int8, np.int8), (np.uint8, np.uint8), (np.int8, np.uint8)]


@pytest.mark.gpu
@pytest.mark.parametrize("a_shape,b_shape", [((5, 7), (7, 3)), ((33, 40), (40, 17)), ((2, 3, 9, 20), (20, 11)),
                                             ((4, 1, 6, 8), (3, 8, 5)), ((19,), (19, 4)), ((6, 19), (19,))])
@pytest.mark.parametrize("a_dtype,b_dtype", PAIRS)
def test_matmul_integer_without_zero_points(a_shape, b_shape, a_dtype, b_dtype):
    check(LayerDesc("m", "MatMulInteger", ("a", "b"), ("y",)), {"a": ints(a_shape, a_dtype), "b": ints(b_shape, b_dtype)})


@pytest.mark.gpu
@pytest.mark.parametrize("per_row,per_col", [(False, False), (True, True), (False, True)])
@pytest.mark.parametrize("a_dtype,b_dtype", PAIRS[:2])
def test_matmul_integer_with_zero_points(per_row, per_col, a_dtype, b_dtype):
    m, k, n = 13, 21, 18
    feeds = {"a": ints((2, m, k), a_dtype), "b": ints((k, n), b_dtype),
             "az": ints((m,) if per_row else (), a_dtype), "bz": ints((n,) if per_col else (), b_dtype)}
    check(LayerDesc("m", "MatMulInteger", ("a", "b", "az", "bz"), ("y",)), feeds)


@pytest.mark.gpu
@pytest.mark.parametrize("x_shape,w_shape,attrs", [
    ((1, 3, 7, 7), (4, 3, 3, 3), {}),
    ((2, 4, 9, 8), (6, 2, 3, 2), {"group": 2, "strides": [2, 1], "pads": [1, 0, 1, 1], "dilations": [1, 2]}),
    ((1, 2, 11), (3, 2, 4), {"auto_pad": "SAME_UPPER"}),
    ((1, 2, 4, 5, 5), (2, 2, 2, 3, 3), {"strides": [1, 2, 2]}),
])
@pytest.mark.parametrize("x_dtype,w_dtype", PAIRS[:3])
def test_conv_integer(x_shape, w_shape, attrs, x_dtype, w_dtype):
    check(LayerDesc("c", "ConvInteger", ("x", "w"), ("y",), attrs), {"x": ints(x_shape, x_dtype), "w": ints(w_shape, w_dtype)})


@pytest.mark.gpu
@pytest.mark.parametrize("per_channel", [False, True])
def test_conv_integer_with_zero_points(per_channel):
    feeds = {"x": ints((2, 3, 6, 6), np.uint8), "w": ints((5, 3, 3, 3), np.int8), "xz": np.array(128, np.uint8),
             "wz": ints((5,) if per_channel else (), np.int8)}
    check(LayerDesc("c", "ConvInteger", ("x", "w", "xz", "wz"), ("y",), {"pads": [1, 1, 1, 1]}), feeds)

"""GatherND, ScatterND, ScatterElements (every reduction) and MaxUnpool on the GPU against the
reference; reduction "none" gets distinct targets (ONNX leaves duplicates unspecified)."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.plan.records import LayerDesc

rng = np.random.default_rng(41)


def data(shape, dtype):
    if np.issubdtype(dtype, np.integer):
        return rng.integers(-9, 10, size=shape).astype(dtype)
    return (rng.standard_normal(shape) + 0.5).astype(dtype)


def check(lay, feeds, rtol=0.0):
    from polykit.runtime.cuda.harness import assert_matches_reference

    return assert_matches_reference(lay, feeds, rtol=rtol, atol=rtol)


def distinct_nd_indices(shape, k, m, negative=True):
    """m distinct index tuples into the first k dims of `shape`, some negative."""
    flat = rng.choice(int(np.prod(shape[:k])), size=m, replace=False)
    idx = np.stack(np.unravel_index(flat, shape[:k]), axis=-1).astype(np.int64)
    if negative:
        idx = np.where(rng.random(idx.shape) < 0.3, idx - np.array(shape[:k]), idx)
    return idx


def distinct_along_axis(data_shape, idx_shape, axis):
    """Indices of idx_shape whose targets along `axis` differ within each line."""
    order = np.argsort(rng.random(tuple(d if a != axis else data_shape[axis] for a, d in enumerate(idx_shape))),
                       axis=axis)
    return np.take(order, np.arange(idx_shape[axis]), axis=axis).astype(np.int64)


def test_index_kinds_have_cuda_tactics_for_every_reduction():
    from polykit.kernels.tactics import candidates

    for kind in ("ScatterND", "ScatterElements"):
        for red in ("none", "add", "mul", "max", "min"):
            assert candidates("cuda", kind, LayerDesc("s", kind, ("x", "i", "u"), ("y",), {"reduction": red}))
    assert candidates("cuda", "GatherND", LayerDesc("g", "GatherND", ("x", "i"), ("y",)))
    assert candidates("cuda", "MaxUnpool", LayerDesc("u", "MaxUnpool", ("x", "i"), ("y",), {"kernel_shape": [2, 2]}))


@pytest.mark.gpu
@pytest.mark.parametrize("shape,idx_shape,batch_dims", [((4, 5, 6), (3, 2), 0), ((4, 5, 6), (7, 3), 0),
                                                        ((4, 5, 6), (2, 2, 1), 0), ((2, 5, 6), (2, 3, 1), 1),
                                                        ((2, 3, 5, 4), (2, 3, 2, 1), 2), ((9,), (4, 1), 0)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.uint8])
def test_gather_nd(shape, idx_shape, batch_dims, dtype):
    k = idx_shape[-1]
    dims = np.array(shape[batch_dims:batch_dims + k])
    idx = (rng.integers(0, 1 << 20, size=idx_shape) % dims) - dims * (rng.random(idx_shape) < 0.3)
    check(LayerDesc("g", "GatherND", ("x", "i"), ("y",), {"batch_dims": batch_dims}),
          {"x": data(shape, dtype), "i": idx.astype(np.int64)})


@pytest.mark.gpu
@pytest.mark.parametrize("shape,k,m", [((6, 5, 4), 1, 3), ((6, 5, 4), 2, 7), ((6, 5, 4), 3, 11), ((8,), 1, 5)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.bool_])
def test_scatter_nd_plain_store(shape, k, m, dtype):
    x = data(shape, dtype) if dtype != np.bool_ else rng.random(shape) > 0.5
    idx = distinct_nd_indices(shape, k, m)
    upd = data((m,) + shape[k:], dtype) if dtype != np.bool_ else rng.random((m,) + shape[k:]) > 0.5
    check(LayerDesc("s", "ScatterND", ("x", "i", "u"), ("y",)), {"x": x, "i": idx, "u": upd})


REDUCED = [(np.float32, 1e-5), (np.float64, 1e-12), (np.float16, 1e-2), (np.int32, 0.0), (np.int64, 0.0)]


@pytest.mark.gpu
@pytest.mark.parametrize("reduction", ["add", "mul", "max", "min"])
@pytest.mark.parametrize("dtype,rtol", REDUCED)
def test_scatter_nd_reductions_with_duplicate_indices(reduction, dtype, rtol):
    shape = (5, 4, 3)
    idx = rng.integers(-5, 5, size=(9, 1)).astype(np.int64)
    upd = data((9, 4, 3), dtype)
    if reduction == "mul":
        upd = (np.sign(upd) + (upd == 0)).astype(dtype) * (1 + (np.abs(upd) % 2)).astype(dtype)
    check(LayerDesc("s", "ScatterND", ("x", "i", "u"), ("y",), {"reduction": reduction}),
          {"x": data(shape, dtype), "i": idx, "u": upd}, rtol=rtol)


@pytest.mark.gpu
@pytest.mark.parametrize("shape,idx_shape,axis", [((4, 5), (3, 5), 0), ((4, 5), (4, 2), 1), ((3, 4, 6), (3, 2, 4), -2),
                                                  ((7,), (4,), 0)])
@pytest.mark.parametrize("index_dtype", [np.int64, np.int32])
@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.float64])
def test_scatter_elements_plain_store(shape, idx_shape, axis, index_dtype, dtype):
    ax = axis % len(shape)
    idx = distinct_along_axis(shape, idx_shape, ax)
    idx = np.where(rng.random(idx.shape) < 0.3, idx - shape[ax], idx).astype(index_dtype)
    check(LayerDesc("s", "ScatterElements", ("x", "i", "u"), ("y",), {"axis": axis}),
          {"x": data(shape, dtype), "i": idx, "u": data(idx_shape, dtype)})


@pytest.mark.gpu
@pytest.mark.parametrize("reduction", ["add", "mul", "max", "min"])
@pytest.mark.parametrize("dtype,rtol", REDUCED)
def test_scatter_elements_reductions_with_duplicate_indices(reduction, dtype, rtol):
    shape, idx_shape, axis = (4, 6), (9, 6), 0
    idx = rng.integers(-4, 4, size=idx_shape).astype(np.int64)
    upd = data(idx_shape, dtype)
    if reduction == "mul":
        upd = (np.sign(upd) + (upd == 0)).astype(dtype) * (1 + (np.abs(upd) % 2)).astype(dtype)
    check(LayerDesc("s", "ScatterElements", ("x", "i", "u"), ("y",), {"axis": axis, "reduction": reduction}),
          {"x": data(shape, dtype), "i": idx, "u": upd}, rtol=rtol)


@pytest.mark.gpu
@pytest.mark.parametrize("x_shape,attrs,output_shape", [
    ((1, 2, 3, 3), {"kernel_shape": [2, 2], "strides": [2, 2]}, None),
    ((2, 3, 4, 5), {"kernel_shape": [3, 3], "strides": [1, 2], "pads": [1, 0, 1, 1]}, None),
    ((1, 2, 2, 2), {"kernel_shape": [2, 2], "strides": [2, 2]}, (1, 2, 5, 6)),
    ((2, 3, 7), {"kernel_shape": [2], "strides": [2]}, None),
])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64])
def test_max_unpool_scatters_into_zeros(x_shape, attrs, output_shape, dtype):
    from polykit.compiler.ops.nn.pool import unpool_shape

    unpooled = x_shape[:2] + unpool_shape(attrs, x_shape[2:])
    size = int(np.prod(unpooled))
    n = int(np.prod(x_shape))
    idx = rng.choice(size, size=n, replace=False).reshape(x_shape).astype(np.int64)
    feeds = {"x": data(x_shape, dtype), "i": idx}
    inputs = ("x", "i")
    if output_shape is not None:
        feeds["s"] = np.array(output_shape, np.int64)
        inputs = ("x", "i", "s")
    check(LayerDesc("u", "MaxUnpool", inputs, ("y",), attrs), feeds)

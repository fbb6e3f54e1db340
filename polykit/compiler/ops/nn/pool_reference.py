"""Reference kernels: MaxPool (with Indices), AveragePool, LpPool, Global*Pool, LRN, MaxUnpool.

Pools reduce an `as_strided` window view (see conv.py) over its kernel axes; averages and Lp
norms run in float64. Pads never contribute: MaxPool pads with the dtype's lowest value, the
sums pad with zeros and divide by a per-position count (count_include_pad counts explicit pads
but never the ceil_mode overhang).
"""

from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np

from polykit.compiler.ir.dtypes import is_float
from polykit.compiler.ir.graph import Node
from polykit.compiler.ops.nn.conv import Window, window_geometry
from polykit.compiler.ops.nn.pool import unpool_shape
from polykit.errors import NodeAttributeError, ShapeError
from polykit.compiler.ops.nn.conv_reference import padded, sliding_windows
from polykit.compiler.ops.references import reference


def pool_geometry(node: Node, x: np.ndarray) -> Window:
    ks = node.attrs.get("kernel_shape")
    if not ks:
        raise NodeAttributeError("required attribute 'kernel_shape' is missing", where=node.describe())
    if x.ndim != len(ks) + 2:
        raise ShapeError(f"input of rank {x.ndim} does not fit kernel_shape {list(ks)}", where=node.describe())
    win = window_geometry(node.attrs, x.shape[2:], [int(k) for k in ks], ceil_mode=bool(node.attrs.get("ceil_mode", 0)),
                          where=node.describe())
    if any(o <= 0 for o in win.out):
        raise ShapeError(f"the output spatial shape {win.out} is empty", where=node.describe())
    return win


def reduce_windows(windows: np.ndarray, nd: int, ufunc: np.ufunc) -> np.ndarray:
    """Reduce the trailing `nd` kernel axes of a window view with `ufunc`, one kernel offset at
    a time (k1*k2 vectorized passes beat numpy's reduction over strided axes by far)."""
    kernel = windows.shape[-nd:]
    out = None
    for offset in itertools.product(*(range(k) for k in kernel)):
        part = windows[(Ellipsis,) + offset]
        out = np.array(part) if out is None else ufunc(out, part, out=out)
    return out


def lowest_value(dtype: np.dtype):
    """-inf, or the dtype's least value where it has no infinity (float8_e4m3fn: -448, where -inf would be NaN)."""
    if not is_float(dtype):
        return np.iinfo(dtype).min
    if np.isinf(np.array(-np.inf).astype(dtype)):
        return -np.inf
    import ml_dtypes  # the float types without an infinity are ml_dtypes'

    return ml_dtypes.finfo(dtype).min


@reference("MaxPool")
def max_pool(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x = inputs[0]
    win = pool_geometry(node, x)
    nd = len(win.kernel)
    windows = sliding_windows(padded(x, win, lowest_value(x.dtype)), win)
    y = reduce_windows(windows, nd, np.maximum)
    if len(node.outputs) < 2 or not node.outputs[1]:
        return [y]
    flat = windows.reshape(windows.shape[: 2 + nd] + (-1,))
    offsets = np.unravel_index(flat.argmax(axis=-1), win.kernel)
    spatial = x.shape[2:]
    column_major = int(node.attrs.get("storage_order", 0)) == 1
    index = np.zeros(y.shape, dtype=np.int64)
    step = 1
    dims = range(nd) if column_major else reversed(range(nd))
    for i in dims:
        shape = [1] * (2 + nd)
        shape[2 + i] = win.out[i]
        start = (np.arange(win.out[i]) * win.strides[i] - win.pads_begin[i]).reshape(shape)
        coord = start + offsets[i] * win.dilations[i]
        index += coord * step
        step *= spatial[i]
    n, c = x.shape[:2]
    index += (np.arange(n * c, dtype=np.int64) * int(np.prod(spatial))).reshape((n, c) + (1,) * nd)
    return [y, index]


def window_counts(win: Window, spatial: Sequence[int], include_pad: bool) -> np.ndarray:
    """How many positions of each output window fall inside the input (or its explicit pads)."""
    counts = np.ones((1, 1) + (1,) * len(spatial), dtype=np.float64)
    for i, size in enumerate(spatial):
        pos = (np.arange(win.out[i])[:, None] * win.strides[i] - win.pads_begin[i]
               + np.arange(win.kernel[i])[None, :] * win.dilations[i])
        lo, hi = (-win.pads_begin[i], size + win.pads_end[i]) if include_pad else (0, size)
        c = ((pos >= lo) & (pos < hi)).sum(axis=1).astype(np.float64)
        shape = [1] * (2 + len(spatial))
        shape[2 + i] = win.out[i]
        counts = counts * c.reshape(shape)
    return counts


def _window_sums(node: Node, x: np.ndarray) -> tuple[np.ndarray, Window]:
    win = pool_geometry(node, x)
    windows = sliding_windows(padded(x.astype(np.float64), win, 0.0), win)
    return reduce_windows(windows, len(win.kernel), np.add), win


@reference("AveragePool")
def average_pool(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x = inputs[0]
    sums, win = _window_sums(node, x)
    counts = window_counts(win, x.shape[2:], bool(node.attrs.get("count_include_pad", 0)))
    return [(sums / counts).astype(x.dtype)]


@reference("LpPool")
def lp_pool(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x = inputs[0]
    p = int(node.attrs.get("p", 2))
    sums, _ = _window_sums(node, np.abs(x.astype(np.float64)) ** p)
    return [(sums ** (1.0 / p)).astype(x.dtype)]


def _spatial_axes(x: np.ndarray) -> tuple[int, ...]:
    return tuple(range(2, x.ndim))


@reference("GlobalMaxPool")
def global_max_pool(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x = inputs[0]
    return [x.max(axis=_spatial_axes(x), keepdims=True)]


@reference("GlobalAveragePool")
def global_average_pool(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x = inputs[0]
    return [x.astype(np.float64).mean(axis=_spatial_axes(x), keepdims=True).astype(x.dtype)]


@reference("GlobalLpPool")
def global_lp_pool(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x = inputs[0]
    p = int(node.attrs.get("p", 2))
    s = (np.abs(x.astype(np.float64)) ** p).sum(axis=_spatial_axes(x), keepdims=True)
    return [(s ** (1.0 / p)).astype(x.dtype)]


@reference("LRN")
def lrn(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x = inputs[0]
    size = int(node.attrs["size"])
    alpha, beta, bias = node.attrs.get("alpha", 1e-4), node.attrs.get("beta", 0.75), node.attrs.get("bias", 1.0)
    c = x.shape[1]
    sq = x.astype(np.float64) ** 2
    cum = np.concatenate([np.zeros_like(sq[:, :1]), np.cumsum(sq, axis=1)], axis=1)
    ch = np.arange(c)
    lo = np.maximum(0, ch - (size - 1) // 2)
    hi = np.minimum(c, ch + (size - 1) - (size - 1) // 2 + 1)
    square_sum = np.take(cum, hi, axis=1) - np.take(cum, lo, axis=1)
    return [(x / (bias + (alpha / size) * square_sum) ** beta).astype(x.dtype)]


@reference("MaxUnpool")
def max_unpool(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x, indices = inputs[0], inputs[1]
    requested = inputs[2] if len(inputs) > 2 else None
    inferred = tuple(x.shape[:2]) + unpool_shape(node.attrs, x.shape[2:])
    size = int(np.prod(inferred))
    idx = indices.astype(np.int64).ravel()
    if idx.size != x.size or (idx.size and (idx.min() < 0 or idx.max() >= size)):
        raise ShapeError(f"indices do not address an unpooled tensor of shape {inferred}", where=node.describe(),
                         hint="feed MaxUnpool the Indices output of the MaxPool it inverts")
    y = np.zeros(size, dtype=x.dtype)
    y[idx] = x.ravel()
    y = y.reshape(inferred)
    if requested is None:
        return [y]
    # As ONNX's own reference: indices address the inferred shape, which lands top-left in output_shape.
    shape = tuple(int(d) for d in requested)
    if len(shape) != y.ndim or any(s < d for s, d in zip(shape, inferred)):
        raise ShapeError(f"output_shape {shape} is smaller than the unpooled shape {inferred}", where=node.describe())
    out = np.zeros(shape, dtype=x.dtype)
    out[tuple(slice(0, d) for d in inferred)] = y
    return [out]

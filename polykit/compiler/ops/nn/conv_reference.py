"""Reference kernels: Conv, ConvTranspose, ConvInteger.

Conv is im2col over an `as_strided` window view followed by one batched matmul per group,
accumulated in `accumulator_dtype` and cast back to the input dtype.
ConvTranspose multiplies every input pixel by the kernel once (one matmul) and scatters the
products into the output with one strided add per kernel position.
`padded` and `sliding_windows` are shared with the pooling kernels.
"""

from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

from polykit.compiler.ir.dtypes import is_float
from polykit.compiler.ir.graph import Node
from polykit.compiler.ops.nn.conv import Window, transpose_geometry, window_geometry
from polykit.errors import ShapeError
from polykit.compiler.ops.references import reference


def accumulator_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype products are summed in: float64 for floating inputs, int64 for integers.

    float32 BLAS would be twice as fast but rounds differently per output column (its
    micro-kernel tiles), so identical channels would not give identical outputs; the
    reference is the oracle, so it pays for exactness."""
    return np.dtype(np.float64) if is_float(dtype) else np.dtype(np.int64)


def padded(x: np.ndarray, win: Window, value: float | int = 0) -> np.ndarray:
    """`x` (N, C, *spatial) padded by the window's pads, and at the end as far as the last
    window reaches (ceil_mode), with `value`; negative pads crop."""
    nd = len(win.kernel)
    widths = [(0, 0), (0, 0)]
    for i in range(nd):
        span = (win.kernel[i] - 1) * win.dilations[i] + 1
        needed = (win.out[i] - 1) * win.strides[i] + span
        end = max(win.pads_end[i], needed - x.shape[2 + i] - win.pads_begin[i])
        widths.append((win.pads_begin[i], end))
    crop = tuple(slice(max(0, -b), x.shape[k] - max(0, -e) if e < 0 else None) for k, (b, e) in enumerate(widths))
    x = x[crop]
    widths = [(max(0, b), max(0, e)) for b, e in widths]
    if not any(b or e for b, e in widths):
        return x
    return np.pad(x, widths, mode="constant", constant_values=value)


def sliding_windows(xp: np.ndarray, win: Window) -> np.ndarray:
    """A read-only view (N, C, *out, *kernel) of the windows over the padded input `xp`."""
    nd = len(win.kernel)
    sp = xp.strides[2:]
    shape = xp.shape[:2] + tuple(win.out) + tuple(win.kernel)
    strides = xp.strides[:2] + tuple(sp[i] * win.strides[i] for i in range(nd)) + tuple(
        sp[i] * win.dilations[i] for i in range(nd))
    return as_strided(xp, shape=shape, strides=strides, writeable=False)


def _check_groups(node: Node, c: int, wc: int, m: int, group: int) -> None:
    if group <= 0 or c != wc * group or m % group:
        raise ShapeError(
            f"input channels {c}, weight channels {wc}, output channels {m} do not fit group={group}",
            where=node.describe(),
            hint="Conv weights are (M, C/group, k1, ...) with M divisible by group",
        )


def conv_accumulate(node: Node, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Grouped N-d convolution of x (N, C, *D) with w (M, C/group, *k), in the accumulator dtype."""
    acc = accumulator_dtype(x.dtype)
    group = int(node.attrs.get("group", 1))
    if x.ndim < 3 or w.ndim != x.ndim:
        raise ShapeError(f"input {x.shape} and weight {w.shape} are not (N, C, D1, ...) and (M, C/group, k1, ...)",
                         where=node.describe(), hint="convolution operands need the same rank, at least 3")
    n, c = x.shape[:2]
    m, wc = w.shape[:2]
    _check_groups(node, c, wc, m, group)
    kernel = tuple(w.shape[2:])
    win = window_geometry(node.attrs, x.shape[2:], kernel, where=node.describe())
    if any(o <= 0 for o in win.out):
        raise ShapeError(f"the output spatial shape {win.out} is empty", where=node.describe())
    nd = len(kernel)
    cols = sliding_windows(padded(x.astype(acc, copy=False), win), win)  # (N, C, *out, *k)
    npix, ksize = int(np.prod(win.out)), int(np.prod(kernel))
    cols = cols.reshape((n, group, wc) + tuple(win.out) + kernel)
    order = (1, 0) + tuple(range(3, 3 + nd)) + (2,) + tuple(range(3 + nd, 3 + 2 * nd))
    cols = np.ascontiguousarray(cols.transpose(order)).reshape(group, n * npix, wc * ksize)
    wg = w.astype(acc, copy=False).reshape(group, m // group, wc * ksize).transpose(0, 2, 1)
    y = np.matmul(cols, wg)  # (group, N*P, M/group)
    y = y.reshape((group, n) + tuple(win.out) + (m // group,))
    y = y.transpose((1, 0, 2 + nd) + tuple(range(2, 2 + nd))).reshape((n, m) + tuple(win.out))
    return y


def _bias(b: np.ndarray | None, nd: int, acc: np.dtype) -> np.ndarray | int:
    return 0 if b is None else b.astype(acc).reshape((1, -1) + (1,) * nd)


@reference("Conv")
def conv(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    y = conv_accumulate(node, x, w)
    y = y + _bias(b, x.ndim - 2, y.dtype)
    return [y.astype(x.dtype, copy=False)]


@reference("ConvInteger")
def conv_integer(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x, w = inputs[0].astype(np.int64), inputs[1].astype(np.int64)
    x_zp = inputs[2] if len(inputs) > 2 else None
    w_zp = inputs[3] if len(inputs) > 3 else None
    if x_zp is not None:
        x = x - x_zp.astype(np.int64).reshape(())
    if w_zp is not None:
        w_zp = w_zp.astype(np.int64)
        w = w - (w_zp.reshape((-1,) + (1,) * (w.ndim - 1)) if w_zp.size > 1 else w_zp.reshape(()))
    return [conv_accumulate(node, x, w).astype(np.int32)]


@reference("ConvTranspose")
def conv_transpose(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    acc = accumulator_dtype(x.dtype)
    group = int(node.attrs.get("group", 1))
    n, c = x.shape[:2]
    mg = w.shape[1]
    m = mg * group
    if w.shape[0] != c or c % group:
        raise ShapeError(f"input channels {c} do not match the weight's dim 0 ({w.shape[0]}) or group={group}",
                         where=node.describe(), hint="ConvTranspose weights are (C, M/group, k1, ...)")
    kernel = tuple(w.shape[2:])
    nd = len(kernel)
    spatial = tuple(x.shape[2:])
    win = transpose_geometry(node.attrs, spatial, kernel, where=node.describe())
    npix, ksize, cg = int(np.prod(spatial)), int(np.prod(kernel)), c // group
    xg = x.astype(acc, copy=False).reshape(n, group, cg, npix).transpose(1, 0, 3, 2)
    wg = w.astype(acc, copy=False).reshape(group, 1, cg, mg * ksize)
    prod = np.matmul(xg, wg)  # (group, N, P, Mg*K)
    prod = prod.reshape((group, n) + spatial + (mg,) + kernel)
    order = (1, 0, 2 + nd) + tuple(range(3 + nd, 3 + 2 * nd)) + tuple(range(2, 2 + nd))
    prod = prod.transpose(order).reshape((n, m) + kernel + spatial)
    y = np.zeros((n, m) + tuple(win.out), dtype=acc)
    for kk in itertools.product(*(range(k) for k in kernel)):
        src, dst = [slice(None), slice(None)], [slice(None), slice(None)]
        for i in range(nd):
            s, off = win.strides[i], kk[i] * win.dilations[i] - win.pads_begin[i]
            lo = max(0, -(off // s))  # first input index landing at output >= 0
            hi = min(spatial[i], -(-(win.out[i] - off) // s))
            if hi <= lo:
                break
            src.append(slice(lo, hi))
            dst.append(slice(lo * s + off, (hi - 1) * s + off + 1, s))
        else:
            y[tuple(dst)] += prod[(slice(None), slice(None)) + kk + tuple(src[2:])]
    y = y + _bias(b, nd, acc)
    return [y.astype(x.dtype, copy=False)]

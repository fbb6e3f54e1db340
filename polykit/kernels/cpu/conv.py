"""cpu convolution tactics (kind Conv and its fused epilogue form), all in float64.

  cpu.conv.direct     one GEMM per kernel tap: W[:, :, tap] @ the input shifted by the tap,
                      accumulated; no column buffer (any rank, groups, strides, dilations)
  cpu.conv.im2col     im2col + GEMM over bands of output rows, so the column buffer stays
                      under `band_elements` (cpu.reference builds it whole)
  cpu.conv.winograd   Winograd F(2x2, 3x3) (Lavin & Gray: Y = AT [(G g GT) * (BT d B)] A):
                      2-D 3x3 kernels, stride 1, dilation 1, 8+ input channels per group; 16
                      GEMMs on transformed 4x4 tiles, 2.25x fewer multiplies than direct
  cpu.conv.pointwise  1x1 kernels, stride 1, no pads, group 1: one GEMM, no window view
"""

from __future__ import annotations

import itertools
from typing import Any, Sequence

import numpy as np

from polykit.compiler.ir.graph import Node
from polykit.compiler.ops.nn.conv import Window, window_geometry
from polykit.errors import PolykitError
from polykit.kernels.cpu.base import cpu_tactic, float_layer, plain_or_fused
from polykit.compiler.ops.nn.conv_reference import accumulator_dtype, padded, sliding_windows

#: cpu.conv.winograd: fewest input channels per group
WINOGRAD_MIN_CHANNELS = 8
#: cpu.conv.im2col: most elements of one band's column buffer
BAND_ELEMENTS = 1 << 20


def _operands(node: Node, inputs: Sequence[np.ndarray | None]) -> tuple[np.ndarray, np.ndarray, Any, Window, int]:
    x, w = inputs[0], inputs[1]
    acc = accumulator_dtype(x.dtype)
    win = window_geometry(node.attrs, x.shape[2:], tuple(w.shape[2:]), where=node.describe())
    return x.astype(acc, copy=False), w.astype(acc, copy=False), inputs[2] if len(inputs) > 2 else None, win, \
        int(node.attrs.get("group", 1))


def _finish(y: np.ndarray, b: np.ndarray | None, like: np.ndarray) -> list[np.ndarray]:
    if b is not None:
        y = y + b.astype(y.dtype).reshape((1, -1) + (1,) * (y.ndim - 2))
    return [y.astype(like.dtype, copy=False)]


def layer_window(layer: Any) -> Window | None:
    """The window of a Conv layer whose input shapes the builder stamped (else None)."""
    if len(layer.in_shapes) < 2 or len(layer.in_shapes[0]) < 3:
        return None
    x, w = layer.in_shapes[0], layer.in_shapes[1]
    try:
        return window_geometry(layer.attrs, x[2:], tuple(w[2:]), where=f"layer {layer.name!r}")
    except PolykitError:
        return None


def _conv_layer(layer: Any) -> bool:
    return plain_or_fused(layer) and float_layer(layer)


@cpu_tactic(["Conv"], "cpu.conv.direct", supports=_conv_layer, priority=1)
def conv_direct(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x, w, b, win, group = _operands(node, inputs)
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    kernel, out = tuple(w.shape[2:]), tuple(win.out)
    pixels = int(np.prod(out))
    xp = padded(x, win)
    taps = w.reshape((group, m // group, cg) + kernel)
    y = np.zeros((n, group, m // group, pixels), x.dtype)
    for tap in itertools.product(*(range(k) for k in kernel)):
        window = tuple(slice(t * d, t * d + (o - 1) * s + 1, s)
                       for t, d, o, s in zip(tap, win.dilations, out, win.strides))
        shifted = xp[(slice(None), slice(None)) + window].reshape(n, group, cg, pixels)
        y += np.matmul(taps[(Ellipsis,) + tap][None], shifted)
    return _finish(y.reshape((n, m) + out), b, inputs[0])


@cpu_tactic(["Conv"], "cpu.conv.im2col", supports=_conv_layer, priority=2, params={"band_elements": BAND_ELEMENTS})
def conv_im2col(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x, w, b, win, group = _operands(node, inputs)
    n = x.shape[0]
    m, cg = w.shape[:2]
    kernel, out = tuple(w.shape[2:]), tuple(win.out)
    ksize, nd = int(np.prod(kernel)), len(kernel)
    cols = sliding_windows(padded(x, win), win)  # (N, C, *out, *k), a view
    wg = w.reshape(group, m // group, cg * ksize)
    rows_per_band = max(1, BAND_ELEMENTS // max(1, cg * ksize * int(np.prod(out[1:]))))
    y = np.empty((n, group, m // group) + out, x.dtype)
    for lo in range(0, out[0], rows_per_band):
        band = cols[:, :, lo:lo + rows_per_band]
        shape = band.shape[2:2 + nd]
        band = band.reshape((n, group, cg) + shape + kernel)
        order = (0, 1) + tuple(range(3, 3 + nd)) + (2,) + tuple(range(3 + nd, 3 + 2 * nd))
        flat = np.ascontiguousarray(band.transpose(order)).reshape(n, group, int(np.prod(shape)), cg * ksize)
        prod = np.matmul(wg[None], flat.transpose(0, 1, 3, 2))  # (N, G, M/G, band pixels)
        y[:, :, :, lo:lo + shape[0]] = prod.reshape((n, group, m // group) + shape)
    return _finish(y.reshape((n, m) + out), b, inputs[0])


def _winograd_layer(layer: Any) -> bool:
    """2-D 3x3, stride 1, dilation 1, at least WINOGRAD_MIN_CHANNELS input channels per group
    (below that the tile transforms cost more than the multiplies they save)."""
    win = layer_window(layer)
    return (_conv_layer(layer) and win is not None and win.kernel == (3, 3) and win.strides == (1, 1)
            and win.dilations == (1, 1) and layer.in_shapes[1][1] >= WINOGRAD_MIN_CHANNELS)


@cpu_tactic(["Conv"], "cpu.conv.winograd", supports=_winograd_layer, priority=3)
def conv_winograd(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x, w, b, win, group = _operands(node, inputs)
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    oh, ow = win.out
    th, tw = -(-oh // 2), -(-ow // 2)
    xp = padded(x, win)
    xp = np.pad(xp, ((0, 0), (0, 0), (0, 2 * th + 2 - xp.shape[2]), (0, 2 * tw + 2 - xp.shape[3])))
    xp = xp.transpose(1, 0, 2, 3)  # (C, N, H, W): the transformed tiles come out as GEMM operands
    # d[i][j]: element (i, j) of every 4x4 input tile, (C, N, th, tw); then V = BT d B
    d = [[xp[:, :, i:i + 2 * th:2, j:j + 2 * tw:2] for j in range(4)] for i in range(4)]
    rows = [_bt_rows(d[0][j], d[1][j], d[2][j], d[3][j]) for j in range(4)]
    v = np.empty((4, 4, c, n, th, tw), x.dtype)
    for a in range(4):
        v[a, 0], v[a, 1], v[a, 2], v[a, 3] = _bt_rows(rows[0][a], rows[1][a], rows[2][a], rows[3][a])
    v = v.reshape(16, group, cg, n * th * tw)
    u = np.empty((4, 4, m, cg), x.dtype)  # U = G g GT, one (M, C/G) plane per tile position
    rows = _g_rows(w[:, :, 0, :], w[:, :, 1, :], w[:, :, 2, :])  # G along the kernel's rows: 4 x (M, C/G, 3)
    for a in range(4):
        u[a, 0], u[a, 1], u[a, 2], u[a, 3] = _g_rows(rows[a][..., 0], rows[a][..., 1], rows[a][..., 2])
    u = u.reshape(16, group, m // group, cg)
    p = np.matmul(u, v).reshape(4, 4, m, n, th, tw)
    # Y = AT p A: AT's rows are (p0 + p1 + p2, p1 - p2 - p3)
    r0, r1 = p[0] + p[1] + p[2], p[1] - p[2] - p[3]
    y = np.empty((n, m, 2 * th, 2 * tw), x.dtype)
    for i, r in enumerate((r0, r1)):
        y[:, :, i::2, 0::2] = (r[0] + r[1] + r[2]).transpose(1, 0, 2, 3)
        y[:, :, i::2, 1::2] = (r[1] - r[2] - r[3]).transpose(1, 0, 2, 3)
    return _finish(y[:, :, :oh, :ow], b, inputs[0])


def _g_rows(g0: np.ndarray, g1: np.ndarray, g2: np.ndarray) -> tuple[np.ndarray, ...]:
    """The Winograd filter transform G applied along one kernel axis."""
    half = 0.5 * (g0 + g2)
    return g0, half + 0.5 * g1, half - 0.5 * g1, g2


def _bt_rows(d0: np.ndarray, d1: np.ndarray, d2: np.ndarray, d3: np.ndarray) -> tuple[np.ndarray, ...]:
    """The Winograd input transform BT applied along one tile axis."""
    return d0 - d2, d1 + d2, d2 - d1, d1 - d3


def _pointwise_layer(layer: Any) -> bool:
    win = layer_window(layer)
    return (_conv_layer(layer) and win is not None and int(layer.attrs.get("group", 1)) == 1
            and all(k == 1 for k in win.kernel) and all(s == 1 for s in win.strides)
            and not any(win.pads_begin) and not any(win.pads_end))


@cpu_tactic(["Conv"], "cpu.conv.pointwise", supports=_pointwise_layer, priority=4)
def conv_pointwise(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x, w, b, win, _ = _operands(node, inputs)
    n, c = x.shape[:2]
    y = np.matmul(w.reshape(w.shape[0], c)[None], x.reshape(n, c, -1))
    return _finish(y.reshape((n, w.shape[0]) + x.shape[2:]), b, inputs[0])

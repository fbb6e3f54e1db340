"""Reference kernels: GridSample (2-D / 3-D, nearest / linear / cubic, zeros / border / reflection),
AffineGrid and DeformConv (bilinear sampling at learned offsets, then a grouped product).

Coordinates are computed in float32 as onnxruntime and ONNX's reference do (so nearest rounding
ties agree); interpolation sums in float64.
"""

from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np

from polykit.compiler.ir.graph import Node
from polykit.compiler.ops.nn.sampling import deform_geometry, grid_sample_attrs
from polykit.errors import ShapeError
from polykit.compiler.ops.references import reference

CUBIC_A = -0.75


def reflect(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Fold coordinates outside [lo, hi] back in by reflecting at the borders."""
    x = np.asarray(x, np.float64)
    span = hi - lo
    if span <= 0:
        return np.full_like(x, lo)
    below = x < lo
    dx = np.where(below, lo - x, x - hi)
    n = np.floor(dx / span)
    r = dx - n * span
    even = n % 2 == 0
    inside = np.where(below, np.where(even, lo + r, hi - r), np.where(even, hi - r, lo + r))
    return np.where((x < lo) | (x > hi), inside, x)


def _cubic_weights(t: np.ndarray) -> list[np.ndarray]:
    a = CUBIC_A
    w = lambda d: np.where(d <= 1, ((a + 2) * d - (a + 3)) * d * d + 1,  # noqa: E731
                           ((a * d - 5 * a) * d + 8 * a) * d - 4 * a)
    return [w(t + 1), w(t), w(1 - t), w(2 - t)]


def grid_sample_nd(x: np.ndarray, grid: np.ndarray, mode: str, padding: str, align: bool) -> np.ndarray:
    """Y (N, C, *grid.shape[1:-1]) sampled from x (N, C, *dims) at normalized grid coordinates."""
    n, dims = x.shape[0], x.shape[2:]
    r = len(dims)
    borders = [(0.0, L - 1.0) if align else (-0.5, L - 0.5) for L in dims]
    coords = []
    for i, L in enumerate(dims):  # the grid's last axis lists coordinates innermost dim first
        g = grid[..., r - 1 - i].astype(np.float32)
        c = (g + 1) / 2 * (L - 1) if align else ((g + 1) * L - 1) / 2
        c = np.rint(c) if mode == "nearest" else c
        lo, hi = borders[i]
        if padding == "border" and mode != "cubic":  # outside [lo, hi] only; cubic clamps its taps alone
            c = np.where((c < lo) | (c > hi), np.clip(c, 0, L - 1), c).astype(np.float32)
        elif padding == "reflection":
            c = reflect(c, lo, hi).astype(np.float32)
        coords.append(c.astype(np.float64))
    batch = np.arange(n).reshape((n,) + (1,) * (grid.ndim - 2))

    def fetch(idx: list[np.ndarray]) -> np.ndarray:  # (N, *out, C) values at integer indices
        valid = np.ones(idx[0].shape, bool)
        fixed = []
        for i, (k, L) in enumerate(zip(idx, dims)):
            if padding == "zeros":
                valid &= (k >= 0) & (k < L)
                k = np.clip(k, 0, L - 1)
            elif padding == "border":
                k = np.clip(k, 0, L - 1)
            else:
                k = np.clip(reflect(k, *borders[i]).astype(np.int64), 0, L - 1)
            fixed.append(k)
        vals = np.moveaxis(x, 1, -1)[(batch, *fixed)].astype(np.float64)
        return vals * valid[..., None]

    if mode == "nearest":
        out = fetch([c.astype(np.int64) for c in coords])
    else:
        base = [np.floor(c).astype(np.int64) for c in coords]
        frac = [c - b for c, b in zip(coords, base)]
        taps = ([0, 1], [lambda t: 1 - t, lambda t: t]) if mode == "linear" else ([-1, 0, 1, 2], None)
        weights = [[f(t) for f in taps[1]] if taps[1] else _cubic_weights(t) for t in frac]
        out = 0.0
        for combo in itertools.product(range(len(taps[0])), repeat=r):
            w = np.prod([weights[i][k] for i, k in enumerate(combo)], axis=0)
            out = out + w[..., None] * fetch([b + taps[0][k] for b, k in zip(base, combo)])
    return np.moveaxis(out, -1, 1)


@reference("GridSample")
def grid_sample(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x, grid = inputs[0], inputs[1]
    mode, padding, align = grid_sample_attrs(node.attrs, x.ndim, node.describe())
    if grid.ndim != x.ndim or grid.shape[0] != x.shape[0] or grid.shape[-1] != x.ndim - 2:
        raise ShapeError(f"grid of shape {grid.shape} does not fit input {x.shape}", where=node.describe())
    return [grid_sample_nd(x, grid, mode, padding, align).astype(x.dtype)]


def affine_base_grid(dims: Sequence[int], align: bool) -> np.ndarray:
    """(*dims, r + 1): normalized coordinates of every output point, innermost dim first, then 1."""
    axes = [np.linspace(-1, 1, L) if align else (2 * np.arange(L) + 1) / L - 1 for L in dims]
    mesh = np.meshgrid(*axes, indexing="ij")
    return np.stack([*mesh[::-1], np.ones(tuple(dims))], axis=-1)


@reference("AffineGrid")
def affine_grid(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    theta, size = inputs[0], [int(v) for v in np.asarray(inputs[1]).reshape(-1)]
    if len(size) not in (4, 5) or theta.shape != (size[0], len(size) - 2, len(size) - 1):
        raise ShapeError(f"theta {theta.shape} does not fit size {size}", where=node.describe(),
                         hint="theta is (N, 2, 3) with size (N, C, H, W), or (N, 3, 4) with (N, C, D, H, W)")
    base = affine_base_grid(size[2:], bool(node.attrs.get("align_corners", 0)))
    return [np.einsum("nij,...j->n...i", theta.astype(np.float64), base).astype(theta.dtype)]


def deform_columns(x: np.ndarray, offset: np.ndarray, mask: np.ndarray | None, geo, out_hw) -> np.ndarray:
    """(N, C, kH, kW, oH, oW): x bilinearly sampled (zero outside) at each tap's offset position."""
    n, c, h, w = x.shape
    kh, kw = geo.kernel
    oh, ow = out_hw
    og = geo.offset_group
    off = offset.reshape(n, og, kh, kw, 2, oh, ow).astype(np.float64)
    base_y = (np.arange(kh) * geo.dilations[0])[:, None, None, None] + \
        (np.arange(oh) * geo.strides[0] - geo.pads[0])[None, None, :, None]
    base_x = (np.arange(kw) * geo.dilations[1])[None, :, None, None] + \
        (np.arange(ow) * geo.strides[1] - geo.pads[1])[None, None, None, :]
    py, px = base_y + off[:, :, :, :, 0], base_x + off[:, :, :, :, 1]  # (N, og, kh, kw, oh, ow)
    y0, x0 = np.floor(py).astype(np.int64), np.floor(px).astype(np.int64)
    fy, fx = py - y0, px - x0
    xg = x.astype(np.float64).reshape(n, og, c // og, h * w)
    cols = np.zeros((n, og, c // og, kh, kw, oh, ow))
    for dy, dx in itertools.product((0, 1), (0, 1)):
        yy, xx = y0 + dy, x0 + dx
        wgt = (fy if dy else 1 - fy) * (fx if dx else 1 - fx) * ((yy >= 0) & (yy < h) & (xx >= 0) & (xx < w))
        flat = (np.clip(yy, 0, h - 1) * w + np.clip(xx, 0, w - 1)).reshape(n, og, 1, -1)
        vals = np.take_along_axis(xg, np.broadcast_to(flat, (n, og, c // og, flat.shape[-1])), axis=3)
        cols += vals.reshape(cols.shape) * wgt[:, :, None]
    if mask is not None:
        cols *= mask.reshape(n, og, 1, kh, kw, oh, ow)
    return cols.reshape(n, c, kh, kw, oh, ow)


@reference("DeformConv")
def deform_conv(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x, w, offset = inputs[0], inputs[1], inputs[2]
    b = inputs[3] if len(inputs) > 3 else None
    mask = inputs[4] if len(inputs) > 4 else None
    geo = deform_geometry(node.attrs, w.shape, node.describe())
    n, c, h, wd = x.shape
    out_hw = (geo.out_dim(h, 0), geo.out_dim(wd, 1))
    kh, kw = geo.kernel
    want = (n, geo.offset_group * kh * kw * 2, *out_hw)
    if c != w.shape[1] * geo.group or c % geo.offset_group or offset.shape != want or \
            (mask is not None and mask.shape != (n, want[1] // 2, *out_hw)):
        raise ShapeError(f"X {x.shape}, W {w.shape}, offset {offset.shape} do not fit group {geo.group}, "
                         f"offset_group {geo.offset_group} (offset {want} expected)", where=node.describe())
    cols = deform_columns(x, offset, mask, geo, out_hw)
    g, m = geo.group, w.shape[0]
    cols = cols.reshape(n, g, c // g * kh * kw, *out_hw)
    wg = w.astype(np.float64).reshape(g, m // g, -1)
    y = np.einsum("gmk,ngkhw->ngmhw", wg, cols).reshape(n, m, *out_hw)
    if b is not None:
        y = y + b.reshape(1, m, 1, 1)
    return [y.astype(x.dtype)]

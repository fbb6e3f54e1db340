"""Reference kernels: RoiAlign (avg / max, half_pixel / output_half_pixel) and NonMaxSuppression.

Both follow onnxruntime's arithmetic (which ONNX's reference copies): RoiAlign's sample positions
in the input's float type, max mode as the max of the weighted corner values; NMS orders a class's
candidates by score (ties: lower box index first), keeps those above score_threshold (strictly),
and suppresses a box whose IoU with a kept one is above iou_threshold (float32 math).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from polykit.compiler.ir.graph import Node
from polykit.compiler.ops.nn.detection import roi_align_attrs
from polykit.errors import ShapeError
from polykit.compiler.ops.references import reference


def _samples(start, bin_size, grid: int, pooled: int, f):
    """Sample coordinates (pooled, grid) along one axis, in the float type f."""
    p = np.arange(pooled, dtype=f)[:, None]
    i = np.arange(grid, dtype=f)[None, :]
    return f(start) + p * f(bin_size) + (i + f(0.5)) * f(bin_size) / f(grid)


def _corners(pos: np.ndarray, size: int, f):
    """Per sample: (low index, high index, low weight, high weight, inside) along one axis."""
    inside = (pos >= -1.0) & (pos <= size)
    pos = np.maximum(pos, f(0))
    low = pos.astype(np.int64)
    edge = low >= size - 1
    low = np.where(edge, size - 1, low)
    high = np.where(edge, size - 1, low + 1)
    pos = np.where(edge, low.astype(f), pos)
    frac = (pos - low).astype(f)
    return low, high, f(1) - frac, frac, inside


@reference("RoiAlign")
def roi_align(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x, rois, idx = inputs[0], inputs[1], np.asarray(inputs[2]).reshape(-1)
    mode, half_pixel, oh, ow, ratio, scale = roi_align_attrs(node.attrs, node.describe())
    if x.ndim != 4 or rois.ndim != 2 or rois.shape[1] != 4 or rois.shape[0] != idx.size:
        raise ShapeError(f"X {x.shape}, rois {rois.shape}, batch_indices {idx.shape}: expected (N, C, H, W), "
                         "(R, 4), (R,)", where=node.describe())
    if idx.size and (idx.min() < 0 or idx.max() >= x.shape[0]):
        raise ShapeError(f"batch_indices {idx.tolist()} out of range for a batch of {x.shape[0]}",
                         where=node.describe())
    f = x.dtype.type if x.dtype.kind == "f" else np.float32
    _, c, h, w = x.shape
    y = np.zeros((rois.shape[0], c, oh, ow))
    for r, (box, b) in enumerate(zip(rois.astype(f), idx)):
        shift = f(0.5) if half_pixel else f(0)
        x0, y0, x1, y1 = (box * f(scale) - shift).tolist()
        rw, rh = f(x1) - f(x0), f(y1) - f(y0)
        if not half_pixel:
            rw, rh = max(rw, f(1)), max(rh, f(1))
        gh = ratio if ratio > 0 else int(np.ceil(rh / f(oh)))
        gw = ratio if ratio > 0 else int(np.ceil(rw / f(ow)))
        ys, xs = _samples(y0, rh / f(oh), gh, oh, f), _samples(x0, rw / f(ow), gw, ow, f)
        yl, yh, wyl, wyh, yin = _corners(ys, h, f)  # (oh, gh)
        xl, xh, wxl, wxh, xin = _corners(xs, w, f)  # (ow, gw)
        ok = yin[:, :, None, None] & xin[None, None, :, :]  # (oh, gh, ow, gw)
        img = x[b].astype(np.float64)
        terms = [img[:, ya[:, :, None, None], xa[None, None, :, :]] * (wy[:, :, None, None] * wx[None, None] * ok)
                 for ya, wy in ((yl, wyl), (yh, wyh)) for xa, wx in ((xl, wxl), (xh, wxh))]
        if mode == "avg":
            y[r] = sum(terms).sum(axis=(2, 4)) / max(gh * gw, 1)
        elif gh * gw:
            y[r] = np.max(np.maximum.reduce(terms), axis=(2, 4))
    return [y.astype(x.dtype)]


def box_corners(boxes: np.ndarray, center: bool) -> tuple[np.ndarray, ...]:
    """(y_min, x_min, y_max, x_max) of (..., 4) boxes in float32."""
    b = boxes.astype(np.float32)
    if center:
        xc, yc, hw, hh = b[..., 0], b[..., 1], b[..., 2] / np.float32(2), b[..., 3] / np.float32(2)
        return yc - hh, xc - hw, yc + hh, xc + hw
    return (np.minimum(b[..., 0], b[..., 2]), np.minimum(b[..., 1], b[..., 3]),
            np.maximum(b[..., 0], b[..., 2]), np.maximum(b[..., 1], b[..., 3]))


def iou_above(corners, i: int, kept: list[int], threshold: np.float32) -> bool:
    """Whether box i overlaps any kept box with IoU > threshold (onnxruntime's checks and order)."""
    if not kept:
        return False
    y0, x0, y1, x1 = corners
    k = np.asarray(kept)
    ix0, ix1 = np.maximum(x0[i], x0[k]), np.minimum(x1[i], x1[k])
    iy0, iy1 = np.maximum(y0[i], y0[k]), np.minimum(y1[i], y1[k])
    inter = (ix1 - ix0) * (iy1 - iy0)
    a1 = (x1[i] - x0[i]) * (y1[i] - y0[i])
    a2 = (x1[k] - x0[k]) * (y1[k] - y0[k])
    union = a1 + a2 - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        iou = inter / union
    hit = (ix1 > ix0) & (iy1 > iy0) & (inter > 0) & (a1 > 0) & (a2 > 0) & (union > 0) & (iou > threshold)
    return bool(np.any(hit))


@reference("NonMaxSuppression")
def non_max_suppression(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    ins = list(inputs) + [None] * (5 - len(inputs))
    boxes, scores = ins[0], ins[1]
    if boxes.ndim != 3 or boxes.shape[2] != 4 or scores.ndim != 3 or scores.shape[0] != boxes.shape[0] \
            or scores.shape[2] != boxes.shape[1]:
        raise ShapeError(f"boxes {boxes.shape} and scores {scores.shape} do not fit (B, n, 4) and (B, C, n)",
                         where=node.describe())
    scalar = lambda a, default: default if a is None or a.size == 0 else a.reshape(-1)[0]  # noqa: E731
    max_out = max(int(scalar(ins[2], 0)), 0)
    iou_t = np.float32(scalar(ins[3], 0))
    score_t = None if ins[4] is None or ins[4].size == 0 else np.float32(ins[4].reshape(-1)[0])
    center = int(node.attrs.get("center_point_box", 0)) == 1
    rows = []
    for b in range(boxes.shape[0]):
        corners = box_corners(boxes[b], center)
        for c in range(scores.shape[1]):
            s = scores[b, c].astype(np.float32)
            order = np.lexsort((np.arange(s.size), -s))
            if score_t is not None:
                order = order[s[order] > score_t]
            kept: list[int] = []
            for i in order:
                if len(kept) >= max_out:
                    break
                if not iou_above(corners, int(i), kept, iou_t):
                    kept.append(int(i))
            rows += [(b, c, i) for i in kept]
    return [np.array(rows, np.int64).reshape(-1, 3)]

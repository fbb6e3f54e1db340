"""Reference kernel: Resize (opset 19 semantics; Upsample and Resize-10 import to it).

Interpolation is separable, so the kernel resizes one axis at a time: map every output
coordinate to an input coordinate (coordinate_transformation_mode), then either pick one
input index (nearest) or gather a few neighbours and weight them (linear / cubic, with
antialias widening the filter when downsampling). Math in float64; integer outputs are
rounded and saturated.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from polykit.compiler.ir.graph import Node
from polykit.compiler.ops.nn.resize import check_resize_attrs, output_sizes, resize_axes
from polykit.errors import ShapeError
from polykit.compiler.ops.references import reference


def _present(a: np.ndarray | None) -> np.ndarray | None:
    return None if a is None or a.size == 0 else a


def source_coordinates(mode: str, out_len: int, in_len: int, scale: float, roi: tuple[float, float]
                       ) -> tuple[np.ndarray, np.ndarray | None]:
    """Input coordinate of each output index, and (tf_crop_and_resize) which fall outside."""
    y = np.arange(out_len, dtype=np.float64)
    # align_corners, pytorch_half_pixel and tf_crop_and_resize divide by the integer output
    # length (the spec's length_resized, as onnxruntime and PyTorch do); half_pixel_symmetric
    # needs the un-rounded one.
    if mode == "align_corners":
        return (np.zeros(out_len) if out_len == 1 else y * (in_len - 1) / (out_len - 1)), None
    if mode == "asymmetric":
        return y / scale, None
    if mode == "pytorch_half_pixel":
        return (np.zeros(out_len) if out_len == 1 else (y + 0.5) / scale - 0.5), None
    if mode == "half_pixel":
        return (y + 0.5) / scale - 0.5, None
    if mode == "half_pixel_symmetric":
        offset = in_len / 2 * (1 - out_len / (scale * in_len))
        return offset + (y + 0.5) / scale - 0.5, None
    if mode == "tf_half_pixel_for_nn":
        return (y + 0.5) / scale, None
    # tf_crop_and_resize
    start, end = roi
    if out_len == 1:
        x = np.full(out_len, (end - start) * (in_len - 1) / 2)
    else:
        x = y * (end - start) * (in_len - 1) / (out_len - 1)
    x = x + start * (in_len - 1)
    return x, (x < 0) | (x > in_len - 1)


def _nearest_index(x: np.ndarray, rule: str) -> np.ndarray:
    base = np.floor(x)
    ratio = x - base
    if rule == "round_prefer_floor":
        up = ratio > 0.5
    elif rule == "round_prefer_ceil":
        up = ratio >= 0.5
    elif rule == "floor":
        up = np.zeros(x.shape, dtype=bool)
    else:  # ceil
        up = ratio > 0
    return (base + up).astype(np.int64)


def _cubic_weight(t: np.ndarray, a: float) -> np.ndarray:
    t = np.abs(t)
    inner = ((a + 2) * t - (a + 3)) * t * t + 1
    outer = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return np.where(t <= 1, inner, np.where(t < 2, outer, 0.0))


def _filter(mode: str, ratio: np.ndarray, scale: float, attrs) -> tuple[np.ndarray, np.ndarray]:
    """Neighbour offsets (relative to the pixel left of x) and their weights per output."""
    antialias = bool(attrs.get("antialias", 0)) and scale < 1
    s = min(scale, 1.0) if antialias else 1.0
    reach = 1.0 if mode == "linear" else 2.0
    start = int(math.floor(-reach / s)) + 1
    offsets = np.arange(start, 2 - start)
    t = (offsets[None, :] - ratio[:, None]) * s
    if mode == "linear":
        weights = np.clip(1 - np.abs(t), 0, 1)
    else:
        weights = _cubic_weight(t, float(attrs.get("cubic_coeff_a", -0.75)))
    if antialias:
        weights = weights / weights.sum(axis=1, keepdims=True)
    return offsets, weights


def resize_axis(data: np.ndarray, axis: int, out_len: int, scale: float, roi: tuple[float, float], attrs
                ) -> np.ndarray:
    """Resize float64 `data` along one axis."""
    in_len = data.shape[axis]
    mode = attrs.get("mode", "nearest")
    coord_mode = attrs.get("coordinate_transformation_mode", "half_pixel")
    x, outside = source_coordinates(coord_mode, out_len, in_len, scale, roi)
    if mode == "nearest":
        index = np.clip(_nearest_index(x, attrs.get("nearest_mode", "round_prefer_floor")), 0, in_len - 1)
        result = np.take(data, index, axis=axis)
    else:
        base = np.floor(x)
        ratio = x - base
        whole = ratio == 0  # an exact pixel counts as ratio 1 from its left neighbour
        ratio = np.where(whole, 1.0, ratio)
        base = (base - whole).astype(np.int64)
        offsets, weights = _filter(mode, ratio, scale, attrs)
        index = base[:, None] + offsets[None, :]
        if attrs.get("exclude_outside", 0):
            weights = np.where((index < 0) | (index >= in_len), 0.0, weights)
            total = weights.sum(axis=1, keepdims=True)
            weights = weights / np.where(total == 0, 1.0, total)
        gathered = np.take(data, np.clip(index, 0, in_len - 1), axis=axis)
        shape = (1,) * axis + weights.shape + (1,) * (data.ndim - axis - 1)
        result = (gathered * weights.reshape(shape)).sum(axis=axis + 1)
    if outside is not None and outside.any():
        mask = outside.reshape((1,) * axis + (out_len,) + (1,) * (data.ndim - axis - 1))
        result = np.where(mask, float(attrs.get("extrapolation_value", 0.0)), result)
    return result


def _cast(y: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return np.clip(np.round(y), info.min, info.max).astype(dtype)
    return y.astype(dtype)


@reference("Resize")
def resize(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x = inputs[0]
    roi, scales, sizes = (_present(inputs[i]) if len(inputs) > i else None for i in (1, 2, 3))
    attrs = node.attrs
    check_resize_attrs(attrs, node.describe())
    axes = resize_axes(attrs, x.ndim, node.describe())
    if (scales is None) == (sizes is None):
        raise ShapeError("Resize needs exactly one of 'scales' and 'sizes'", where=node.describe(),
                         hint="leave the other input empty (\"\")")
    given = scales if scales is not None else sizes
    if given.size != len(axes):
        raise ShapeError(f"{'scales' if scales is not None else 'sizes'} has {given.size} values for "
                         f"{len(axes)} resized axes", where=node.describe())
    dims, factors = output_sizes([x.shape[a] for a in axes], scales, sizes,
                                 attrs.get("keep_aspect_ratio_policy", "stretch"))
    if scales is not None and any(f <= 0 for f in factors):
        raise ShapeError(f"scales {scales.tolist()} must be positive", where=node.describe())
    rois = [(0.0, 1.0)] * len(axes)
    if roi is not None:
        roi = roi.astype(np.float64).ravel()
        if roi.size != 2 * len(axes):
            raise ShapeError(f"roi has {roi.size} values, expected {2 * len(axes)}", where=node.describe())
        rois = [(roi[i], roi[len(axes) + i]) for i in range(len(axes))]
    crop = attrs.get("coordinate_transformation_mode", "half_pixel") == "tf_crop_and_resize"
    y = x.astype(np.float64)
    for a, out_len, scale, r in sorted(zip(axes, dims, factors, rois)):
        if out_len == x.shape[a] and math.isclose(scale, 1.0) and (not crop or r == (0.0, 1.0)):
            continue
        if out_len == 0 or x.shape[a] == 0:
            y = np.zeros(y.shape[:a] + (out_len,) + y.shape[a + 1:])
            continue
        y = resize_axis(y, a, out_len, scale, r, attrs)
    return [_cast(y, x.dtype)]

"""Signal ops: DFT, STFT, HannWindow / HammingWindow / BlackmanWindow, MelWeightMatrix.

Canonical DFT is the opset-20 form with its axis always given: inputs (x, dft_length, axis).
DFT-17 had `axis` as an attribute (default 1); importers put the axis (or DFT-20's default,
-2) in a constant input. Complex
tensors are real tensors whose last dim is 2 (real, imaginary); a real signal may have a
last dim of 1. Sizes that come from input values (dft_length, window size, frame counts,
mel bins) make the output shape known only when those inputs are constants or build-time
input values.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from polykit.compiler.ir import dtypes
from polykit.compiler.ir.graph import Node
from polykit.compiler.ops.tensor.shape_ops import const_ints, unknown_dims
from polykit.compiler.ops.registry import ImportContext, InferContext, importer, shape_rule

WINDOW_OPS = ("HannWindow", "HammingWindow", "BlackmanWindow")
#: window -> (a0, a1, a2): w[n] = a0 - a1 cos(2 pi n / N) + a2 cos(4 pi n / N), N = size (periodic)
#: or size - 1 (symmetric)
WINDOW_COEFFS = {"HannWindow": (0.5, 0.5, 0.0), "HammingWindow": (25 / 46, 21 / 46, 0.0),
                 "BlackmanWindow": (0.42, 0.5, 0.08)}


def _axis_input(node: Node, ctx: ImportContext, axis: int) -> None:
    while len(node.inputs) < 2:
        node.inputs.append("")
    node.inputs[2:] = [ctx.add_constant(np.array(axis, np.int64), prefix=f"{node.name}_axis")]


@importer("DFT", since=17)
def _dft_axis_attr_to_input(node: Node, ctx: ImportContext) -> None:
    """DFT-17: `axis` attribute (default 1) -> int64 input 2 (the DFT-20 form)."""
    _axis_input(node, ctx, int(node.attrs.pop("axis", 1)))


@importer("DFT", since=20)
def _dft_default_axis(node: Node, ctx: ImportContext) -> None:
    """DFT-20: an omitted axis input becomes the default -2."""
    if len(node.inputs) < 3 or not node.inputs[2]:
        _axis_input(node, ctx, -2)


@dataclass(frozen=True)
class DftGeometry:
    """One DFT along `axis` of x (rank r, last dim 1 or 2): `length` points, `out_len`
    outputs along the axis, complex output unless it is an inverse one-sided (real) transform."""

    axis: int
    length: int
    out_len: int
    out_complex: bool


def dft_geometry(attrs, in_shape, axis: int, dft_length: int | None) -> DftGeometry:
    """The geometry of a DFT node on x of `in_shape` (ValueError with the reason if it does not fit)."""
    rank = len(in_shape)
    if rank < 2 or in_shape[-1] not in (1, 2):
        raise ValueError(f"the input has shape {tuple(in_shape)}; its last dim must be 1 (real) or 2 (complex)")
    if not -rank <= axis < rank or axis % rank == rank - 1:
        raise ValueError(f"axis {axis} must name a signal dim of a rank-{rank} input (not the last one)")
    axis %= rank
    inverse, onesided = bool(attrs.get("inverse", 0)), bool(attrs.get("onesided", 0))
    n_in = in_shape[axis]
    if dft_length is None:
        dft_length = 2 * (n_in - 1) if inverse and onesided else n_in
    if dft_length < 1:
        raise ValueError(f"dft_length {dft_length} must be positive")
    if inverse and onesided:
        return DftGeometry(axis, dft_length, dft_length, False)
    return DftGeometry(axis, dft_length, dft_length // 2 + 1 if onesided else dft_length, True)


@shape_rule("DFT")
def _dft(ctx: InferContext):
    shape = ctx.shape(0)
    axis = const_ints(ctx, 2) if ctx.has(2) else [-2]
    length = const_ints(ctx, 1) if ctx.has(1) else None
    if shape is None:
        return [(ctx.dtype(0), None)]
    if axis is None or (ctx.has(1) and length is None) or not all(isinstance(d, int) for d in shape):
        return [(ctx.dtype(0), unknown_dims(len(shape)))]
    try:
        g = dft_geometry(ctx.node.attrs, shape, axis[0], length[0] if length else None)
    except ValueError as exc:
        raise ctx.fail(f"DFT: {exc}") from None
    out = list(shape)
    out[g.axis], out[-1] = g.out_len, 2 if g.out_complex else 1
    return [(ctx.dtype(0), tuple(out))]


@dataclass(frozen=True)
class StftGeometry:
    frame_length: int
    n_frames: int
    bins: int


def stft_geometry(onesided: bool, signal_len: int, step: int, window_len: int | None,
                  frame_length: int | None) -> StftGeometry:
    """Frames of an STFT (ValueError with the reason when they do not fit the signal)."""
    length = frame_length if frame_length is not None else window_len if window_len is not None else signal_len
    if window_len is not None and window_len != length:
        raise ValueError(f"the window has {window_len} values for frames of {length}")
    if step < 1 or length < 1 or length > signal_len:
        raise ValueError(f"frame_step {step} and frame length {length} do not fit a signal of {signal_len} samples")
    return StftGeometry(length, 1 + (signal_len - length) // step, length // 2 + 1 if onesided else length)


@shape_rule("STFT")
def _stft(ctx: InferContext):
    shape = ctx.shape(0)
    if shape is not None and (len(shape) != 3 or shape[-1] not in (1, 2, None) or isinstance(shape[-1], str)):
        raise ctx.fail(f"STFT signal of shape {tuple(shape)} (expected [batch, length, 1 or 2])")
    step, length = const_ints(ctx, 1), const_ints(ctx, 3)
    window = ctx.shape(2)
    if shape is None or step is None or (ctx.has(3) and length is None) or not isinstance(shape[1], int) \
            or (window is not None and not isinstance(window[0], int)):
        return [(ctx.dtype(0), (None if shape is None else shape[0], None, None, 2))]
    try:
        g = stft_geometry(bool(ctx.attr("onesided", 1)), shape[1], step[0], None if window is None else window[0],
                          length[0] if length else None)
    except ValueError as exc:
        raise ctx.fail(f"STFT: {exc}") from None
    return [(ctx.dtype(0), (shape[0], g.n_frames, g.bins, 2))]


def output_dtype(attrs, where: str) -> np.dtype:
    """The `output_datatype` attribute of a window / MelWeightMatrix node (default float32)."""
    return dtypes.to_numpy(int(attrs.get("output_datatype", 1)), where=where)


@shape_rule(*WINDOW_OPS)
def _window(ctx: InferContext):
    size = const_ints(ctx, 0)
    if size is not None and (len(size) != 1 or size[0] < 0):
        raise ctx.fail(f"{ctx.node.op_type} size must be one non-negative value, got {size}")
    return [(output_dtype(ctx.node.attrs, ctx.node.describe()), (None,) if size is None else (size[0],))]


@shape_rule("MelWeightMatrix")
def _mel_weight_matrix(ctx: InferContext):
    bins, dft_length = const_ints(ctx, 0), const_ints(ctx, 1)
    shape = (None, None) if bins is None or dft_length is None else (dft_length[0] // 2 + 1, bins[0])
    if bins is not None and dft_length is not None and (bins[0] < 1 or dft_length[0] < 1):
        raise ctx.fail(f"MelWeightMatrix needs num_mel_bins and dft_length >= 1, got {bins[0]} and {dft_length[0]}")
    return [(output_dtype(ctx.node.attrs, ctx.node.describe()), shape)]

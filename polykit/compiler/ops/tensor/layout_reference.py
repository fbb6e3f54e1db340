"""Reference kernels: Transpose, Concat, Split, Slice, Tile, Pad, ReverseSequence."""

from __future__ import annotations

import numpy as np

from polykit.compiler.ops.tensor.layout import slice_bounds, split_sizes
from polykit.errors import RuntimeInputError
from polykit.compiler.ops.references import reference


def _ints(value) -> list[int]:
    return [int(v) for v in np.asarray(value).reshape(-1)]


@reference("Transpose")
def transpose(node, inputs):
    x = inputs[0]
    perm = node.attrs.get("perm", list(range(x.ndim))[::-1])
    return [np.ascontiguousarray(np.transpose(x, perm))]


@reference("Concat")
def concat(node, inputs):
    xs = [x for x in inputs if x is not None]
    return [np.concatenate(xs, axis=node.attrs["axis"])]


@reference("Split")
def split(node, inputs):
    x = inputs[0]
    axis = node.attrs.get("axis", 0)
    axis = axis + x.ndim if axis < 0 else axis
    explicit = _ints(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else None
    sizes = split_sizes(x.shape[axis], len(node.outputs), explicit)
    if sizes is None:
        raise RuntimeInputError(
            f"cannot split axis {axis} of shape {x.shape} into {explicit or len(node.outputs)} parts",
            where=node.describe(), hint="the split sizes must add up to the axis length",
        )
    bounds = np.cumsum([0] + sizes)
    index = [slice(None)] * x.ndim
    outs = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        index[axis] = slice(int(lo), int(hi))
        outs.append(np.array(x[tuple(index)]))
    return outs


@reference("Slice")
def slice_(node, inputs):
    x = inputs[0]
    starts, ends = _ints(inputs[1]), _ints(inputs[2])
    axes = _ints(inputs[3]) if len(inputs) > 3 and inputs[3] is not None else list(range(len(starts)))
    steps = _ints(inputs[4]) if len(inputs) > 4 and inputs[4] is not None else [1] * len(starts)
    index = [slice(None)] * x.ndim
    for a, s, e, st in zip(axes, starts, ends, steps):
        if st == 0:
            raise RuntimeInputError("a slice step is 0", where=node.describe(), hint="steps must be non-zero")
        a = a + x.ndim if a < 0 else a
        lo, hi = slice_bounds(x.shape[a], s, e, st)
        index[a] = slice(lo, None if hi < 0 else hi, st)
    return [np.array(x[tuple(index)])]


@reference("Tile")
def tile(node, inputs):
    return [np.tile(inputs[0], _ints(inputs[1]))]


_NUMPY_PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "edge", "wrap": "wrap"}


@reference("Pad")
def pad(node, inputs):
    x, pads = inputs[0], _ints(inputs[1])
    value = inputs[2] if len(inputs) > 2 and inputs[2] is not None and np.asarray(inputs[2]).size else None
    axes = _ints(inputs[3]) if len(inputs) > 3 and inputs[3] is not None else list(range(x.ndim))
    mode = node.attrs.get("mode", "constant")
    widths = [[0, 0] for _ in range(x.ndim)]
    for k, a in enumerate(axes):
        widths[a % x.ndim] = [pads[k], pads[k + len(axes)]]
    # Negative pads crop; do that first, then pad with the positive parts.
    crop = tuple(slice(max(-b, 0), x.shape[i] - max(-e, 0)) for i, (b, e) in enumerate(widths))
    x = x[crop]
    positive = [(max(b, 0), max(e, 0)) for b, e in widths]
    if mode == "constant":
        fill = np.asarray(value).reshape(-1)[0] if value is not None else 0
        return [np.pad(x, positive, mode="constant", constant_values=fill)]
    if x.size == 0 and any(b or e for b, e in positive):
        raise RuntimeInputError(f"cannot {mode}-pad an empty tensor", where=node.describe(),
                                hint="use mode='constant' for empty inputs")
    return [np.pad(x, positive, mode=_NUMPY_PAD_MODES[mode])]


@reference("ReverseSequence")
def reverse_sequence(node, inputs):
    x, lengths = inputs[0], _ints(inputs[1])
    batch_axis, time_axis = node.attrs.get("batch_axis", 1), node.attrs.get("time_axis", 0)
    out = np.array(x)
    for b, n in enumerate(lengths):
        src = [slice(None)] * x.ndim
        src[batch_axis] = b
        src[time_axis] = slice(0, n)
        dst = list(src)
        dst[time_axis] = slice(n - 1, None, -1) if n > 0 else slice(0, 0)
        out[tuple(src)] = x[tuple(dst)]
    return [out]

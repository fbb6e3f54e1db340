"""Reference kernels: CenterCropPad (a zero-filled window copy), Col2Im (sums of overlapping
blocks, float64 for floats)."""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir.dtypes import is_float
from polykit.compiler.ops.nn.image import col2im_geometry, crop_pad_axes, crop_pad_offsets
from polykit.errors import RuntimeInputError
from polykit.compiler.ops.references import reference


def _ints(value) -> list[int]:
    return [int(v) for v in np.asarray(value).reshape(-1)]


@reference("CenterCropPad")
def center_crop_pad(node, inputs):
    x, sizes = inputs[0], _ints(inputs[1])
    axes = crop_pad_axes(node.attrs, x.ndim)
    if len(sizes) != len(axes):
        raise RuntimeInputError(f"CenterCropPad shape {sizes} for axes {axes}", where=node.describe(),
                                hint="give one size per axis")
    out_shape, offsets = crop_pad_offsets(x.shape, sizes, axes)
    out = np.zeros(out_shape, x.dtype)
    src, dst = [], []
    for dim, size, off in zip(x.shape, out_shape, offsets):
        lo, hi = max(0, -off), min(size, dim - off)  # output range that reads inside the input
        dst.append(slice(lo, max(lo, hi)))
        src.append(slice(lo + off, max(lo, hi) + off))
    out[tuple(dst)] = x[tuple(src)]
    return [out]


@reference("Col2Im")
def col2im(node, inputs):
    x = inputs[0]
    g = col2im_geometry(node.attrs, _ints(inputs[1]), _ints(inputs[2]))
    why = g.check(x.shape)
    if why:
        raise RuntimeInputError(f"Col2Im: {why}", where=node.describe(), hint="see the ONNX Col2Im spec")
    n = len(g.image)
    batch, k = x.shape[0], int(np.prod(g.block, dtype=np.int64))
    channels = x.shape[1] // k
    wide = x.astype(np.float64) if is_float(x.dtype) else x.astype(np.int64)
    cols = wide.reshape(batch, channels, *g.block, *g.n_blocks)
    padded = np.zeros((batch, channels, *[g.image[i] + g.pads[i] + g.pads[i + n] for i in range(n)]), wide.dtype)
    for offset in np.ndindex(*g.block):
        window = tuple(slice(offset[i] * g.dilations[i], offset[i] * g.dilations[i] + g.strides[i] * (g.n_blocks[i] - 1) + 1,
                             g.strides[i]) for i in range(n))
        padded[(slice(None), slice(None), *window)] += cols[(slice(None), slice(None), *offset)]
    crop = tuple(slice(g.pads[i], g.pads[i] + g.image[i]) for i in range(n))
    return [padded[(slice(None), slice(None), *crop)].astype(x.dtype)]

"""CenterCropPad and Col2Im: shape rules (sizes come from int inputs, so the output shape is
known when those inputs are constants or build-time input values), and the geometry the
reference and cuda kernels share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from polykit.compiler.ops.tensor.shape_ops import const_ints, unknown_dims
from polykit.compiler.ops.registry import InferContext, shape_rule


def crop_pad_axes(attrs, rank: int) -> list[int]:
    """CenterCropPad's `axes` (default: every axis), non-negative."""
    axes = attrs.get("axes")
    return list(range(rank)) if axes is None else [int(a) % rank if rank else 0 for a in axes]


def crop_pad_offsets(in_shape: Sequence[int], sizes: Sequence[int], axes: Sequence[int]) -> tuple[list[int], list[int]]:
    """(output shape, per-axis offset) of CenterCropPad: output index o reads input index
    o + offset (zero when that is outside the input). Cropping starts at (dim - size) // 2;
    padding puts (size - dim) // 2 zeros before the data."""
    out, offsets = list(in_shape), [0] * len(in_shape)
    for a, size in zip(axes, sizes):
        dim = in_shape[a]
        out[a] = size
        offsets[a] = (dim - size) // 2 if size <= dim else -((size - dim) // 2)
    return out, offsets


@shape_rule("CenterCropPad")
def _center_crop_pad(ctx: InferContext):
    rank = ctx.rank(0)
    if rank is None:
        return [(ctx.dtype(0), None)]
    axes_attr = ctx.node.attrs.get("axes")
    for a in axes_attr or ():
        ctx.normalize_axis(int(a), rank)
    axes = crop_pad_axes(ctx.node.attrs, rank)
    if len(set(axes)) != len(axes):
        raise ctx.fail(f"CenterCropPad axes {list(axes_attr)} repeat an axis")
    sizes = const_ints(ctx, 1)
    if sizes is None:
        shape = list(ctx.shape(0))
        return [(ctx.dtype(0), tuple(None if i in axes else d for i, d in enumerate(shape)))]
    if len(sizes) != len(axes) or any(s < 0 for s in sizes):
        raise ctx.fail(f"CenterCropPad shape {sizes} for axes {axes}",
                       hint="give one non-negative size per axis (every axis when `axes` is absent)")
    out = list(ctx.shape(0))
    for a, s in zip(axes, sizes):
        out[a] = s
    return [(ctx.dtype(0), tuple(out))]


@dataclass(frozen=True)
class Col2ImGeometry:
    """Col2Im of [N, C * prod(block), L] into [N, C, *image] (n spatial dims)."""

    image: tuple[int, ...]
    block: tuple[int, ...]
    dilations: tuple[int, ...]
    pads: tuple[int, ...]  # begins then ends, 2 * n
    strides: tuple[int, ...]

    @property
    def n_blocks(self) -> tuple[int, ...]:
        """Sliding positions per spatial dim (their product must be L)."""
        n = len(self.image)
        return tuple((self.image[i] + self.pads[i] + self.pads[i + n] - self.dilations[i] * (self.block[i] - 1) - 1)
                     // self.strides[i] + 1 for i in range(n))

    def check(self, in_shape: Sequence[int]) -> str | None:
        """Why an input of `in_shape` does not fit (None when it does)."""
        n = len(self.image)
        if len(self.block) != n or len(self.dilations) != n or len(self.strides) != n or len(self.pads) != 2 * n:
            return (f"image_shape {list(self.image)}, block_shape {list(self.block)}, dilations "
                    f"{list(self.dilations)}, strides {list(self.strides)} and pads {list(self.pads)} disagree on "
                    "the number of spatial dims")
        if min(self.block + self.dilations + self.strides, default=1) < 1 or min(self.pads, default=0) < 0:
            return "block_shape, dilations and strides must be positive and pads non-negative"
        if len(in_shape) != 3:
            return f"the input has shape {tuple(in_shape)}, expected [N, C * prod(block_shape), L]"
        k = 1
        for b in self.block:
            k *= b
        blocks = 1
        for b in self.n_blocks:
            blocks *= b
        if in_shape[1] % k or in_shape[2] != blocks or min(self.n_blocks) < 1:
            return (f"input of shape {tuple(in_shape)} does not fit image_shape {list(self.image)} with block_shape "
                    f"{list(self.block)}: dim 1 must be a multiple of {k} and dim 2 equal {blocks} "
                    f"({' x '.join(map(str, self.n_blocks))} sliding blocks)")
        return None


def col2im_geometry(attrs, image: Sequence[int], block: Sequence[int]) -> Col2ImGeometry:
    n = len(image)
    return Col2ImGeometry(tuple(image), tuple(block), tuple(int(d) for d in attrs.get("dilations", [1] * n)),
                          tuple(int(p) for p in attrs.get("pads", [0] * 2 * n)),
                          tuple(int(s) for s in attrs.get("strides", [1] * n)))


@shape_rule("Col2Im")
def _col2im(ctx: InferContext):
    image, block, x = const_ints(ctx, 1), const_ints(ctx, 2), ctx.shape(0)
    if image is None or block is None or x is None:
        n = ctx.shape(1)[0] if ctx.shape(1) is not None and isinstance(ctx.shape(1)[0], int) else None
        return [(ctx.dtype(0), None if n is None else unknown_dims(n + 2))]
    geometry = col2im_geometry(ctx.node.attrs, image, block)
    if all(isinstance(d, int) for d in x):
        why = geometry.check(x)
        if why:
            raise ctx.fail(f"Col2Im: {why}")
    k = 1
    for b in block:
        k *= b
    c = x[1] // k if isinstance(x[1], int) else None
    return [(ctx.dtype(0), (x[0], c, *image))]

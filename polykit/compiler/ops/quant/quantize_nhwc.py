"""ai.polykit QuantizeNHWC: an INT8 plan's image input in one pass (fuse_quantize_nhwc makes it).

Inputs: X float32 [N, C, H, W], Y_scale float32 (one value), Y_zero_point int8 / uint8 (one
value) or float8_e4m3fn (+0: an --fp8 plan's image, quantized with saturation). Attribute `channels` (>= C). Output [N, H, W, channels] of the zero point's type:
QuantizeLinear(X, Y_scale, Y_zero_point) transposed to NHWC, channels C.. filled with the zero
point (a real 0): what QuantizeLinear -> Transpose(0, 2, 3, 1) -> Pad of the last dim computed.

Optional attributes `block` (s >= 1, default 1) and `pads` ([top, left, bottom, right] >= 0, default
zeros) fold a space-to-depth stem's Pad and SpaceToDepth (space_to_depth_stems) into it: the output is
[N, (H + top + bottom) / s, (W + left + right) / s, channels] with channels >= C * s * s, the value
QuantizeLinear(SpaceToDepth(Pad(X, pads, 0), blocksize=s)) (ONNX's DCR order: channel (bh * s + bw) * C + c)
transposed to NHWC, channels C * s * s.. the zero point. Both absent: the plain form above.
"""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir.dtypes import EXTENDED_TYPES
from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.ops.registry import InferContext, shape_rule

KIND = "QuantizeNHWC"
INT8_DTYPES = (np.dtype(np.int8), np.dtype(np.uint8))
#: the output types: the 8-bit integers, and float8_e4m3fn where ml_dtypes is (None in a lean runtime)
OUT_DTYPES = INT8_DTYPES + tuple(t for t in (EXTENDED_TYPES.get(17),) if t is not None)


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def block_and_pads(attrs) -> tuple[int, tuple[int, int, int, int]] | str:
    """(block, (top, left, bottom, right)) of a QuantizeNHWC's attributes (defaults 1 and zeros), or what is
    wrong with them."""
    block, pads = attrs.get("block", 1), attrs.get("pads", (0, 0, 0, 0))
    if not _is_int(block) or block < 1:
        return f"block is {block!r}: a positive integer, the space-to-depth block size"
    if (not isinstance(pads, (list, tuple, np.ndarray)) or len(pads) != 4
            or not all(_is_int(p) and p >= 0 for p in pads)):
        return f"pads is {pads!r}: four non-negative integers [top, left, bottom, right]"
    return int(block), tuple(int(p) for p in pads)


@shape_rule(KIND, domain=POLYKIT_DOMAIN)
def _quantize_nhwc(ctx: InferContext):
    if ctx.n_inputs != 3 or not all(ctx.has(i) for i in range(3)):
        raise ctx.fail("QuantizeNHWC takes X, Y_scale and Y_zero_point", hint="fuse_quantize_nhwc builds it")
    if ctx.dtype(0) not in (None, np.dtype(np.float32)) or ctx.dtype(2) not in (None, *OUT_DTYPES):
        raise ctx.fail(f"X {ctx.dtype(0)} / zero point {ctx.dtype(2)}: float32 X and an int8 / uint8 / float8_e4m3fn "
                       "zero point",
                       hint="other QuantizeLinear forms stay QuantizeLinear")
    shape, channels = ctx.shape(0), ctx.attr("channels")
    if not _is_int(channels) or channels < 1:
        raise ctx.fail(f"channels is {channels!r}: a positive integer, the padded output channels",
                       hint="fuse_quantize_nhwc builds it")
    geometry = block_and_pads(ctx.node.attrs)
    if isinstance(geometry, str):
        raise ctx.fail(geometry, hint="fuse_quantize_nhwc builds it from a Pad and a SpaceToDepth")
    s, (top, left, bottom, right) = geometry
    if shape is not None and len(shape) != 4:
        raise ctx.fail(f"X has rank {len(shape)}; QuantizeNHWC takes [N, C, H, W]")
    if shape is not None and isinstance(shape[1], int) and channels < shape[1] * s * s:
        raise ctx.fail(f"channels {channels} < X's {shape[1]} x block {s} squared",
                       hint="channels counts the padded output channels, at least C * block * block")
    if shape is None:
        return [(ctx.dtype(2), None)]
    if s == 1 and not any((top, left, bottom, right)):
        return [(ctx.dtype(2), (shape[0], shape[2], shape[3], channels))]
    dims = []
    for name, d, lo, hi in (("height", shape[2], top, bottom), ("width", shape[3], left, right)):
        if not isinstance(d, int):
            dims.append(None)
            continue
        if (d + lo + hi) % s:
            raise ctx.fail(f"padded {name} {d} + {lo} + {hi} is not divisible by block {s}",
                           hint="pads must make whole blocks, as SpaceToDepth after a Pad requires")
        dims.append((d + lo + hi) // s)
    return [(ctx.dtype(2), (shape[0], dims[0], dims[1], channels))]

"""ai.polykit QuantizeNHWC: an INT8 plan's image input in one pass (fuse_quantize_nhwc makes it).

Inputs: X float32 [N, C, H, W], Y_scale float32 (one value), Y_zero_point int8 / uint8 (one
value) or float8_e4m3fn (+0: an --fp8 plan's image, quantized with saturation). Attribute `channels` (>= C). Output [N, H, W, channels] of the zero point's type:
QuantizeLinear(X, Y_scale, Y_zero_point) transposed to NHWC, channels C.. filled with the zero
point (a real 0): what QuantizeLinear -> Transpose(0, 2, 3, 1) -> Pad of the last dim computed.
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


@shape_rule(KIND, domain=POLYKIT_DOMAIN)
def _quantize_nhwc(ctx: InferContext):
    if ctx.n_inputs != 3 or not all(ctx.has(i) for i in range(3)):
        raise ctx.fail("QuantizeNHWC takes X, Y_scale and Y_zero_point", hint="fuse_quantize_nhwc builds it")
    if ctx.dtype(0) not in (None, np.dtype(np.float32)) or ctx.dtype(2) not in (None, *OUT_DTYPES):
        raise ctx.fail(f"X {ctx.dtype(0)} / zero point {ctx.dtype(2)}: float32 X and an int8 / uint8 / float8_e4m3fn "
                       "zero point",
                       hint="other QuantizeLinear forms stay QuantizeLinear")
    shape, channels = ctx.shape(0), ctx.attr("channels")
    if isinstance(channels, bool) or not isinstance(channels, (int, np.integer)) or channels < 1:
        raise ctx.fail(f"channels is {channels!r}: a positive integer, the padded output channels",
                       hint="fuse_quantize_nhwc builds it")
    if shape is not None and len(shape) != 4:
        raise ctx.fail(f"X has rank {len(shape)}; QuantizeNHWC takes [N, C, H, W]")
    if shape is not None and isinstance(shape[1], int) and channels < shape[1]:
        raise ctx.fail(f"channels {channels} < X's {shape[1]}", hint="channels counts the padded output channels")
    out = None if shape is None else (shape[0], shape[2], shape[3], channels)
    return [(ctx.dtype(2), out)]

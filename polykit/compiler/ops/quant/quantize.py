"""QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear: shape/dtype rules.

Granularity follows the scale's shape: scalar or one value (per tensor: `axis` is ignored, as
onnxruntime's quantizer relies on for rank-1 biases), 1-D (per `axis`) or, with
block_size > 0, the input's rank (blocked along `axis`). Every opset form (10..25) reads
the same in this canonical form, so no importer is needed; float8, 4-bit and 2-bit types
are numpy dtypes through ml_dtypes (polykit.compiler.ir.dtypes).
"""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir import dtypes
from polykit.compiler.ops.registry import InferContext, shape_rule

UINT8 = np.dtype(np.uint8)
QUANT_DTYPES = tuple(np.dtype(t) for t in (np.uint8, np.int8, np.uint16, np.int16, np.int32))
#: ml_dtypes types QuantizeLinear also produces (ONNX 21+: float8, 4-bit; 25: 2-bit)
LOW_BIT_QUANT = ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "uint4", "int4",
                 "float4_e2m1fn", "uint2", "int2")


def quantized_dtype(ctx: InferContext) -> np.dtype | None:
    """QuantizeLinear's output dtype: the zero point's, else output_dtype, else uint8."""
    if ctx.has(2):
        return ctx.dtype(2)
    code = int(ctx.attr("output_dtype", 0))
    return dtypes.to_numpy(code, where=ctx.node.describe()) if code else UINT8


def _check_scale(ctx: InferContext) -> None:
    x, scale = ctx.shape(0), ctx.shape(1)
    if x is None or scale is None:
        return
    block = int(ctx.attr("block_size", 0))
    if block > 0:
        if len(scale) != len(x):
            raise ctx.fail(f"blocked quantization needs a scale of X's rank {len(x)}, got shape {scale}")
        return
    if len(scale) > 1:
        raise ctx.fail(f"scale must be a scalar or 1-D (per axis), got shape {scale}",
                       hint="set block_size for blocked quantization")
    if len(scale) == 1 and len(x) > 0 and scale[0] != 1:  # one value is per tensor: `axis` is not read
        axis = ctx.normalize_axis(int(ctx.attr("axis", 1)), len(x))
        if isinstance(scale[0], int) and isinstance(x[axis], int) and scale[0] not in (1, x[axis]):
            raise ctx.fail(f"per-axis scale has {scale[0]} entries, axis {axis} of X has {x[axis]}")


@shape_rule("QuantizeLinear")
def _quantize(ctx: InferContext):
    _check_scale(ctx)
    out = quantized_dtype(ctx)
    if out is not None and out not in QUANT_DTYPES[:4] and out.name not in LOW_BIT_QUANT:
        raise ctx.fail(f"QuantizeLinear to {out} is not supported", hint="quantize to (u)int8/16, (u)int4/2, float8 or float4")
    return [(out, ctx.shape(0))]


@shape_rule("DequantizeLinear")
def _dequantize(ctx: InferContext):
    _check_scale(ctx)
    code = int(ctx.attr("output_dtype", 0))
    out = dtypes.to_numpy(code, where=ctx.node.describe()) if code else ctx.dtype(1)
    return [(out, ctx.shape(0))]


@shape_rule("DynamicQuantizeLinear")
def _dynamic_quantize(ctx: InferContext):
    return [(UINT8, ctx.shape(0)), (np.dtype(np.float32), ()), (UINT8, ())]

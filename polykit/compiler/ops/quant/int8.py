"""polykit's INT8 layers (domain ai.polykit): QConv and QMatMul, shape rules and the record.

The Q/DQ folding pass (polykit.compiler.passes.fold_qdq) makes them from DequantizeLinear ->
Conv/Gemm/MatMul -> [elementwise epilogue] -> [QuantizeLinear]; docs/INT8.md is the contract
every target's tactics implement. Inputs, in this order (QUANT_ARITY slots, then the epilogue's
extra inputs, as in docs/FUSION.md):

  0 X             int8/uint8 activation (QConv: N, C, *spatial; QMatMul: [..., M, K]; QConvNHWC: N, H, W, C)
  1 X_zero_point  scalar of X's dtype
  2 W             int8/uint8 (QConv: constant M, C/group, *kernel; QMatMul: [..., K, N], constant or not;
                  QConvNHWC: constant M, kH, kW, C)
  3 W_zero_point  scalar or one per output channel (QConv: M; QMatMul: N), W's dtype
  4 scale         float32, scalar or one per output channel: the accumulator's dequantization
                  multiplier, x_scale * w_scale (Gemm's alpha folded in)
  5 B             float32 bias, one per output channel, or ""
  6 Y_scale       float32 scalar, or "": the output stays float32 (dequantized)
  7 Y_zero_point  int8/uint8 scalar (the output's dtype), "" exactly when Y_scale is

  acc = sum (X - X_zero_point) * (W - W_zero_point)           exact, in int32
  v   = epilogue(acc * scale + B)                             float32, per output channel
  Y   = saturate(round_half_even(v / Y_scale) + Y_zero_point)  or v when Y_scale is ""

attrs: the base op's attributes (QConv: Conv's strides/pads/dilations/group/...; QMatMul:
none), optionally "epilogue" {"input", "body"} as in FUSION.md (its result is the last step's
output: the layer's output, or with Y_scale a body-local name that is requantized),
"fused_from", and "symmetric" (1: int8 X and W whose constant zero points are all 0, stamped by
to_channels_last on QConvNHWC; kernels that skip the zero-point terms require it).

FP8 layers are the same kinds with X and W float8_e4m3fn (both; zero points float8 zeros, which
only name the type, as in ONNX): acc = sum X * W, each product exact in float32 (two 4-bit
significands), summed in float32 by the GPU (the cpu sums exactly and rounds once); Y_zero_point
float8_e4m3fn makes the output e4m3, QuantizeLinear's saturating round to nearest even. Their
storage precision is "fp8" (plan/records.storage_precision), so the INT8 tactics never take them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from polykit.compiler.ir.dtypes import EXTENDED_TYPES
from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.ops.nn.channels_last import TO_NCHW, TO_NHWC, permuted
from polykit.compiler.ops.nn.fused import decode_json_attrs, infer_body
from polykit.compiler.ops.registry import InferContext, find_shape_rule, importer, shape_rule

#: INT8 layer kind -> the float op whose shape rule gives its raw output
INT8_KINDS = {"QConv": "Conv", "QMatMul": "MatMul", "QConvNHWC": "Conv"}
#: the channels-last INT8 kind (to_channels_last makes it from QConv): X [N, H, W, C], W KRSC
#: [M, kH, kW, C], Y and the epilogue's extra inputs [N, OH, OW, M]; the record is QConv's otherwise
NHWC_KIND = "QConvNHWC"
#: fixed input slots before the epilogue's extra inputs
QUANT_ARITY = 8
X, X_ZERO_POINT, W, W_ZERO_POINT, SCALE, BIAS, Y_SCALE, Y_ZERO_POINT = range(QUANT_ARITY)
INT8_DTYPES = (np.dtype(np.int8), np.dtype(np.uint8))
F32 = np.dtype(np.float32)
F16 = np.dtype(np.float16)
#: the FP8 layers' operand type (None in a lean runtime without ml_dtypes)
FP8 = EXTENDED_TYPES.get(17)
#: every operand type of the QConv / QMatMul family
QUANT_DTYPES = INT8_DTYPES + ((FP8,) if FP8 is not None else ())


def is_int8_layer(layer: Any) -> bool:
    """Whether a layer or node is one of the INT8 kinds (a LayerDesc's `kind` or a Node's `op_type`)."""
    kind = getattr(layer, "kind", None) or getattr(layer, "op_type", "")
    return layer.domain == POLYKIT_DOMAIN and kind in INT8_KINDS


def is_fp8_layer(layer: Any) -> bool:
    """Whether a LayerDesc is an FP8 layer: an INT8-family kind whose stamped X is float8_e4m3fn."""
    dtypes = getattr(layer, "in_dtypes", ())
    return is_int8_layer(layer) and bool(dtypes) and dtypes[X] == "float8_e4m3fn"


#: the attribute saying X and W are int8 with zero points 0 (module docstring)
SYMMETRIC = "symmetric"
#: the attribute saying a requantized output's zero point is a constant 0 (int8_out.cuh's Y_ZERO 0: rint(v / y_scale)
#: saturated, by one conversion with its packing)
Y_SYMMETRIC = "y_symmetric"


def epilogue_result(epilogue: dict[str, Any]) -> str:
    """The name of an epilogue's float32 result: its last step's output."""
    return epilogue["body"][-1]["outputs"][0]


def base_of(node: Node) -> Node:
    """The float op a QConv/QMatMul's integer product follows (X and W; Conv's attributes)."""
    attrs = {k: v for k, v in node.attrs.items() if k not in ("epilogue", "fused_from", SYMMETRIC, Y_SYMMETRIC)}
    return Node(INT8_KINDS[node.op_type], [node.inputs[X], node.inputs[W]], ["acc"], attrs, name=node.name)


def _per_channel(ctx: InferContext, slot: int, channels: Any, what: str) -> None:
    shape = ctx.shape(slot)
    if shape is None:
        return
    size = int(np.prod(shape)) if all(isinstance(d, int) for d in shape) else None
    if len(shape) > 1 or (size is not None and isinstance(channels, int) and size not in (1, channels)):
        raise ctx.fail(f"{what} has shape {tuple(shape)}; it must be a scalar or one value per output "
                       f"channel ({channels})", hint="docs/INT8.md lists the INT8 layers' inputs")


@shape_rule(*INT8_KINDS, domain=POLYKIT_DOMAIN)
def infer_int8(ctx: InferContext):
    node = ctx.node
    if ctx.n_inputs < QUANT_ARITY:
        raise ctx.fail(f"an INT8 layer has {QUANT_ARITY} fixed inputs, this one {ctx.n_inputs}")
    for slot, what in ((X, "X"), (W, "W")):
        if ctx.dtype(slot) is not None and ctx.dtype(slot) not in QUANT_DTYPES:
            raise ctx.fail(f"{what} is {ctx.dtype(slot)}, not int8, uint8 or float8_e4m3fn")
    if ctx.dtype(X) is not None and ctx.dtype(W) is not None and (ctx.dtype(X) == FP8) != (ctx.dtype(W) == FP8):
        raise ctx.fail(f"X is {ctx.dtype(X)} and W {ctx.dtype(W)}: an FP8 layer has both float8_e4m3fn")
    for slot, of in ((X_ZERO_POINT, X), (W_ZERO_POINT, W)):
        if ctx.dtype(slot) is not None and ctx.dtype(slot) != ctx.dtype(of):
            raise ctx.fail(f"input {slot}'s zero point is {ctx.dtype(slot)}, its tensor {ctx.dtype(of)}")
    if any(ctx.has(s) and ctx.dtype(s) not in (None, F32) for s in (SCALE, BIAS, Y_SCALE)):
        raise ctx.fail("scale, bias and Y_scale must be float32")
    if ctx.has(Y_SCALE) != ctx.has(Y_ZERO_POINT):
        raise ctx.fail("Y_scale and Y_zero_point come together (requantized output) or not at all")
    base = base_of(node)
    rule = find_shape_rule("", base.op_type)
    nhwc = node.op_type == NHWC_KIND
    operands = [ctx.shape(X), ctx.shape(W)]
    if nhwc:
        if any(s is not None and len(s) != 4 for s in operands):
            raise ctx.fail(f"{NHWC_KIND} is 2-D: X and W have rank 4, not {[len(s) for s in operands if s]}")
        operands = [permuted(s, TO_NCHW) for s in operands]
    base_ctx = InferContext(base, [F32, F32], operands, [None, None])
    (_, shape), *_ = rule(base_ctx)
    if nhwc:
        shape = permuted(shape, TO_NHWC)
    if shape is not None and len(shape) >= 2:
        channels = shape[1] if node.op_type == "QConv" else shape[-1]
        for slot, what in ((W_ZERO_POINT, "W_zero_point"), (SCALE, "scale"), (BIAS, "B")):
            _per_channel(ctx, slot, channels, what)
    out: tuple = (F32, shape)
    epilogue = node.attrs.get("epilogue")
    if epilogue:
        env = {ctx.node.inputs[i]: (ctx.dtype(i), ctx.shape(i), ctx.const(i))
               for i in range(QUANT_ARITY, ctx.n_inputs) if ctx.has(i)}
        env[epilogue["input"]] = (F32, shape, None)
        env = infer_body(ctx, epilogue["body"], env)
        out = env[epilogue_result(epilogue)][:2]
        # float32, or (an --fp16 build's Cast after the layer taken in: passes/absorb_quantized_casts.py) a
        # float32 result cast to float16 as the layer's output
        if out[0] not in (None, F32) and (out[0] != F16 or ctx.has(Y_SCALE)):
            raise ctx.fail(f"the epilogue ends in {out[0]}; an INT8 layer's epilogue computes float32 (or casts "
                           "its float32 output to float16 last)")
    if ctx.has(Y_SCALE):
        return [(ctx.dtype(Y_ZERO_POINT), out[1])]
    return [out]


for _kind in INT8_KINDS:
    importer(_kind, since=1, domain=POLYKIT_DOMAIN)(decode_json_attrs)

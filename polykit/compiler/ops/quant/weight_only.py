"""WeightOnlyMatMul (domain ai.polykit): a MatMul/Gemm whose weight stays packed (W4A16, W8A16).

passes.fold_weight_only makes it from `DequantizeLinear(Wq) -> MatMul | Gemm` where Wq is a
constant int4, uint4, float4_e2m1fn, int8 or uint8 weight quantized per tensor, per output
channel or in blocks along K (ONNX 21's block_size), as LLM exporters emit it. The weight keeps
its 4 or 8 bits in the plan (two 4-bit values a byte) and is dequantized inside the kernel's
main loop, where TensorRT's weight-only GEMMs dequantize; docs/INT8.md ("Weight-only
quantization") is the contract.

Inputs (WO_ARITY slots):

  0 X           float32 / float16 / bfloat16 activation [..., M, K]
  1 W           uint8 [N, row_bytes]: row n holds W[n, 0..K-1] (the weight transposed to K-contiguous
                rows), 4-bit types two a byte (element k in byte k // 2, the low nibble for even k:
                ONNX's packing), 8-bit types one a byte; rows padded with zero bytes to a multiple of
                ROW_ALIGN bytes (row_bytes = padded_row_bytes(K, bits))
  2 scale       [N, blocks] in X's dtype (DequantizeLinear's scale type), blocks = ceil(K / block_size)
  3 zero_point  [N, blocks] int8 (int4 / int8 weights) or uint8 (uint4 / uint8), or "": zero
  4 B           bias [N] in X's dtype, or "" (Gemm's C)

attrs: weight_type (WEIGHT_TYPES), block_size (K for per-channel and per-tensor weights), K.

  w[n, k] = (value(W[n, k]) - zero_point[n, k // block_size]) * scale[n, k // block_size]
            in scale's dtype, rounded once: DequantizeLinear's value
  Y       = X(float32) @ w(float32).T + B(float32), accumulated in float32, rounded once to X's dtype
"""

from __future__ import annotations

from typing import Any

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.ops.registry import InferContext, shape_rule

KIND = "WeightOnlyMatMul"
WO_ARITY = 5
X, W, SCALE, ZERO_POINT, BIAS = range(WO_ARITY)
#: weight element types -> bits
WEIGHT_TYPES = {"int4": 4, "uint4": 4, "float4_e2m1fn": 4, "int8": 8, "uint8": 8}
#: the activation (and scale) types the layer takes
ACTIVATION_TYPES = ("float32", "float16", "bfloat16")
#: packed weight rows are padded to this many bytes (16-byte vector loads in the cuda kernel)
ROW_ALIGN = 16
U8 = np.dtype(np.uint8)
F32 = np.dtype(np.float32)
#: float4_e2m1fn's 16 codes (sign, 2 exponent bits, 1 mantissa bit)
FP4_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def is_weight_only(layer: Any) -> bool:
    """Whether a layer or node is a WeightOnlyMatMul."""
    kind = getattr(layer, "kind", None) or getattr(layer, "op_type", "")
    return layer.domain == POLYKIT_DOMAIN and kind == KIND


def padded_row_bytes(k: int, bits: int) -> int:
    """Bytes of one packed weight row of K elements, padded to ROW_ALIGN."""
    raw = (k * bits + 7) // 8
    return max(ROW_ALIGN, -(-raw // ROW_ALIGN) * ROW_ALIGN)


def weight_codes(q: np.ndarray) -> np.ndarray:
    """The bit patterns (uint8) of quantized weight values: 4-bit types in the low nibble."""
    name = q.dtype.name
    if name not in WEIGHT_TYPES:
        raise ValueError(f"not a weight-only type: {name}")
    if name in ("int8", "uint8"):
        return q.view(U8)
    return (q.view(U8) if name == "float4_e2m1fn" else q.astype(np.int8).view(U8)) & np.uint8(0x0F)


def pack_rows(codes: np.ndarray, bits: int) -> np.ndarray:
    """[N, K] codes -> [N, padded_row_bytes(K, bits)] packed bytes (module docstring's layout)."""
    n, k = codes.shape
    out = np.zeros((n, padded_row_bytes(k, bits)), U8)
    if bits == 8:
        out[:, :k] = codes
        return out
    even = codes[:, 0::2]
    odd = np.zeros_like(even)
    odd[:, :k // 2] = codes[:, 1::2]
    out[:, :even.shape[1]] = even | (odd << 4)
    return out


def unpack_values(packed: np.ndarray, k: int, weight_type: str) -> np.ndarray:
    """[N, row_bytes] packed rows -> [N, K] values as float32 (exact: every code is a small
    integer or an fp4 value)."""
    if weight_type in ("int8", "uint8"):
        return packed[:, :k].view(np.dtype(weight_type)).astype(F32)
    codes = np.empty((packed.shape[0], 2 * packed.shape[1]), U8)
    codes[:, 0::2] = packed & 0x0F
    codes[:, 1::2] = packed >> 4
    codes = codes[:, :k]
    if weight_type == "float4_e2m1fn":
        return FP4_VALUES[codes]
    values = codes.astype(np.int16)
    return (((values ^ 8) - 8) if weight_type == "int4" else values).astype(F32)


@shape_rule(KIND, domain=POLYKIT_DOMAIN)
def infer_weight_only(ctx: InferContext):
    if ctx.n_inputs != WO_ARITY:
        raise ctx.fail(f"a {KIND} has {WO_ARITY} inputs, this one {ctx.n_inputs}")
    weight_type = str(ctx.attr("weight_type", ""))
    if weight_type not in WEIGHT_TYPES:
        raise ctx.fail(f"weight_type {weight_type!r} is not one of {', '.join(WEIGHT_TYPES)}")
    k, block = int(ctx.attr("K", 0)), int(ctx.attr("block_size", 0))
    if k < 1 or block < 1:
        raise ctx.fail(f"K ({k}) and block_size ({block}) must be positive")
    x, w = ctx.shape(X), ctx.shape(W)
    x_dtype = ctx.dtype(X)
    if x_dtype is not None and x_dtype.name not in ACTIVATION_TYPES:
        raise ctx.fail(f"X is {x_dtype}; the layer takes {', '.join(ACTIVATION_TYPES)}")
    if ctx.dtype(SCALE) is not None and x_dtype is not None and ctx.dtype(SCALE) != x_dtype:
        raise ctx.fail(f"scale is {ctx.dtype(SCALE)}, X {x_dtype}: they are one type")
    if ctx.dtype(W) not in (None, U8):
        raise ctx.fail(f"W is {ctx.dtype(W)}, not the packed uint8 rows")
    if ctx.has(ZERO_POINT) and ctx.dtype(ZERO_POINT) not in (None, np.dtype(np.int8), U8):
        raise ctx.fail(f"zero_point is {ctx.dtype(ZERO_POINT)}, not int8 or uint8")
    if ctx.has(BIAS) and ctx.dtype(BIAS) is not None and x_dtype is not None and ctx.dtype(BIAS) != x_dtype:
        raise ctx.fail(f"B is {ctx.dtype(BIAS)}, X {x_dtype}: they are one type")
    if w is not None and (len(w) != 2 or (isinstance(w[1], int) and w[1] != padded_row_bytes(k, WEIGHT_TYPES[weight_type]))):
        raise ctx.fail(f"W has shape {tuple(w)}; packed rows of K={k} {weight_type} values take "
                       f"{padded_row_bytes(k, WEIGHT_TYPES[weight_type])} bytes")
    n = w[0] if w is not None else None
    blocks = -(-k // block)
    for slot, what in ((SCALE, "scale"), (ZERO_POINT, "zero_point")):
        shape = ctx.shape(slot) if ctx.has(slot) else None
        if shape is not None and tuple(shape) != (n, blocks):
            raise ctx.fail(f"{what} has shape {tuple(shape)}, not [N, ceil(K / block_size)] = [{n}, {blocks}]")
    if ctx.has(BIAS) and ctx.shape(BIAS) is not None and tuple(ctx.shape(BIAS)) != (n,):
        raise ctx.fail(f"B has shape {tuple(ctx.shape(BIAS))}, not [N] = [{n}]")
    if x is None:
        return [(x_dtype, None)]
    if len(x) < 2 or (isinstance(x[-1], int) and x[-1] != k):
        raise ctx.fail(f"X has shape {tuple(x)}; the layer takes [..., M, K] with K = {k}")
    return [(x_dtype, tuple(x[:-1]) + (n,))]

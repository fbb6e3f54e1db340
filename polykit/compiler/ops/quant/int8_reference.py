"""Reference kernels of the INT8 layers (ai.polykit QConv, QMatMul; polykit.compiler.ops.quant.int8).

Exact: the zero points are subtracted and the products summed in int64 (the int32 accumulator
of a GPU kernel, without its overflow), then the accumulator is dequantized per output channel
in float32 (`dequantize`: three IEEE roundings, the GPU kernels' arithmetic), the float32
epilogue runs, and QuantizeLinear's own reference requantizes (round half to even, saturate).
`run_int8` takes the integer product as a function so the cpu tactics share everything but the
product (kernels/cpu/int8.py).

FP8 layers (float8_e4m3fn X and W) run the same code on float64 operands: every product of two
e4m3 values is a multiple of 2**-18 below 2**18, so float64 sums of up to 2**17 of them
(FP8_EXACT_REDUCTION) are exact; the exact accumulator then rounds once to float32 (a GPU's float32
sum in another order differs from it by at most K * 2**-24 * sum |x * w|).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.ops.nn.channels_last import TO_NCHW, TO_NHWC
from polykit.compiler.ops.quant.int8 import (BIAS, FP8, INT8_KINDS, NHWC_KIND, QUANT_ARITY, SCALE, W, W_ZERO_POINT, X, X_ZERO_POINT,
                                       Y_SCALE, Y_ZERO_POINT, base_of, epilogue_result)
from polykit.compiler.ops.nn.conv_reference import conv_accumulate
from polykit.compiler.ops.nn.fused_reference import evaluate_body
from polykit.compiler.ops.quant.quantize_reference import quantize_linear
from polykit.compiler.ops.references import reference

#: longest FP8 reduction (K, or C/group x kernel taps) whose float64 sum is exact (module docstring)
FP8_EXACT_REDUCTION = 1 << 17

#: product(base node, centered X, centered W) -> the accumulator (integers, in X's dtype)
Product = Callable[[Node, np.ndarray, np.ndarray], np.ndarray]


def integer_product(base: Node, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Conv or matmul of int64 operands, in int64 (no BLAS: slow and exact); of float64 operands
    holding FP8 values, in float64 (exact too, module docstring)."""
    if base.op_type == "Conv":
        return conv_accumulate(base, x, w)
    return np.matmul(x, w)


def channel_param(p: np.ndarray, rank: int, axis: int) -> np.ndarray:
    """A scalar or per-channel parameter shaped to broadcast along `axis` of a rank-`rank` array."""
    p = np.asarray(p)
    if p.size == 1:
        return p.reshape(())
    return p.reshape([-1 if i == axis % rank else 1 for i in range(rank)])


def dequantize(acc: np.ndarray, scale: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """float32(acc) * scale + bias in float32, each step rounded (no fused multiply-add): the
    accumulator's integers (|acc| < 2**31) round once to float32, then the product, then the sum."""
    value = acc.astype(np.float32) * np.asarray(scale, np.float32)
    return value if bias is None else value + np.asarray(bias, np.float32)


def run_int8(node: Node, inputs: Sequence[np.ndarray | None], product: Product, acc: type = np.int64
             ) -> list[np.ndarray]:
    """An INT8 layer with `product` computing the accumulator from operands centered in `acc`."""
    x, w = inputs[X], inputs[W]
    conv, nhwc = node.op_type != "QMatMul", node.op_type == NHWC_KIND
    x = x.astype(acc) - np.asarray(inputs[X_ZERO_POINT]).astype(acc).reshape(())
    w = w.astype(acc) - channel_param(inputs[W_ZERO_POINT], w.ndim, 0 if conv else -1).astype(acc)
    if nhwc:  # the product of the NCHW operands, its result back in NHWC
        raw = np.transpose(product(base_of(node), np.transpose(x, TO_NCHW), np.transpose(w, TO_NCHW)), TO_NHWC)
    else:
        raw = product(base_of(node), x, w)
    axis = 1 if conv and not nhwc else -1
    value = dequantize(raw, channel_param(inputs[SCALE], raw.ndim, axis),
                       None if inputs[BIAS] is None else channel_param(inputs[BIAS], raw.ndim, axis))
    epilogue = node.attrs.get("epilogue")
    if epilogue:
        env = {name: arr for name, arr in zip(node.inputs[QUANT_ARITY:], inputs[QUANT_ARITY:]) if name}
        env[epilogue["input"]] = value
        value = evaluate_body(epilogue["body"], env)[epilogue_result(epilogue)]
    if inputs[Y_SCALE] is None:
        return [value]
    requantize = Node("QuantizeLinear", ["v", "y_scale", "y_zero_point"], [node.outputs[0]], name=node.name)
    return quantize_linear(requantize, [value, inputs[Y_SCALE], inputs[Y_ZERO_POINT]])


@reference(*INT8_KINDS, domain=POLYKIT_DOMAIN)
def int8_layer(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    fp8 = FP8 is not None and inputs[X].dtype == FP8
    return run_int8(node, inputs, integer_product, acc=np.float64 if fp8 else np.int64)

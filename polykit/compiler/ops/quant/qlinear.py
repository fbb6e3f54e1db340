"""QLinearMatMul and QLinearConv: importers that rewrite them into ops polykit runs on both
targets (no shape rule or kernel of their own).

    c = MatMulInteger(a, b, a_zp, b_zp)  |  ConvInteger(x, w, x_zp, w_zp) (+ int32 bias)
    y = QuantizeLinear(Cast(c, double) * (double(a_scale) * double(b_scale) / double(y_scale)), 1.0, y_zp)

ONNX's reference order of operations (the integer product, the factor, their product in
float64, then round half to even, + zero point, saturate), except that the factor is formed in
float64 rather than in the scales' dtype: one rounding, the same on both targets (the cuda
target fuses pointwise chains with fp32 intermediates, which would round an fp16 factor
differently). The two differ only for a value within ~1e-5 of a rounding boundary.
Per-row scales of `a` ([M]) and per-output-channel scales of `w` ([M]) are reshaped to broadcast.
"""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir.graph import Node
from polykit.compiler.ops.node_emitter import NodeEmitter
from polykit.compiler.ops.registry import ImportContext, importer
from polykit.errors import ShapeError

CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


def _requantize(emit: NodeEmitter, product: str, scale_a: str, scale_b: str, y_scale: str, y_zp: str) -> list[Node]:
    """y = QuantizeLinear(double(product) * (scale_a * scale_b / y_scale in double), 1.0, y_zp)
    into the node's output."""
    factor = emit("Div", [emit("Mul", [emit.double(scale_a), emit.double(scale_b)]), emit.double(y_scale)])
    scaled = emit("Mul", [emit.double(product), factor])
    emit("QuantizeLinear", [scaled, emit.const(np.float64(1.0), "unit_scale"), y_zp], output=emit.node.outputs[0])
    return emit.nodes


@importer("QLinearMatMul", since=10)
def _qlinear_matmul(node: Node, ctx: ImportContext) -> list[Node]:
    a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp = (list(node.inputs) + [""] * 8)[:8]
    emit = NodeEmitter(node, ctx)
    product = emit("MatMulInteger", [a, b, a_zp, b_zp])
    rows = emit("Unsqueeze", [a_scale, emit.const(np.array([-1], np.int64), "rows")])  # [M] -> [M, 1]
    return _requantize(emit, product, rows, b_scale, y_scale, y_zp)


def _conv_rank(node: Node, ctx: ImportContext, w: str) -> int:
    shape = ctx.graph.value(w).shape
    if shape is not None:
        return len(shape)
    if "kernel_shape" in node.attrs:
        return len(node.attrs["kernel_shape"]) + 2
    raise ShapeError("QLinearConv whose weight rank is unknown at import", where=node.describe(),
                                hint="give the weight a static shape or set kernel_shape")


@importer("QLinearConv", since=10)
def _qlinear_conv(node: Node, ctx: ImportContext) -> list[Node]:
    x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, bias = (list(node.inputs) + [""] * 9)[:9]
    emit = NodeEmitter(node, ctx)
    rank = _conv_rank(node, ctx, w)
    per_channel = emit.const(np.array([1, -1] + [1] * (rank - 2), np.int64), "per_channel")
    attrs = {k: v for k, v in node.attrs.items() if k in CONV_ATTRS}
    product = emit("ConvInteger", [x, w, x_zp, w_zp], **attrs)
    if bias:
        product = emit("Add", [product, emit("Reshape", [bias, per_channel])])
    return _requantize(emit, product, x_scale, emit("Reshape", [w_scale, per_channel]), y_scale, y_zp)

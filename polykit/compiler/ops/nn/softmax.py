"""Softmax, LogSoftmax, Hardmax: one axis (opset 13 form), importer for the older
"coerce to 2D at axis" form, and shape rules."""

from __future__ import annotations

from polykit.compiler.ir.graph import Node
from polykit.compiler.ops.registry import ImportContext, InferContext, importer, shape_rule

SOFTMAX_OPS = ("Softmax", "LogSoftmax", "Hardmax")


def _coerced_2d_to_single_axis(node: Node, ctx: ImportContext) -> list[Node] | None:
    """Opset < 13: the op ran over all dims from `axis` on (input seen as 2D [prod(:axis),
    prod(axis:)]), default axis 1. When X's rank is known and `axis` is its last dim, that
    is the opset-13 op on that axis; otherwise Flatten(axis) -> op(axis=1) -> Reshape to
    Shape(X), which is exact for any rank."""
    axis = int(node.attrs.get("axis", 1))
    x, y = node.inputs[0], node.outputs[0]
    shape = ctx.graph.value(x).shape
    if shape is not None:
        rank = len(shape)
        if rank == 0 or axis % max(rank, 1) == rank - 1:
            node.attrs["axis"] = -1
            return None
    g = ctx.graph
    base = node.name or node.op_type
    x_shape, flat, out2d = g.fresh_name(f"{base}_shape"), g.fresh_name(f"{base}_2d"), g.fresh_name(f"{base}_out2d")
    node.inputs, node.outputs = [flat], [out2d]
    node.attrs["axis"] = 1
    return [
        Node("Shape", [x], [x_shape], {}, name=g.fresh_name(f"{base}_Shape")),
        Node("Flatten", [x], [flat], {"axis": axis}, name=g.fresh_name(f"{base}_Flatten")),
        node,
        Node("Reshape", [out2d, x_shape], [y], {}, name=g.fresh_name(f"{base}_Reshape")),
    ]


def _already_canonical(node: Node, ctx: ImportContext) -> None:
    """Opset >= 13: a single axis, default -1; nothing to change."""


for _op in SOFTMAX_OPS:
    importer(_op, since=1)(_coerced_2d_to_single_axis)
    importer(_op, since=13)(_already_canonical)


@shape_rule(*SOFTMAX_OPS)
def _softmax(ctx: InferContext):
    rank = ctx.rank(0)
    if rank is not None:
        if rank == 0:
            raise ctx.fail(f"{ctx.node.op_type} needs an input of rank >= 1, got a scalar")
        ctx.normalize_axis(int(ctx.attr("axis", -1)), rank)
    return [(ctx.dtype(0), ctx.shape(0))]

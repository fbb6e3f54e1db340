"""Reductions (Reduce*, ArgMax, ArgMin): importers (axes attribute -> input) and shape rules.

Canonical form (ReduceSum since 13, the others since 18): `data`, optional `axes` input
(int64 1-D), attributes keepdims (1) and noop_with_empty_axes (0). No axes (absent or
empty) reduces over all dims unless noop_with_empty_axes=1, which makes the op Identity.
"""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir.graph import Node, Shape
from polykit.compiler.ops.registry import ImportContext, InferContext, importer, shape_rule

REDUCE_OPS = (
    "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
    "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare",
)
#: The opset from which each reduction takes `axes` as an input.
AXES_INPUT_SINCE = {op: (13 if op == "ReduceSum" else 18) for op in REDUCE_OPS}


def _axes_attr_to_input(node: Node, ctx: ImportContext) -> None:
    axes = node.attrs.pop("axes", None)
    if axes is not None:
        node.inputs = [node.inputs[0], ctx.add_constant(np.asarray(axes, dtype=np.int64), prefix=f"{node.name}_axes")]


def _already_canonical(node: Node, ctx: ImportContext) -> None:
    """`axes` is already an input in this opset."""


for _op, _since in AXES_INPUT_SINCE.items():
    importer(_op, since=1)(_axes_attr_to_input)
    importer(_op, since=_since)(_already_canonical)


def reduced_shape(ctx: InferContext, shape: Shape, axes: list[int] | None, keepdims: bool) -> Shape:
    """Shape after reducing `axes` (None = all dims) of `shape`."""
    if shape is None:
        return None
    rank = len(shape)
    picked = set(range(rank)) if axes is None else {ctx.normalize_axis(int(a), rank) for a in axes}
    if keepdims:
        return tuple(1 if i in picked else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in picked)


@shape_rule(*REDUCE_OPS)
def _reduce(ctx: InferContext):
    dtype, shape = ctx.dtype(0), ctx.shape(0)
    keepdims = bool(ctx.attr("keepdims", 1))
    if "axes" in ctx.node.attrs:
        raise ctx.fail(
            "the axes attribute is not part of this op's canonical form",
            hint="import the model through polykit.compiler.graph.onnx_import so axes becomes an input",
        )
    if not ctx.has(1):
        axes = None
    else:
        const = ctx.const(1)
        if const is None:
            return [(dtype, _unknown_axes_shape(ctx, shape, keepdims))]
        axes = [int(a) for a in np.asarray(const).reshape(-1)]
        picked = axes if shape is None else [ctx.normalize_axis(a, len(shape)) for a in axes]
        if len(set(picked)) != len(picked):
            raise ctx.fail(f"axes {axes} repeat a dimension")
    if axes is not None and not axes:
        axes = None
    if axes is None and ctx.attr("noop_with_empty_axes", 0):
        return [(dtype, shape)]
    return [(dtype, reduced_shape(ctx, shape, axes, keepdims))]


def _unknown_axes_shape(ctx: InferContext, shape: Shape, keepdims: bool) -> Shape:
    """Axes known only at run time: keepdims keeps the rank; else the rank follows the axes' length."""
    if shape is None:
        return None
    if keepdims:
        return tuple(None for _ in shape)
    axes_shape = ctx.shape(1)
    if axes_shape is not None and len(axes_shape) == 1 and isinstance(axes_shape[0], int) and axes_shape[0] > 0:
        return tuple(None for _ in range(len(shape) - axes_shape[0]))
    return None


@shape_rule("ArgMax", "ArgMin")
def _arg_reduce(ctx: InferContext):
    shape = ctx.shape(0)
    axis = int(ctx.attr("axis", 0))
    return [(np.dtype(np.int64), reduced_shape(ctx, shape, [axis], bool(ctx.attr("keepdims", 1))))]

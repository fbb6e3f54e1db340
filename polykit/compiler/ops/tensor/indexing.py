"""Indexing ops: Gather, GatherElements, GatherND, ScatterND, ScatterElements (Scatter),
OneHot, NonZero, Compress, Unique."""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir.graph import Node
from polykit.compiler.ops.data_dims import data_dim
from polykit.compiler.ops.tensor.shape_ops import const_ints, dim_product
from polykit.compiler.ops.registry import InferContext, ImportContext, importer, shape_rule

INT64 = np.dtype(np.int64)

REDUCTIONS = ("none", "add", "mul", "max", "min")


@shape_rule("Gather")
def _gather(ctx: InferContext):
    data, idx = ctx.shape(0), ctx.shape(1)
    if data is None or idx is None:
        return [(ctx.dtype(0), None)]
    axis = ctx.normalize_axis(ctx.attr("axis", 0), len(data))
    return [(ctx.dtype(0), data[:axis] + tuple(idx) + data[axis + 1:])]


@shape_rule("GatherElements")
def _gather_elements(ctx: InferContext):
    data, idx = ctx.shape(0), ctx.shape(1)
    if data is not None and idx is not None:
        if len(data) != len(idx):
            raise ctx.fail(f"data rank {len(data)} and indices rank {len(idx)} differ", hint="they must be equal")
        ctx.normalize_axis(ctx.attr("axis", 0), len(data))
    return [(ctx.dtype(0), idx)]


@shape_rule("GatherND")
def _gather_nd(ctx: InferContext):
    data, idx = ctx.shape(0), ctx.shape(1)
    b = ctx.attr("batch_dims", 0)
    if data is None or idx is None or not isinstance(idx[-1] if idx else None, int):
        return [(ctx.dtype(0), None)]
    k = idx[-1]
    if b + k > len(data):
        raise ctx.fail(f"indices address {k} dims after {b} batch dims of a rank-{len(data)} tensor")
    return [(ctx.dtype(0), tuple(idx[:-1]) + tuple(data[b + k:]))]


def _check_reduction(ctx: InferContext) -> None:
    reduction = ctx.attr("reduction", "none")
    if reduction not in REDUCTIONS:
        raise ctx.fail(f"unknown reduction {reduction!r}", hint=f"use one of {', '.join(REDUCTIONS)}")


@shape_rule("ScatterND", "ScatterElements")
def _scatter(ctx: InferContext):
    _check_reduction(ctx)
    return [(ctx.dtype(0), ctx.shape(0))]


@importer("Scatter", since=1)
def _scatter_to_elements(node: Node, ctx: ImportContext):
    """Scatter (deprecated in opset 11) is ScatterElements without a reduction."""
    node.op_type = "ScatterElements"


@shape_rule("OneHot")
def _one_hot(ctx: InferContext):
    idx = ctx.shape(0)
    dtype = ctx.dtype(2)
    if idx is None:
        return [(dtype, None)]
    depth = const_ints(ctx, 1)
    if depth is not None and len(depth) != 1:
        raise ctx.fail(f"depth must be a single value, got {len(depth)}")
    rank = len(idx) + 1
    axis = ctx.normalize_axis(ctx.attr("axis", -1), rank)
    dims = list(idx)
    dims.insert(axis, None if depth is None else depth[0])
    return [(dtype, tuple(dims))]


@shape_rule("NonZero")
def _non_zero(ctx: InferContext):
    value = ctx.const(0)
    if value is not None:
        value = np.asarray(value)
        return [(INT64, (value.ndim, int(np.count_nonzero(value))))]
    x = ctx.shape(0)
    return [(INT64, (ctx.rank(0), data_dim(ctx, "nonzero", dim_product(x) if x is not None else None, 1)))]


@shape_rule("Compress")
def _compress(ctx: InferContext):
    data, cond = ctx.shape(0), ctx.const(1)
    axis = ctx.attr("axis", None)
    bound = ctx.shape(1)[0] if ctx.shape(1) is not None and len(ctx.shape(1)) == 1 else None
    count = data_dim(ctx, "compress", bound, 0 if axis is None or data is None else
                     ctx.normalize_axis(axis, len(data)))
    if cond is not None:
        cond = np.asarray(cond).reshape(-1).astype(bool)
        length = dim_product(data) if axis is None and data is not None else None
        if axis is not None and data is not None:
            length = data[ctx.normalize_axis(axis, len(data))]
        if isinstance(length, int):
            if cond.size > length:
                raise ctx.fail(f"condition has {cond.size} entries for an axis of {length}")
            count = int(cond.sum())
    if axis is None:
        return [(ctx.dtype(0), (count,))]
    if data is None:
        return [(ctx.dtype(0), None)]
    axis = ctx.normalize_axis(axis, len(data))
    return [(ctx.dtype(0), data[:axis] + (count,) + data[axis + 1:])]


@shape_rule("Unique")
def _unique(ctx: InferContext):
    data = ctx.shape(0)
    axis = ctx.attr("axis", None)
    named = next((i for i, o in enumerate(ctx.node.outputs) if o), 0)
    if data is None:
        n = data_dim(ctx, "unique", None, 0, named)
    else:
        at = 0 if axis is None or named else ctx.normalize_axis(axis, len(data))
        n = data_dim(ctx, "unique", dim_product(data) if axis is None else data[ctx.normalize_axis(axis, len(data))],
                     at, named)
    value = ctx.const(0)
    if value is not None:
        value = np.asarray(value)
        if axis is None:
            n = int(np.unique(value.reshape(-1)).size)
        else:
            a = ctx.normalize_axis(axis, value.ndim)
            n = int(np.unique(value, axis=a).shape[a])
    if axis is None:
        y, inverse = (n,), (None if data is None else dim_product(data),)
    elif data is None:
        y, inverse = None, (None,)
    else:
        axis = ctx.normalize_axis(axis, len(data))
        y, inverse = data[:axis] + (n,) + data[axis + 1:], (data[axis],)
    results = [(ctx.dtype(0), y), (INT64, (n,)), (INT64, inverse), (INT64, (n,))]
    return results[: max(ctx.n_outputs, 1)]


"""Shape rules of elementwise ops, by form. The elementwise op table
(polykit.compiler.ops.elementwise_table) registers them: each row names its form."""

from __future__ import annotations

import numpy as np

from polykit.compiler.ops.registry import InferContext, broadcast_shapes

BOOL = np.dtype(np.bool_)


def same_as_input(ctx: InferContext):
    """Unary: X's dtype and shape (Identity: a sequence's or optional's whole Value)."""
    v = ctx.value(0)
    return [v if v.wrap else (ctx.dtype(0), ctx.shape(0))]


def broadcast_first(ctx: InferContext):
    """Binary with broadcasting: the first input's dtype."""
    return [(ctx.dtype(0), broadcast_shapes(ctx, ctx.shape(0), ctx.shape(1)))]


def broadcast_bool(ctx: InferContext):
    """Comparison / logic with broadcasting: bool."""
    return [(BOOL, broadcast_shapes(ctx, ctx.shape(0), ctx.shape(1)))]


def variadic(ctx: InferContext):
    """Min / Max / Sum / Mean: every present input broadcast, the first input's dtype."""
    shapes = [ctx.shape(i) for i in range(ctx.n_inputs) if ctx.has(i)]
    return [(ctx.dtype(0), broadcast_shapes(ctx, *shapes))]


def where(ctx: InferContext):
    """Where(cond, a, b): a's dtype, the three shapes broadcast."""
    return [(ctx.dtype(1), broadcast_shapes(ctx, ctx.shape(0), ctx.shape(1), ctx.shape(2)))]


def predicate(ctx: InferContext):
    """IsNaN / IsInf: bool of X's shape."""
    return [(BOOL, ctx.shape(0))]

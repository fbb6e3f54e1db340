"""Det: shape rule (square matrices in the last two dims; one determinant per leading index)."""

from __future__ import annotations

from polykit.compiler.ops.registry import InferContext, shape_rule


@shape_rule("Det")
def _det(ctx: InferContext):
    shape = ctx.shape(0)
    if shape is None:
        return [(ctx.dtype(0), None)]
    if len(shape) < 2:
        raise ctx.fail(f"Det needs [..., M, M] matrices, got shape {tuple(shape)}")
    m, n = shape[-2], shape[-1]
    if isinstance(m, int) and isinstance(n, int) and m != n:
        raise ctx.fail(f"Det of {m} x {n} matrices (they must be square)")
    return [(ctx.dtype(0), tuple(shape[:-2]))]

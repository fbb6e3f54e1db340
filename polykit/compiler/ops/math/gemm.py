"""Matrix products: Gemm, MatMul, MatMulInteger -- importers and shape rules.

Canonical Gemm is opset 13's: C optional and unidirectionally broadcast to (M, N); the
`broadcast` attribute of opsets 1-6 is dropped (its broadcast=1 form is today's semantics).
MatMul follows numpy.matmul (1-D operands promoted then squeezed, batch dims broadcast).
"""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir.graph import Dim, Node, Shape
from polykit.compiler.ops.registry import ImportContext, InferContext, broadcast_shapes, importer, shape_rule


@importer("Gemm", since=1)
def _gemm_v1(node: Node, ctx: ImportContext) -> None:
    node.attrs.pop("broadcast", None)


def _same_dim(ctx: InferContext, a: Dim, b: Dim, what: str) -> None:
    if isinstance(a, int) and isinstance(b, int) and a != b:
        raise ctx.fail(f"{what}: {a} vs {b}", hint="the inner (reduction) dimensions of a matrix product must match")


@shape_rule("Gemm")
def _gemm(ctx: InferContext):
    a, b = ctx.shape(0), ctx.shape(1)
    for i, s in ((0, a), (1, b)):
        if s is not None and len(s) != 2:
            raise ctx.fail(f"input {i} has rank {len(s)}, Gemm takes 2-D matrices",
                           hint="use MatMul for batched or 1-D products")
    m = k_a = k_b = n = None
    if a is not None:
        m, k_a = (a[1], a[0]) if ctx.attr("transA", 0) else (a[0], a[1])
    if b is not None:
        k_b, n = (b[1], b[0]) if ctx.attr("transB", 0) else (b[0], b[1])
    _same_dim(ctx, k_a, k_b, "Gemm's A and B disagree on K")
    out: Shape = (m, n)
    c = ctx.shape(2)
    if c is not None:
        if len(c) > 2:
            raise ctx.fail(f"C has rank {len(c)}, it must broadcast to (M, N)")
        full = broadcast_shapes(ctx, out, c)
        for got, want in zip(full, out):
            if isinstance(got, int) and isinstance(want, int) and got != want:
                raise ctx.fail(f"C of shape {c} does not broadcast to the output (M, N) = {out}")
    return [(ctx.dtype(0), out)]


def matmul_shape(ctx: InferContext, a: Shape, b: Shape) -> Shape:
    """numpy.matmul's output shape with symbolic dims; ShapeError on a K mismatch."""
    if a is None or b is None:
        return None
    if len(a) == 0 or len(b) == 0:
        raise ctx.fail("MatMul operands must have rank >= 1")
    a2 = (1,) + tuple(a) if len(a) == 1 else tuple(a)
    b2 = tuple(b) + (1,) if len(b) == 1 else tuple(b)
    _same_dim(ctx, a2[-1], b2[-2], f"MatMul of {tuple(a)} and {tuple(b)}: K differs")
    batch = broadcast_shapes(ctx, a2[:-2], b2[:-2])
    out = tuple(batch) + ((a2[-2],) if len(a) > 1 else ()) + ((b2[-1],) if len(b) > 1 else ())
    return out


@shape_rule("MatMul")
def _matmul(ctx: InferContext):
    return [(ctx.dtype(0), matmul_shape(ctx, ctx.shape(0), ctx.shape(1)))]


@shape_rule("MatMulInteger")
def _matmul_integer(ctx: InferContext):
    return [(np.dtype(np.int32), matmul_shape(ctx, ctx.shape(0), ctx.shape(1)))]

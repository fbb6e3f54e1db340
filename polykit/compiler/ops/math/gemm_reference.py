"""Reference kernels: Gemm, MatMul, MatMulInteger (BLAS in `accumulator_dtype`, cast back;
MatMulInteger exact in int64)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from polykit.compiler.ir.graph import Node
from polykit.errors import ShapeError
from polykit.compiler.ops.nn.conv_reference import accumulator_dtype
from polykit.compiler.ops.references import reference


def _matmul(node: Node, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    try:
        return np.matmul(a, b)
    except ValueError as exc:
        raise ShapeError(f"cannot multiply shapes {a.shape} and {b.shape}: {exc}", where=node.describe(),
                         hint="the inner dims must match and batch dims must broadcast") from None


@reference("Gemm")
def gemm(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    return gemm_with(node, inputs, _matmul)


def gemm_with(node: Node, inputs: Sequence[np.ndarray | None], product: Any) -> list[np.ndarray]:
    """Gemm (transA/B, alpha, beta, C) around `product(node, a, b)` in the accumulator dtype."""
    a, b = inputs[0], inputs[1]
    c = inputs[2] if len(inputs) > 2 else None
    acc = accumulator_dtype(a.dtype)
    a2 = a.astype(acc, copy=False)
    b2 = b.astype(acc, copy=False)
    if node.attrs.get("transA", 0):
        a2 = a2.T
    if node.attrs.get("transB", 0):
        b2 = b2.T
    alpha, beta = node.attrs.get("alpha", 1.0), node.attrs.get("beta", 1.0)
    y = product(node, a2, b2)
    if alpha != 1.0:
        y = y * alpha
    if c is not None and beta != 0.0:
        y = y + (c.astype(acc) * beta if beta != 1.0 else c.astype(acc))
    return [y.astype(a.dtype, copy=False)]


@reference("MatMul")
def matmul(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    a, b = inputs[0], inputs[1]
    acc = accumulator_dtype(a.dtype)
    y = _matmul(node, a.astype(acc, copy=False), b.astype(acc, copy=False))
    return [np.asarray(y).astype(a.dtype, copy=False)]


@reference("MatMulInteger")
def matmul_integer(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    a, b = inputs[0].astype(np.int64), inputs[1].astype(np.int64)
    a_zp = inputs[2] if len(inputs) > 2 else None
    b_zp = inputs[3] if len(inputs) > 3 else None
    if a_zp is not None:
        a_zp = a_zp.astype(np.int64)
        # A 1-D a_zero_point holds one value per row of A.
        a = a - (a_zp.reshape(-1, 1) if a_zp.ndim == 1 and a.ndim > 1 else a_zp)
    if b_zp is not None:
        b = b - b_zp.astype(np.int64)  # per column of B broadcasts over the last axis
    return [np.asarray(_matmul(node, a, b)).astype(np.int32)]

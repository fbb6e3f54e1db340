"""cpu matrix-product tactics (MatMul, Gemm and their fused epilogue forms), in float64.

  cpu.gemm.blocked   the product in bands of `block_m` rows of A: each band is converted to
                     float64 and multiplied while it is in cache (cpu.reference converts
                     and multiplies the whole operands at once)
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from polykit.compiler.ir.graph import Node
from polykit.kernels.cpu.base import cpu_tactic, float_layer, plain_or_fused
from polykit.compiler.ops.nn.conv_reference import accumulator_dtype
from polykit.compiler.ops.math.gemm_reference import gemm_with

BLOCK_M = 64


def blocked_product(node: Node, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b (numpy matmul semantics, both at least 2-D) in row bands of BLOCK_M."""
    acc = accumulator_dtype(np.result_type(a.dtype, b.dtype))
    b = b.astype(acc, copy=False)
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    out = np.empty(batch + (a.shape[-2], b.shape[-1]), acc)
    for lo in range(0, a.shape[-2], BLOCK_M):
        out[..., lo:lo + BLOCK_M, :] = np.matmul(a[..., lo:lo + BLOCK_M, :].astype(acc), b)
    return out


def _matrix_layer(layer: Any) -> bool:
    """Float operands of rank >= 2 (vectors keep the reference's numpy semantics)."""
    shapes = layer.in_shapes[:2]
    return plain_or_fused(layer) and float_layer(layer) and len(shapes) == 2 and all(len(s) >= 2 for s in shapes)


@cpu_tactic(["MatMul"], "cpu.gemm.blocked", supports=_matrix_layer, params={"block_m": BLOCK_M})
def matmul_blocked(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    a = inputs[0]
    return [blocked_product(node, a, inputs[1]).astype(a.dtype, copy=False)]


@cpu_tactic(["Gemm"], "cpu.gemm.blocked", supports=_matrix_layer, params={"block_m": BLOCK_M})
def gemm_blocked(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    return gemm_with(node, inputs, blocked_product)

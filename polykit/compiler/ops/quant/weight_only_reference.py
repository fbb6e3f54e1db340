"""Reference kernel of WeightOnlyMatMul (polykit.compiler.ops.quant.weight_only): the oracle.

The whole weight is dequantized (DequantizeLinear's value: (value - zero point) * scale, exact in
float64 and rounded once to the scale's type), then X @ w.T + B runs in float32 and rounds to
X's dtype. kernels/cpu/weight_only.py runs the same per tile of output channels.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.ops.quant.weight_only import BIAS, KIND, SCALE, ZERO_POINT, W, X, unpack_values
from polykit.compiler.ops.references import reference

F32 = np.dtype(np.float32)


def dequantize_rows(packed: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None, k: int, block: int,
                    weight_type: str) -> np.ndarray:
    """[rows, K] float weights of packed rows, in scale's dtype (DequantizeLinear's value)."""
    values = unpack_values(packed, k, weight_type).astype(np.float64)
    index = np.arange(k) // block
    if zero_point is not None:
        values -= zero_point.astype(np.float64)[:, index]
    return (values * scale.astype(np.float64)[:, index]).astype(scale.dtype)


def weight_only_product(node: Node, inputs: Sequence[np.ndarray | None], rows: slice) -> np.ndarray:
    """X (as float32 [M, K]) times the dequantized weight rows `rows`, transposed: [M, len(rows)]."""
    x, packed, scale, zero_point = inputs[X], inputs[W], inputs[SCALE], inputs[ZERO_POINT]
    k = int(node.attrs["K"])
    w = dequantize_rows(packed[rows], scale[rows], None if zero_point is None else zero_point[rows], k,
                        int(node.attrs["block_size"]), str(node.attrs["weight_type"]))
    return np.asarray(x, F32).reshape(-1, k) @ w.astype(F32).T


def finish(x: np.ndarray, y: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """[M, N] float32 products -> the layer's output: + B in float32, X's leading dims and dtype."""
    if bias is not None:
        y = y + bias.astype(F32)
    return y.reshape(*x.shape[:-1], y.shape[-1]).astype(x.dtype)


@reference(KIND, domain=POLYKIT_DOMAIN)
def weight_only_matmul(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    return [finish(inputs[X], weight_only_product(node, inputs, slice(None)), inputs[BIAS])]

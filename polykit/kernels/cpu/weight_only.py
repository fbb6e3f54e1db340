"""cpu tactic of WeightOnlyMatMul (ai.polykit; polykit.compiler.ops.quant.weight_only).

  cpu.weight_only.tiled   the weight dequantized TILE_ROWS output channels at a time and each
                          tile multiplied in float32 (BLAS): the float weight is never held
                          whole (the reference dequantizes all of it), same values otherwise
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.ops.quant.weight_only import BIAS, KIND, W, X, is_weight_only
from polykit.compiler.ops.quant.weight_only_reference import finish, weight_only_product
from polykit.kernels.cpu.base import DECLARED, CpuTactic, computes_in_storage_precision

#: output channels dequantized at a time (bounds the float weight held: TILE_ROWS x K floats)
TILE_ROWS = 256


def run_tiled(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x, n = inputs[X], inputs[W].shape[0]
    y = np.empty((int(np.prod(x.shape[:-1])), n), np.float32)
    for start in range(0, n, TILE_ROWS):
        rows = slice(start, min(start + TILE_ROWS, n))
        y[:, rows] = weight_only_product(node, inputs, rows)
    return [finish(x, y, inputs[BIAS])]


def _supports(layer: Any) -> bool:
    return is_weight_only(layer) and computes_in_storage_precision(layer)


DECLARED.append(CpuTactic("cpu", KIND, "cpu.weight_only.tiled", {"tile_rows": TILE_ROWS}, _supports, priority=5,
                          domain=POLYKIT_DOMAIN, run_fn=run_tiled))

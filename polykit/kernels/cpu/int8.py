"""cpu tactics of the INT8 layers (ai.polykit QConv, QMatMul; docs/INT8.md).

  cpu.reference       the exact integer reference (int64 products, no BLAS: slow)
  cpu.int8.float64    the same integer product through float64 BLAS, exact too: every product
                      of centered int8/uint8 operands is an integer below 2**16 and every
                      partial sum stays below 2**53 (reduction lengths up to 2**37), so float64
                      holds them without rounding; the requantization is the reference's.
                      FP8 layers (float8_e4m3fn operands): float64 sums of e4m3 products are exact
                      up to FP8_EXACT_REDUCTION terms, so this is the reference's arithmetic too
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.ops.quant.int8 import INT8_KINDS, is_fp8_layer, is_int8_layer
from polykit.kernels.cpu.base import DECLARED, CpuTactic, computes_in_storage_precision
from polykit.compiler.ops.quant.int8_reference import FP8_EXACT_REDUCTION, run_int8
from polykit.compiler.ops.nn.conv_reference import conv_accumulate

#: longest reduction (K, or C/group x kernel taps) whose float64 sums stay exact integers
EXACT_REDUCTION = 1 << 37


def float64_product(base: Node, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The integer product of float64 operands holding integers (BLAS; exact, module docstring)."""
    if base.op_type == "Conv":
        return conv_accumulate(base, x, w)
    return np.matmul(x, w)


def run_float64(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    return run_int8(node, inputs, float64_product, acc=np.float64)


def _exact_in_float64(layer: Any) -> bool:
    if not (is_int8_layer(layer) and computes_in_storage_precision(layer)):
        return False
    if len(layer.in_shapes) < 3 or not layer.in_shapes[2]:
        return True  # a layer built by hand: nothing stamped to judge by
    w = layer.in_shapes[2]
    reduction = int(np.prod(w[1:])) if layer.kind != "QMatMul" else int(w[-2])
    return reduction <= (FP8_EXACT_REDUCTION if is_fp8_layer(layer) else EXACT_REDUCTION)


DECLARED.extend(CpuTactic("cpu", kind, "cpu.int8.float64", supports=_exact_in_float64, priority=5,
                          domain=POLYKIT_DOMAIN, run_fn=run_float64) for kind in INT8_KINDS)

"""cpu tactic of the sparse variants of Gemm / MatMul / 1x1 Conv (polykit.compiler.plan.sparse24).

  cpu.gemm.sparse24   the reference of the layer's op (with its epilogue) on the weight
                      decompressed from the plan's compressed form (values + metadata): the
                      check of the compression a cuda plan's sparse kernel reads
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from polykit.compiler.ir.graph import Node
from polykit.kernels.cpu.base import DECLARED, CpuTactic, computes_in_storage_precision, plain_or_fused
from polykit.compiler.plan.sparse24 import ATTR, KINDS, dense_weight


def run_decompressed(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    from polykit.compiler.ops.references import run_reference

    dense = Node(node.op_type, list(node.inputs), list(node.outputs), name=node.name, domain=node.domain,
                 attrs={k: v for k, v in node.attrs.items() if k != ATTR})
    weights = list(inputs)
    weights[1] = dense_weight(node.op_type, node.attrs, inputs[1])
    return run_reference(dense, weights)


def _supports(layer: Any) -> bool:
    return ATTR in layer.attrs and plain_or_fused(layer) and computes_in_storage_precision(layer)


for _kind in KINDS:
    DECLARED.append(CpuTactic("cpu", _kind, "cpu.gemm.sparse24", {"sparse24": 1}, _supports, priority=-5,
                              run_fn=run_decompressed))

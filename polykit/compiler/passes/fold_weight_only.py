"""fold_weight_only: weight-only quantized MatMul/Gemm into WeightOnlyMatMul (ops/quant/weight_only.py).

    DequantizeLinear(Wq, scale[, zero_point]) ─▶ MatMul(X, ·) | Gemm(X, ·, C)

with Wq a constant int4 / uint4 / float4_e2m1fn / int8 / uint8 weight becomes one layer that
reads Wq packed (two 4-bit values a byte, rows K-contiguous) with its scales and zero points, so
the plan holds the 4- or 8-bit weight instead of the float32 one constant folding would make.
Granularities: per tensor, per output channel (1-D scale along N), blocked along K
(block_size > 0, axis = K's axis). X is a float activation of rank >= 2 (MatMul) or 2 (Gemm) in
the scale's type; Gemm needs transA = 0, alpha = 1 and beta = 1, and a constant C of one value
or one per output channel. Anything else (blocks along N, a float weight, an activation weight)
stays as written. It runs after fold_qdq (an int8 activation with an int8 per-channel weight is
an INT8 layer) and before constant folding.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Graph, Node
from polykit.compiler.ops.quant.weight_only import (ACTIVATION_TYPES, KIND, WEIGHT_TYPES, pack_rows,
                                                    weight_codes)
from polykit.compiler.passes.fold_qdq import constant_value
from polykit.compiler.passes.rewrite import replace_nodes



def fold_weight_only(graph: Graph, *, keep: frozenset[str] = frozenset(), fp32_layers: Iterable[str] = ()) -> bool:
    """Replace each foldable DequantizeLinear -> MatMul/Gemm by a WeightOnlyMatMul; True if any.
    Ops named in `fp32_layers` (node names or op types) keep their float weight. `keep` is
    accepted for the pass manager: the op's output keeps its name."""
    pinned = set(fp32_layers)
    producers = graph.producers()
    replacements: dict[int, Node] = {}
    for node in graph.nodes:
        if node.domain or node.op_type not in ("MatMul", "Gemm") or {node.name, node.op_type} & pinned:
            continue
        folded = _weight_only_node(graph, node, producers)
        if folded is not None:
            replacements[id(node)] = folded
    return replace_nodes(graph, replacements, [])


def _weight_only_node(graph: Graph, node: Node, producers: dict[str, Node]) -> Node | None:
    dq = producers.get(node.input(1))
    if dq is None or dq.op_type != "DequantizeLinear" or dq.domain or len(node.outputs) != 1:
        return None
    q = graph.initializers.get(dq.input(0))
    scale = constant_value(graph, dq.input(1), producers)
    if q is None or q.dtype.name not in WEIGHT_TYPES or q.ndim != 2 or scale is None:
        return None
    zero = constant_value(graph, dq.input(2), producers) if dq.input(2) else None
    x = graph.value(node.input(0))
    if (scale.dtype.name not in ACTIVATION_TYPES or x.dtype != scale.dtype or x.shape is None
            or int(dq.attrs.get("output_dtype", 0)) not in (0, _onnx_code(scale.dtype))
            or (zero is not None and (zero.dtype != q.dtype or zero.shape != scale.shape))):
        return None
    k_axis, bias = 0, None
    if node.op_type == "Gemm":
        attrs = node.attrs
        if (len(x.shape) != 2 or int(attrs.get("transA", 0)) or float(attrs.get("alpha", 1.0)) != 1.0
                or float(attrs.get("beta", 1.0)) != 1.0):
            return None
        k_axis = 1 if int(attrs.get("transB", 0)) else 0
        if node.input(2):
            bias = constant_value(graph, node.input(2), producers)
            n = q.shape[1 - k_axis]
            if bias is None or bias.dtype != x.dtype or bias.size not in (1, n):
                return None
            bias = np.broadcast_to(bias.reshape(-1), (n,))
    elif len(x.shape) < 2:
        return None
    k, n = q.shape[k_axis], q.shape[1 - k_axis]
    grouping = _grouping(dq, scale, k_axis, k, n)
    if grouping is None:
        return None
    block, to_rows = grouping
    codes = weight_codes(q)
    codes = codes.T if k_axis == 0 else codes  # rows are output channels, K-contiguous
    zero_rows = None
    if zero is not None and np.any(weight_codes(zero)):
        if q.dtype.name == "float4_e2m1fn":  # ONNX: a float type's zero point is 0
            return None
        zero_rows = to_rows(zero.astype(np.int8 if q.dtype.name in ("int4", "int8") else np.uint8))
    bits = WEIGHT_TYPES[q.dtype.name]

    def add(array: np.ndarray, role: str) -> str:
        return graph.add_initializer(np.ascontiguousarray(array), f"{node.name or node.outputs[0]}_{role}")

    inputs = [node.input(0), add(pack_rows(np.ascontiguousarray(codes), bits), "packed_weight"),
              add(to_rows(scale), "weight_scale"),
              add(zero_rows, "weight_zero_point") if zero_rows is not None else "",
              add(bias, "bias") if bias is not None else ""]
    attrs = {"weight_type": q.dtype.name, "block_size": block, "K": k, "fused_from": [dq.name, node.name]}
    return Node(KIND, inputs, list(node.outputs), attrs, name=node.name, domain=POLYKIT_DOMAIN)


def _grouping(dq: Node, scale: np.ndarray, k_axis: int, k: int, n: int):
    """(block size along K, a function giving a scale-shaped array as [N, blocks]) or None."""
    block = int(dq.attrs.get("block_size", 0))
    axis = int(dq.attrs.get("axis", 1)) % 2
    if scale.size == 1:
        return k, lambda a: np.full((n, 1), a.reshape(()), a.dtype)
    if block == 0 and scale.ndim == 1 and axis != k_axis and scale.shape[0] == n:
        return k, lambda a: a.reshape(n, 1)
    if block > 0 and axis == k_axis and scale.shape[k_axis] == -(-k // block) and scale.shape[1 - k_axis] == n:
        return block, lambda a: a.T if k_axis == 0 else a
    return None


def _onnx_code(dtype: np.dtype) -> int:
    return {"float32": 1, "float16": 10, "bfloat16": 16}[dtype.name]

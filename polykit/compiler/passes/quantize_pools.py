"""quantize_pools: keep activations 8-bit through max pools (no float round trip between INT8 / FP8 layers).

1. `QuantizeLinear(MaxPool(x))` -> `MaxPool(QuantizeLinear(x))` for a per-tensor Q that is the
   pool's sole reader: quantization (round, saturate) is monotone non-decreasing, so the max of
   quantized values is the quantized max, exactly (a NaN propagates through both). The pool then runs
   on int8/uint8 or float8_e4m3fn (the cuda kernels compare e4m3 as order-preserving byte keys), and the
   layer before it (a ResNet stem's Conv + Relu) writes the pool's input quantized in its epilogue: an
   FP8 ResNet-50 bs32's stem writes 25.7 MB of e4m3 where it wrote 51 MB of float16, the pool reads that
   and no QuantizeLinear layer follows it.
2. `QuantizeLinear(DequantizeLinear(q))` with the same scale, zero point and type -> `q`: the round
   trip of an 8-bit value is the value (|q - zp| <= 255 times a scale and back rounds to it), which
   leaves an explicit model's `DQ -> MaxPool -> Q` pool on its int8 input once rule 1 has moved the Q.

It runs with fold_qdq, after insert_qdq, so the INT8 layers fold around the moved Q.
"""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir.graph import Graph, Node
from polykit.compiler.passes.fold_qdq import dequantized, requantizer
from polykit.compiler.passes.rewrite import protected, replace_tensor, sole_reader


def quantize_pools(graph: Graph, *, keep: frozenset[str] = frozenset()) -> bool:
    """Apply both rules wherever they hold; True if anything changed."""
    fixed = protected(graph, keep)
    changed = False
    for pool in list(graph.nodes):
        changed = _quantize_before(graph, pool, fixed) or changed
    producers = graph.producers()
    for q in list(graph.nodes):
        source = _round_trip_source(graph, q, producers, fixed)
        if source is not None:
            replace_tensor(graph, q.outputs[0], source)
            changed = True
    return changed


def _quantize_before(graph: Graph, pool: Node, fixed: set[str]) -> bool:
    if pool.op_type != "MaxPool" or pool.domain or len([o for o in pool.outputs if o]) != 1:
        return False
    if any(pool.outputs[1:]) or graph.value(pool.input(0)).dtype != np.float32:
        return False
    readers = graph.consumers()
    q = sole_reader(graph, pool.outputs[0], readers, fixed)
    requant = requantizer(graph, q, graph.producers()) if q is not None else None
    if requant is None or q.input(0) != pool.outputs[0]:
        return False
    quantized = graph.fresh_name(f"{pool.input(0)}_int8")
    q.inputs = [pool.input(0), *q.inputs[1:]]
    pooled = q.outputs[0]
    q.outputs = [quantized]
    pool.inputs = [quantized]
    pool.outputs = [pooled]
    graph.nodes.remove(q)
    graph.nodes.insert(graph.nodes.index(pool), q)
    return True


def _round_trip_source(graph: Graph, q: Node, producers: dict[str, Node], fixed: set[str]) -> str | None:
    """The 8-bit tensor `q` requantizes unchanged (Q of a DQ with the same parameters), or None."""
    requant = requantizer(graph, q, producers)
    if requant is None or q.outputs[0] in fixed:
        return None
    dq = dequantized(graph, q.input(0), producers)
    if dq is None or dq.axis is not None:
        return None
    scale, zero = requant
    same = (graph.value(dq.source).dtype == zero.dtype and dq.zero_point.dtype == zero.dtype
            and float(dq.scale) == float(scale) and float(dq.zero_point) == float(zero))
    return dq.source if same else None

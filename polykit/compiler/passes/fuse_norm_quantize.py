"""fuse_norm_quantize: `LayerNormalization -> QuantizeLinear` (per tensor, saturating, to float8_e4m3fn with a
+0 zero point) as one ai.polykit LayerNormQuantize (ops/quant/layernorm_quantize.py): the LayerNorm's output
stage writes the e4m3 activation itself, as an FP8 GEMM's requantization does, instead of a QuantizeLinear layer
reading the float output back (an explicit FP8 BERT's two LayerNorms of each encoder layer).

Where the float output has other readers (BERT's residual Adds, a graph output, a kept tensor), the fused layer
writes both: the float Y and the e4m3 Yq. That costs one more byte an element stored by the LayerNorm, against
the QuantizeLinear layer's two (float16) bytes read, its byte stored and its launch; reading the residual as
e4m3 instead would change what the model computes. The values are the two ops' exactly: Yq is
QuantizeLinear of Y as stored (X's type).

Taken: a LayerNormalization of the default domain with one output (no mean / inv_std), float32 / float16 /
bfloat16 X, read by a QuantizeLinear whose scale is a one-element float32 constant and zero point a one-element
float8_e4m3fn +0 constant, `saturate` 1, no `block_size`, `precision` float32 or unset. Runs in the builder's
last fusion group, after the precision pass (so X is the type the layer stores).
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Graph, Node
from polykit.compiler.ops.quant.int8 import FP8
from polykit.compiler.ops.quant.layernorm_quantize import KIND
from polykit.compiler.passes.rewrite import const, protected, replace_nodes

NORM_DTYPES = frozenset({"float32", "float16", "bfloat16"})


def fuse_norm_quantize(graph: Graph, *, keep: Iterable[str] = frozenset()) -> bool:
    """Fold each LayerNormalization's e4m3 QuantizeLinear into it; True if any."""
    if FP8 is None:
        return False
    fixed = protected(graph, keep)
    readers = graph.consumers()
    replacements: dict[int, Node] = {}
    dead: list[Node] = []
    for norm in graph.nodes:
        if norm.op_type != "LayerNormalization" or norm.domain or len([o for o in norm.outputs if o]) != 1 \
                or str(graph.value(norm.input(0)).dtype) not in NORM_DTYPES:
            continue
        y = norm.outputs[0]
        q = next((r for r in readers.get(y, []) if _e4m3_quantize(graph, r, y)), None)
        if q is None:
            continue
        others = y in fixed or any(r is not q for r in readers.get(y, []))
        inputs = [norm.input(0), norm.input(1), norm.input(2), q.input(1), q.input(2)]
        attrs = {k: v for k, v in norm.attrs.items() if k in ("axis", "epsilon")}
        replacements[id(norm)] = Node(KIND, inputs, [q.outputs[0]] + ([y] if others else []), attrs,
                                      name=graph.fresh_name(f"{norm.name or y}_quantized"), domain=POLYKIT_DOMAIN)
        dead.append(q)
    return replace_nodes(graph, replacements, dead)


def _e4m3_quantize(graph: Graph, node: Node, y: str) -> bool:
    if node.op_type != "QuantizeLinear" or node.domain or node.input(0) != y or len(node.inputs) < 3:
        return False
    scale, zero = const(graph, node.input(1)), const(graph, node.input(2))
    return (scale is not None and scale.dtype == np.float32 and scale.size == 1 and zero is not None
            and zero.dtype == FP8 and zero.size == 1 and not zero.view(np.uint8).any()
            and int(node.attrs.get("saturate", 1)) == 1 and int(node.attrs.get("block_size", 0)) <= 0
            and int(node.attrs.get("precision", 0)) in (0, 1))

"""fuse_output_quantize: a QuantizeLinear (per tensor, saturating, to float8_e4m3fn with a +0 zero point) of a
LayerNormalization's or an Attention's output becomes that layer's output stage, as an FP8 GEMM's
requantization is: the producer writes the e4m3 activation the next FP8 GEMM reads, instead of a QuantizeLinear
layer reading the float output back (an explicit FP8 BERT's three per encoder layer).

- `LayerNormalization -> QuantizeLinear` -> ai.polykit LayerNormQuantize (ops/quant/layernorm_quantize.py).
  Where the float output has other readers (BERT's residual Adds, a graph output, a kept tensor), the fused
  layer writes both: the float Y and the e4m3 Yq. That costs one more byte an element stored by the LayerNorm,
  against the QuantizeLinear layer's two (float16) bytes read, its byte stored and its launch; reading the
  residual as e4m3 instead would change what the model computes.
- ai.polykit `Attention -> [Reshape / Flatten / Squeeze / Unsqueeze views] -> QuantizeLinear`, each tensor on
  the way read by the next node alone and not kept -> ai.polykit AttentionQuantize
  (ops/quant/attention_quantize.py) writing the e4m3 tensor, which the views then reshape (quantizing per
  tensor commutes with a view). BERT's merge of the heads, `[B, S, H, D] -> [B, S, E]`, is such a view.

The values are the two ops' exactly: the quantized output is QuantizeLinear of the float output as stored
(X's / Q's type). Taken: LayerNormalization of the default domain with one output (no mean / inv_std),
float32 / float16 / bfloat16 X; Attention with one output; a QuantizeLinear whose scale is a one-element
float32 constant and zero point a one-element float8_e4m3fn +0 constant, `saturate` 1, no `block_size`,
`precision` float32 or unset. Runs in the builder's last fusion group, after the precision pass (so the
producer stores the type it computes in). A fused layer no tactic of the build's target runs (a float32
attention, a LayerNorm row past cuda.norm.warp's registers) is named by the builder in `skip` and the graph
optimized again: its producer and QuantizeLinear stay layers, as written.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Graph, Node
from polykit.compiler.ops.quant.attention_quantize import KIND as ATTENTION_KIND
from polykit.compiler.ops.quant.int8 import FP8
from polykit.compiler.ops.quant.layernorm_quantize import KIND as NORM_KIND
from polykit.compiler.passes.rewrite import const, protected, replace_nodes

NORM_DTYPES = frozenset({"float32", "float16", "bfloat16"})
#: views a quantized attention output may pass on the way to its QuantizeLinear
VIEWS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})


def fuse_output_quantize(graph: Graph, *, keep: Iterable[str] = frozenset(), skip: tuple[str, ...] = ()) -> bool:
    """Fold each LayerNormalization's and Attention's e4m3 QuantizeLinear into it; True if any. A producer whose
    fused layer would be named in `skip` (`<producer>_quantized`: the builder names the fused layers no tactic of
    its target runs) stays as it is."""
    if FP8 is None:
        return False
    fixed = protected(graph, keep)
    readers = graph.consumers()
    replacements: dict[int, Node] = {}
    dead: list[Node] = []
    for node in graph.nodes:
        if fused_name(node) in skip:
            continue
        if node.op_type == "LayerNormalization" and not node.domain:
            fused = _norm(graph, node, readers, fixed)
        elif node.op_type == "Attention" and node.domain == POLYKIT_DOMAIN:
            fused = _attention(graph, node, readers, fixed)
        else:
            continue
        if fused is not None:
            layer, q = fused
            name = fused_name(node)
            layer.name = name if not any(n.name == name for n in graph.nodes) else graph.fresh_name(name)
            layer.attrs["fused_from"] = [*node.attrs.get("fused_from", [node.name]), q.name]
            replacements[id(node)] = layer
            dead.append(q)
    return replace_nodes(graph, replacements, dead)


def fused_name(producer: Node) -> str:
    return f"{producer.name or producer.outputs[0]}_quantized"


def _norm(graph: Graph, norm: Node, readers: dict[str, list[Node]], fixed: set[str]) -> tuple[Node, Node] | None:
    if len([o for o in norm.outputs if o]) != 1 or str(graph.value(norm.input(0)).dtype) not in NORM_DTYPES:
        return None
    y = norm.outputs[0]
    q = next((r for r in readers.get(y, []) if _e4m3_quantize(graph, r, y)), None)
    if q is None:
        return None
    others = y in fixed or any(r is not q for r in readers.get(y, []))
    inputs = [norm.input(0), norm.input(1), norm.input(2), q.input(1), q.input(2)]
    attrs = {k: v for k, v in norm.attrs.items() if k in ("axis", "epsilon")}
    return Node(NORM_KIND, inputs, [q.outputs[0]] + ([y] if others else []), attrs, domain=POLYKIT_DOMAIN), q


def _attention(graph: Graph, attention: Node, readers: dict[str, list[Node]],
               fixed: set[str]) -> tuple[Node, Node] | None:
    if len(attention.outputs) != 1:
        return None
    views, name = [], attention.outputs[0]
    while True:  # the chain of sole readers: views, then the QuantizeLinear
        users = readers.get(name, [])
        if len(users) != 1 or name in fixed:
            return None
        user = users[0]
        if _e4m3_quantize(graph, user, name):
            break
        if user.op_type not in VIEWS or user.domain or user.input(0) != name:
            return None
        views.append(user)
        name = user.outputs[0]
    q = user
    quantized = graph.fresh_name(f"{attention.outputs[0]}_e4m3")
    fused = Node(ATTENTION_KIND, [*attention.inputs[:3], attention.input(3), q.input(1), q.input(2)], [quantized],
                 dict(attention.attrs), domain=POLYKIT_DOMAIN)
    for i, view in enumerate(views):  # the views now reshape the e4m3 tensor (names anew: their type changed)
        view.inputs[0] = quantized
        quantized = q.outputs[0] if i == len(views) - 1 else graph.fresh_name(f"{view.outputs[0]}_e4m3")
        graph.values.pop(view.outputs[0], None)
        view.outputs[0] = quantized
    if not views:
        fused.outputs[0] = q.outputs[0]
    return fused, q


def _e4m3_quantize(graph: Graph, node: Node, y: str) -> bool:
    if node.op_type != "QuantizeLinear" or node.domain or node.input(0) != y or len(node.inputs) < 3:
        return False
    scale, zero = const(graph, node.input(1)), const(graph, node.input(2))
    return (scale is not None and scale.dtype == np.float32 and scale.size == 1 and zero is not None
            and zero.dtype == FP8 and zero.size == 1 and not zero.view(np.uint8).any()
            and int(node.attrs.get("saturate", 1)) == 1 and int(node.attrs.get("block_size", 0)) <= 0
            and int(node.attrs.get("precision", 0)) in (0, 1))

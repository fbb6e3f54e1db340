"""fold_attention_layouts: let ai.polykit Attention read and write [B, S, H, D] directly.

A Transpose(perm [0, 2, 1, 3]) that feeds Q, K or V of an Attention (rank 4) is absorbed:
the Attention reads the Transpose's input and records that layout (`q_layout` / `k_layout` /
`v_layout` = "bshd"). An Attention output read by exactly one such Transpose (and by nothing
else; not a kept tensor) writes that Transpose's output instead (`out_layout` "bshd"). In a
BERT-style block this removes the four head transposes per layer; the Reshapes that split
and merge the heads are views (no copy) already. Format: docs/FUSION.md.
"""

from __future__ import annotations

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Graph
from polykit.compiler.passes.cancel_transposes import perm_of
from polykit.compiler.passes.rewrite import protected

SWAP_SEQ_HEADS = [0, 2, 1, 3]
INPUT_LAYOUTS = ("q_layout", "k_layout", "v_layout")


def fold_attention_layouts(graph: Graph, *, keep: frozenset[str] = frozenset()) -> bool:
    """Absorb head transposes into Attention layouts; True if the graph changed."""
    fixed = protected(graph, keep)
    producers, readers = graph.producers(), graph.consumers()
    changed = False
    for node in graph.nodes:
        if node.op_type != "Attention" or node.domain != POLYKIT_DOMAIN:
            continue
        for i, attr in enumerate(INPUT_LAYOUTS):
            if node.attrs.get(attr, "bhsd") != "bhsd":
                continue
            src = producers.get(node.input(i))
            if src is not None and perm_of(graph, src) == SWAP_SEQ_HEADS:
                node.inputs[i] = src.inputs[0]
                node.attrs[attr] = "bshd"
                changed = True
        out = node.outputs[0]
        users = readers.get(out, [])
        if node.attrs.get("out_layout", "bhsd") == "bhsd" and out not in fixed and len(users) == 1 \
                and perm_of(graph, users[0]) == SWAP_SEQ_HEADS:
            transpose = users[0]
            graph.nodes.remove(transpose)
            node.outputs[0] = transpose.outputs[0]
            node.attrs["out_layout"] = "bshd"
            changed = True
    return changed

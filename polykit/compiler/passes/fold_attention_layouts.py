"""fold_attention_layouts: let ai.polykit Attention read and write [B, S, H, D] directly.

A Transpose(perm [0, 2, 1, 3]) that feeds Q, K or V of an Attention (rank 4) is absorbed:
the Attention reads the Transpose's input and records that layout (`q_layout` / `k_layout` /
`v_layout` = "bshd"). An Attention output read by exactly one such Transpose (and by nothing
else; not a kept tensor) writes that Transpose's output instead (`out_layout` "bshd"); a Transpose
that only also moves size-1 dims (torchvision's MultiheadAttention: [1, H, S, D] -> [S, 1, H, D])
becomes a Reshape (a view) of the "bshd" output. In a
BERT-style block this removes the four head transposes per layer; the Reshapes that split
and merge the heads are views (no copy) already. Format: docs/FUSION.md.
"""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Graph, Node
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
        if node.attrs.get("out_layout", "bhsd") != "bhsd" or out in fixed or len(users) != 1:
            continue
        transpose, shape = users[0], graph.value(out).shape
        perm = perm_of(graph, transpose)
        if perm == SWAP_SEQ_HEADS:
            graph.nodes.remove(transpose)
            node.outputs[0] = transpose.outputs[0]
            node.attrs["out_layout"] = "bshd"
            changed = True
        elif perm is not None and shape is not None and len(perm) == 4 and all(type(d) is int for d in shape) \
                and _moved(perm, shape) == _moved(SWAP_SEQ_HEADS, shape):
            # the same bytes as [B, S, H, D] (only size-1 dims placed elsewhere): write bshd, then a view
            bshd = graph.fresh_name(f"{out}_bshd")
            target = graph.fresh_name(f"{transpose.name}_shape")
            graph.initializers[target] = np.array([shape[p] for p in perm], np.int64)
            node.outputs[0] = bshd
            node.attrs["out_layout"] = "bshd"
            graph.nodes[graph.nodes.index(transpose)] = Node("Reshape", [bshd, target], list(transpose.outputs), {},
                                                             name=transpose.name)
            changed = True
    return changed


def _moved(perm: list[int], shape) -> list[int]:
    """The source axes of a transpose's output in order, size-1 dims left out (equal lists: equal bytes)."""
    return [p for p in perm if shape[p] != 1]

"""merge_duplicates: compute each value once (common subexpression elimination).

1. Scalar constants (initializers of one element) of equal dtype, shape and value become one:
   exporters write a Constant per use (BERT's and GPT-2's attention-mask fill values, a pair per
   layer), which hides that the nodes reading them compute the same thing. Larger initializers
   stay apart: equal weights of a random-weight model are a coincidence that a refit
   (polykit.compiler.builder.refit) would undo.
2. A node of the ONNX domain equal to an earlier one (op type, attributes, inputs) goes, and the
   readers of its outputs read the earlier node's: BERT-base's and GPT-2's 12 per-layer `Where`s
   over the one mask become one layer (11 launches fewer a run). Not merged: random generators,
   nodes with subgraphs, a node whose outputs are graph outputs or kept, or are read from inside
   a subgraph (an outer-scope name of an If / Loop / Scan body).
"""

from __future__ import annotations

import json

import numpy as np

from polykit.compiler.ir.graph import Graph, Node, has_subgraphs, subgraphs
from polykit.compiler.ops.nn.fused import rename_fused_tensor
from polykit.compiler.passes.rewrite import json_safe, protected, replace_tensor

#: ops whose equal calls may give different values
NONDETERMINISTIC = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                              "Multinomial", "Bernoulli", "Dropout"})


def merge_duplicates(graph: Graph, *, keep: frozenset[str] = frozenset()) -> bool:
    """Merge equal scalar constants, then equal nodes; True if the graph changed."""
    fixed = protected(graph, keep)
    changed = _merge_scalars(graph, fixed)
    return _merge_nodes(graph, fixed) or changed


def _merge_scalars(graph: Graph, fixed: set[str]) -> bool:
    first: dict[tuple, str] = {}
    renamed: dict[str, str] = {}
    inputs = set(graph.inputs)
    for name, array in graph.initializers.items():
        array = np.asarray(array)
        if array.size != 1 or name in fixed or name in inputs or array.dtype.kind not in "biuf":
            continue
        key = (array.dtype.str, array.shape, array.tobytes())
        if key in first:
            renamed[name] = first[key]
        else:
            first[key] = name
    changed = False
    for node in graph.nodes:
        for name in [n for n in dict.fromkeys(node.inputs) if n in renamed]:
            rename_fused_tensor(node, name, renamed[name])  # a fused node's body reads it by name too
            changed = True
    return changed


def _merge_nodes(graph: Graph, fixed: set[str]) -> bool:
    inner = _read_inside_bodies(graph)
    seen: dict[tuple, Node] = {}
    dead: list[Node] = []
    for node in graph.nodes:
        key = _key(node)
        if key is None:
            continue
        earlier = seen.get(key)
        if earlier is None:
            seen[key] = node
            continue
        if any(out and (out in fixed or out in inner) for out in node.outputs):
            continue
        for out, kept in zip(node.outputs, earlier.outputs):
            if out:
                replace_tensor(graph, out, kept)
        dead.append(node)
    graph.remove_nodes(dead)
    return bool(dead)


def _key(node: Node) -> tuple | None:
    """What makes two nodes compute the same (None: never merged)."""
    if node.domain != "" or node.op_type in NONDETERMINISTIC or has_subgraphs(node) or not node.outputs:
        return None
    try:
        attrs = json.dumps(json_safe(node.attrs), sort_keys=True)
    except TypeError:
        return None
    outputs = tuple(bool(out) for out in node.outputs)  # which optional outputs it writes
    return node.op_type, tuple(node.inputs), attrs, outputs


def _read_inside_bodies(graph: Graph) -> set[str]:
    """Every name a node inside any subgraph of `graph` reads (outer-scope names among them)."""
    names: set[str] = set()

    def visit(g: Graph) -> None:
        for node in g.nodes:
            names.update(n for n in node.inputs if n)
            for _, body in subgraphs(node):
                names.update(body.outputs)
                visit(body)

    for node in graph.nodes:
        for _, body in subgraphs(node):
            visit(body)
    return names


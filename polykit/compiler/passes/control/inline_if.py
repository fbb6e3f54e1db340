"""inline_constant_if: an If whose condition is a constant becomes the nodes of its taken branch.

Function-expanded graphs (AffineGrid, ...) branch on facts the build knows (the rank of an
input): the untaken branch may not even make sense for the model's shapes, and a control-flow
layer would run a body plan where the taken branch's nodes can fuse and fold with the rest.
The branch's inputs (the node's captured tensors, polykit.compiler.ir.subgraphs) are bound to the
node's inputs, its tensors and constants are renamed where they would clash with the outer
graph's, and an Identity per output writes the node's outputs (remove_identity drops them).
"""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir.graph import Graph, Node
from polykit.compiler.ir.subgraphs import inline_body


def inline_constant_if(graph: Graph) -> bool:
    """Replace each If with an initializer condition by its taken branch; True if any was."""
    changed = False
    for node in list(graph.nodes):
        if node.op_type != "If" or node.domain or node.input(0) not in graph.initializers:
            continue
        taken = bool(np.asarray(graph.initializers[node.input(0)]).reshape(-1)[0])
        branch = node.attrs["then_branch" if taken else "else_branch"]
        if not isinstance(branch, Graph):
            continue
        at = graph.nodes.index(node)
        graph.nodes[at:at + 1] = _branch_nodes(graph, node, branch)
        changed = True
    return changed


def _branch_nodes(graph: Graph, node: Node, branch: Graph) -> list[Node]:
    used = {t for x in graph.nodes for t in (*x.inputs, *x.outputs)} | set(graph.initializers) | set(graph.inputs)
    nodes, outs = inline_body(graph, branch, node.inputs[1:], used=used)
    for out, src in zip(node.outputs, outs):
        if out:
            nodes.append(Node("Identity", [src], [out], name=graph.fresh_name(f"{node.name or 'If'}_out")))
    return nodes


def inline_known_ifs(graph: Graph, max_rounds: int = 8) -> bool:
    """Before a build's first shape inference: fold what constants and static input shapes decide
    and inline the Ifs that then branch on a constant, until none is left (True if any was). A
    ruled build (polykit.compiler.graph.shape_rules) then sees the taken branches' nodes, whose shape
    rules read the captured shape-tensor values (AffineGrid's expansion tests the rank of `size`)."""
    from polykit.compiler.passes.fold_constants import fold_constants

    changed = False
    for _ in range(max_rounds):
        if not any(n.op_type == "If" and not n.domain for n in graph.nodes):
            break
        fold_constants(graph, keep=frozenset(graph.outputs))
        if not inline_constant_if(graph):
            break
        changed = True
    return changed

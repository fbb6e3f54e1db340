"""fuse_pointwise: merge groups of elementwise ops into one `Pointwise` node (docs/FUSION.md).

Groups grow backwards from a root (the last op of a group): a producer joins when it is a
fusable op of the elementwise op table (polykit.compiler.ops.elementwise_table) and every reader of its
output is already in the group, so the intermediates disappear. A graph output or kept tensor may sit inside a
group only when its shape is the group's shape; it becomes an extra output. Groups of one
op stay as they are.
"""

from __future__ import annotations

import json

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Graph, Node
from polykit.compiler.passes.rewrite import json_safe, protected, replace_nodes
from polykit.compiler.ops.elementwise_table import fusable_ops


def is_fusable(graph: Graph, node: Node) -> bool:
    """Whether `node` may become a step of a Pointwise body or an epilogue."""
    if node.domain != "" or node.op_type not in fusable_ops():
        return False
    if len(node.outputs) != 1 or not node.outputs[0]:
        return False
    if node.op_type == "Clip" and any(n and n not in graph.initializers for n in node.inputs[1:]):
        return False
    shape = graph.value(node.outputs[0]).shape
    if shape is None or any(d is None for d in shape):
        return False
    try:
        json.dumps(json_safe(node.attrs))
    except TypeError:
        return False
    return True


def body_step(node: Node) -> dict:
    return {"op": node.op_type, "inputs": list(node.inputs), "outputs": list(node.outputs),
            "attrs": json_safe(node.attrs)}


def fuse_pointwise(graph: Graph, *, keep: frozenset[str] = frozenset()) -> bool:
    """Replace every elementwise group of >= 2 ops by one Pointwise node; True if any."""
    fixed = protected(graph, keep)
    readers = graph.consumers()
    producers = graph.producers()
    order = {id(n): k for k, n in enumerate(graph.nodes)}
    assigned: set[int] = set()
    replacements: dict[int, Node] = {}
    dead: list[Node] = []
    for root in reversed(graph.nodes):
        if id(root) in assigned or not is_fusable(graph, root):
            continue
        group = _grow(graph, root, producers, readers, fixed, assigned)
        if len(group) < 2:
            continue
        group.sort(key=lambda n: order[id(n)])
        assigned.update(id(n) for n in group)
        replacements[id(root)] = _pointwise_node(graph, root, group, fixed)
        dead.extend(n for n in group if n is not root)
    return replace_nodes(graph, replacements, dead)


def _grow(graph: Graph, root: Node, producers: dict[str, Node], readers: dict[str, list[Node]],
          fixed: set[str], assigned: set[int]) -> list[Node]:
    shape = graph.value(root.outputs[0]).shape
    group = [root]
    members = {id(root)}
    grew = True
    while grew:
        grew = False
        for node in list(group):
            for name in node.inputs:
                p = producers.get(name)
                if p is None or id(p) in members or id(p) in assigned or not is_fusable(graph, p):
                    continue
                if not all(id(r) in members for r in readers.get(name, [])):
                    continue
                if name in fixed and graph.value(name).shape != shape:
                    continue
                group.append(p)
                members.add(id(p))
                grew = True
    return group


def _pointwise_node(graph: Graph, root: Node, group: list[Node], fixed: set[str]) -> Node:
    written = {n.outputs[0] for n in group}
    inputs: list[str] = []
    for n in group:
        inputs.extend(name for name in n.inputs if name and name not in written and name not in inputs)
    outputs = [root.outputs[0]] + [n.outputs[0] for n in group if n is not root and n.outputs[0] in fixed]
    attrs = {"body": [body_step(n) for n in group], "fused_from": [n.name for n in group]}
    return Node("Pointwise", inputs, outputs, attrs, name=f"{root.name}_pointwise", domain=POLYKIT_DOMAIN)

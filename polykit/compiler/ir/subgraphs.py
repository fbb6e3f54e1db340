"""Nested graphs (If branches, Loop and Scan bodies) in the IR: the capture convention, and
helpers over bodies (merged shapes, inlining).

A body is a polykit Graph held in its node's attrs ("then_branch"/"else_branch", "body").
ONNX lets a body read tensors of the enclosing scopes by name; polykit makes those reads
explicit when it imports the node: each outer tensor a body reads becomes an extra input of
the node, after its ONNX inputs, and an extra input of the body (every body of an If gets
the same list), and attrs["polykit_captures"] says how many there are. The binding is
positional, so passes that rename the outer tensor edit only the node's inputs, and every
pass, lifetime and memory plan sees the dependency as an ordinary input. Exporting to ONNX
undoes it: the captured inputs are dropped and the body reads the outer names again
(polykit.compiler.graph.onnx_export).

Importing, inferring and running a body are services of the layers above the IR; the
control-flow ops reach them through polykit.compiler.ops.control.bodies. Shape inference of a
control-flow node annotates its bodies in place: the body inputs get the dtypes and shapes
the node gives them, and the body's own tensors are inferred from those.
"""

from __future__ import annotations

from typing import Any, Sequence

from polykit.compiler.ir.graph import Graph, Node

#: node attribute: how many inputs at the end of a control-flow node are captured outer tensors
CAPTURES = "polykit_captures"


def captured(node: Node) -> int:
    """Number of captured outer tensors at the end of `node`'s inputs."""
    return int(node.attrs.get(CAPTURES, 0))


def outer_names(node: Any) -> list[str]:
    """The outer-scope tensors a NodeProto's subgraph attributes read (nested bodies included)."""
    import onnx

    names: list[str] = []
    for attr in node.attribute:
        for body in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else
                     list(attr.graphs) if attr.type == onnx.AttributeProto.GRAPHS else []):
            defined = {i.name for i in body.input} | {t.name for t in body.initializer}
            defined |= {t.values.name for t in body.sparse_initializer}
            defined |= {o for n in body.node for o in n.output}
            for n in body.node:
                names += [t for t in (*n.input, *outer_names(n)) if t and t not in defined]
            names += [o.name for o in body.output if o.name not in defined]
    return list(dict.fromkeys(names))


def onnx_inputs(node: Node) -> list[str]:
    """The node's inputs without its captured outer tensors."""
    c = captured(node)
    return list(node.inputs[: len(node.inputs) - c]) if c else list(node.inputs)


# ---- shapes ----------------------------------------------------------------------------------
def merge_shapes(a: Any, b: Any) -> Any:
    """The shape both `a` and `b` fit: equal dims kept, others unknown (None when ranks differ)."""
    if a is None or b is None or len(a) != len(b):
        return None
    return tuple(x if x == y else None for x, y in zip(a, b))


# ---- inlining --------------------------------------------------------------------------------
def inline_body(graph: Graph, body: Graph, bound: Sequence[str], prefix: str | None = None,
                used: set[str] | None = None) -> tuple[list[Node], list[str]]:
    """`body`'s nodes as nodes of `graph`, its inputs (positional, captures included) read as the
    outer tensors `bound`; returns the nodes and the outer names of the body's outputs. Its
    initializers join `graph`'s. With `prefix`, every tensor and node the body defines gets a
    fresh name under it (a body inlined more than once: loop iterations, repeated ops); without,
    a name keeps itself unless it is in `used` (the outer graph's names; a fresh one then)."""
    names = dict(zip(body.inputs, bound))
    used = set(used or ())

    def outer(name: str) -> str:
        if not name or name in names:
            return names.get(name, name)
        if prefix is not None:
            names[name] = graph.fresh_name(f"{prefix}/{name}")
        else:
            names[name] = graph.fresh_name(name) if name in used else name
            used.add(names[name])
        return names[name]

    for name, array in body.initializers.items():
        graph.initializers[outer(name)] = array
    defined = {o for n in body.nodes for o in n.outputs}
    nodes = [Node(n.op_type, [outer(i) if i in defined or i in names else i for i in n.inputs],
                  [outer(o) for o in n.outputs], {k: v.copy() if isinstance(v, Graph) else v for k, v in n.attrs.items()},
                  n.name if prefix is None else graph.fresh_name(f"{prefix}/{n.name}"), n.domain)
             for n in body.nodes]
    return nodes, [outer(o) for o in body.outputs]

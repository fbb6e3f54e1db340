"""Nested graphs (If branches, Loop and Scan bodies) in the IR: import, export, inference.

A body is a polykit Graph held in its node's attrs ("then_branch"/"else_branch", "body").
ONNX lets a body read tensors of the enclosing scopes by name; polykit makes those reads
explicit when it imports the node: each outer tensor a body reads becomes an extra input of
the node, after its ONNX inputs, and an extra input of the body (every body of an If gets
the same list), and attrs["polykit_captures"] says how many there are. The binding is
positional, so passes that rename the outer tensor edit only the node's inputs, and every
pass, lifetime and memory plan sees the dependency as an ordinary input. Exporting to ONNX
undoes it: the captured inputs are dropped and the body reads the outer names again.

Shape inference of a control-flow node (polykit.compiler.ops.control.control_flow) annotates its
bodies in place: the body inputs get the dtypes and shapes the node gives them, and the
body's own tensors are inferred from those.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from polykit.compiler.ir.graph import Graph, Node, Value, subgraphs
from polykit.errors import GraphError, ShapeError

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


def import_bodies(node: Node, keys: Sequence[str], opsets: dict[str, int], opset: int) -> None:
    """Turn the GraphProto attributes `keys` of an imported node into canonical Graphs whose
    outer reads are captured (module docstring); a node imported already is left as it is."""
    import onnx

    from polykit.compiler.graph.onnx_import import canonicalize, graph_from_proto

    protos = {k: node.attrs[k] for k in keys if isinstance(node.attrs.get(k), onnx.GraphProto)}
    if not protos:
        return
    missing = [k for k in keys if k not in node.attrs]
    if missing:
        raise GraphError(f"the node has no {missing[0]!r} graph attribute", where=node.describe(),
                         hint="add the body graph (see the ONNX operator spec)")
    proto_node = onnx.NodeProto()
    for key, proto in protos.items():
        proto_node.attribute.append(onnx.helper.make_attribute(key, proto))
    outer = outer_names(proto_node)
    for key, proto in protos.items():
        body = graph_from_proto(proto, opsets, opset, f"{node.describe()}: {key}", captures=outer)
        canonicalize(body, opset)
        body.opsets = dict(opsets)
        node.attrs[key] = body
    node.inputs = list(node.inputs) + outer
    if outer:
        node.attrs[CAPTURES] = len(outer)


def export_attrs(node: Node) -> dict[str, Any]:
    """`node.attrs` as ONNX has them: bodies as GraphProtos reading outer names again, without
    the captures count (the caller drops the captured inputs: `onnx_inputs`)."""
    out = {k: v for k, v in node.attrs.items() if k != CAPTURES}
    for key, body in subgraphs(node):
        out[key] = body_to_proto(body, node)
    return out


def onnx_inputs(node: Node) -> list[str]:
    """The node's inputs without its captured outer tensors."""
    c = captured(node)
    return list(node.inputs[: len(node.inputs) - c]) if c else list(node.inputs)


def body_to_proto(body: Graph, node: Node) -> Any:
    """A body as a GraphProto: its captured inputs dropped, reads of them renamed to the outer
    tensors the node binds them to."""
    from onnx import helper, numpy_helper

    from polykit.compiler.graph.onnx_export import exported_node, value_info

    c = captured(node)
    formal = body.inputs[: len(body.inputs) - c] if c else list(body.inputs)
    outer = dict(zip(body.inputs[len(formal):], node.inputs[len(node.inputs) - c:])) if c else {}

    def name(n: str) -> str:
        return outer.get(n, n)

    nodes = []
    for n in body.nodes:
        copy = Node(n.op_type, [name(i) for i in n.inputs], list(n.outputs), n.attrs, n.name, n.domain)
        nodes.append(exported_node(copy))
    inits = [numpy_helper.from_array(np.asarray(arr), k) for k, arr in body.initializers.items()]
    inputs = [value_info(body.value(n)) for n in formal]
    outputs = [value_info(body.value(n).with_(name=name(n))) for n in body.outputs]
    return helper.make_graph(nodes, body.name, inputs, [o for o in outputs], inits)


# ---- inference -------------------------------------------------------------------------------
def annotate(body: Graph, values: Sequence[tuple[Any, Any] | Value], known: Sequence[np.ndarray | None] = ()) -> None:
    """Give the body's inputs the (dtype, shape) or Value of `values` (positional) and infer the rest of
    the body; `known` are build-time values of inputs (captured constants) shape rules may read."""
    from polykit.compiler.graph.infer import infer_shapes

    if not isinstance(body, Graph):
        _check_plan_inputs(body, values)
        return
    for name, given in zip(body.inputs, values):
        if isinstance(given, Value):  # a sequence or optional: its whole metadata
            body.set_value(given.with_(name=name))
            continue
        dtype, shape = given
        have = body.value(name)
        body.set_value(Value(name, have.dtype if dtype is None else np.dtype(dtype),
                             None if shape is None else tuple(shape)))
    bound = {n: v for n, v in zip(body.inputs, known) if v is not None}
    body.metadata["input_values"] = bound
    infer_shapes(body, strict=True)


def merge_shapes(a: Any, b: Any) -> Any:
    """The shape both `a` and `b` fit: equal dims kept, others unknown (None when ranks differ)."""
    if a is None or b is None or len(a) != len(b):
        return None
    return tuple(x if x == y else None for x, y in zip(a, b))


def output_values(body: Any) -> list[Value]:
    """Metadata of a body's outputs, in order (a Graph, or the Plan a build made of it)."""
    if isinstance(body, Graph):
        return [body.value(n) for n in body.outputs]
    return [Value(n, body.tensors[n].np_dtype, tuple(body.tensors[n].shape)) for n in body.metadata["body_outputs"]]


def _check_plan_inputs(plan: Any, values: Sequence[tuple[Any, Any]]) -> None:
    """ShapeError unless the node gives a body plan the inputs it was built for."""
    if len(values) != len(plan.inputs):
        raise ShapeError(f"the node gives its body {len(values)} inputs, its plan takes {len(plan.inputs)}",
                         where="control-flow body", hint="the plan is inconsistent; rebuild it")
    for name, (dtype, shape) in zip(plan.inputs, values):
        desc = plan.tensors[name]
        if dtype is not None and np.dtype(dtype) != desc.np_dtype or shape is not None and (
                len(shape) != len(desc.shape) or any(isinstance(a, int) and a != b for a, b in zip(shape, desc.shape))):
            raise ShapeError(f"body input {name!r} is {desc.dtype}{list(desc.shape)} in the body's plan, the node "
                             f"gives {dtype}{list(shape or ())}", where="control-flow body",
                             hint="the plan is inconsistent; rebuild it")


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

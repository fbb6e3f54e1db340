"""cancel_transposes: compose Transpose pairs and sink Transposes through elementwise ops.

1. `Transpose(Transpose(x, p), q)` -> `Transpose(x, p[q])`; an identity result reads `x`
   directly (the first Transpose goes when nothing else reads it).
2. An elementwise op (fuse_pointwise.is_fusable) whose non-constant inputs are all
   `Transpose(., p)` with one perm and full rank, read by nothing else, becomes
   `Transpose(op(inputs untransposed, constants transposed by p^-1), p)` when that removes a
   Transpose: two or more transposed inputs, or an output read only by a Transpose (which
   rule 1 then composes). Constants are re-laid out at build time (new initializers).
Repeats until nothing changes, so transposes travel down a chain of elementwise ops.
"""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir import Graph, Node, Value
from polykit.compiler.passes.fuse_pointwise import is_fusable
from polykit.compiler.passes.rewrite import const, protected, rename_produced, replace_tensor

#: passes over the graph before giving up (each sinks a transpose by at least one op)
MAX_SWEEPS = 32


def cancel_transposes(graph: Graph, *, keep: frozenset[str] = frozenset()) -> bool:
    """Compose and sink Transposes; True if the graph changed."""
    changed = False
    for _ in range(MAX_SWEEPS):
        step = _compose_pairs(graph, protected(graph, keep)) | _sink_through_elementwise(graph, protected(graph, keep))
        changed |= step
        if not step:
            break
    return changed


def perm_of(graph: Graph, node: Node) -> list[int] | None:
    """A plain Transpose's permutation (ONNX default: reversed axes), or None if unknown."""
    if node.op_type != "Transpose" or node.domain != "" or len(node.inputs) != 1:
        return None
    perm = node.attrs.get("perm")
    if perm is not None:
        return [int(p) for p in perm]
    shape = graph.value(node.inputs[0]).shape
    return None if shape is None else list(reversed(range(len(shape))))


def _is_identity(perm: list[int]) -> bool:
    return perm == list(range(len(perm)))


def _compose_pairs(graph: Graph, fixed: set[str]) -> bool:
    producers = graph.producers()
    changed = False
    dead: list[Node] = []
    bypassed: list[Node] = []
    for second in graph.nodes:
        q = perm_of(graph, second)
        first = producers.get(second.input(0)) if q is not None else None
        p = perm_of(graph, first) if first is not None else None
        if p is None or len(p) != len(q):
            continue
        composed = [p[i] for i in q]
        source = first.inputs[0]
        if _is_identity(composed) and second.outputs[0] not in fixed:
            replace_tensor(graph, second.outputs[0], source)
            dead.append(second)
        else:
            second.inputs = [source]
            second.attrs = {**second.attrs, "perm": composed}
        bypassed.append(first)
        changed = True
    graph.remove_nodes(dead)
    readers = graph.consumers()
    graph.remove_nodes(n for n in bypassed if n.outputs[0] not in fixed and not readers.get(n.outputs[0]))
    return _drop_identities_on_outputs(graph, fixed) or changed


def _drop_identities_on_outputs(graph: Graph, fixed: set[str]) -> bool:
    """An identity Transpose writing a kept name: its producer writes that name instead."""
    producers, readers = graph.producers(), graph.consumers()
    dead = []
    for t in graph.nodes:
        perm = perm_of(graph, t)
        if perm is None or not _is_identity(perm) or t.outputs[0] not in fixed:
            continue
        src = t.inputs[0]
        if src in fixed or src not in producers or len(readers.get(src, [])) != 1:
            continue
        out = t.outputs[0]
        t.outputs = []
        graph.values.pop(out, None)
        rename_produced(graph, src, out)
        dead.append(t)
    graph.remove_nodes(dead)
    return bool(dead)


def _sink_through_elementwise(graph: Graph, fixed: set[str]) -> bool:
    producers = graph.producers()
    readers = graph.consumers()
    for op in list(graph.nodes):
        plan = _sink_plan(graph, op, producers, readers, fixed)
        if plan is not None:
            _sink(graph, op, *plan)
            return True  # names and readers moved: re-scan from a fresh view
    return False


def _sink_plan(graph: Graph, op: Node, producers: dict[str, Node], readers: dict[str, list[Node]],
               fixed: set[str]) -> tuple[list[int], dict[str, str]] | None:
    if not is_fusable(graph, op):
        return None
    out_shape = graph.value(op.outputs[0]).shape
    perm: list[int] | None = None
    sources: dict[str, str] = {}
    for name in dict.fromkeys(n for n in op.inputs if n):
        if name in graph.initializers:
            continue
        t = producers.get(name)
        p = perm_of(graph, t) if t is not None else None
        shape = graph.value(name).shape
        if p is None or (perm is not None and p != perm) or shape is None or len(shape) != len(out_shape):
            return None
        if name in fixed or any(r is not op for r in readers.get(name, [])):
            return None
        perm, sources[name] = p, t.inputs[0]
    if perm is None or any(const(graph, n).ndim > len(perm) for n in op.inputs if n in graph.initializers):
        return None
    return (perm, sources) if len(sources) >= 2 or _reaches_transpose(graph, op, readers, fixed) else None


def _reaches_transpose(graph: Graph, op: Node, readers: dict[str, list[Node]], fixed: set[str]) -> bool:
    """Whether `op`'s output flows, through ops a transpose can sink into alone, into a Transpose."""
    rank = len(graph.value(op.outputs[0]).shape or ())
    for _ in range(len(graph.nodes)):
        name = op.outputs[0]
        users = readers.get(name, [])
        if len(users) != 1 or name in fixed:
            return False
        op = users[0]
        if perm_of(graph, op) is not None:
            return True
        others = [n for n in op.inputs if n and n != name]
        if not is_fusable(graph, op) or any(n not in graph.initializers or const(graph, n).ndim > rank
                                            for n in others):
            return False
    return False


def _sink(graph: Graph, op: Node, perm: list[int], sources: dict[str, str]) -> None:
    inverse = list(np.argsort(perm))
    transposes = {id(n) for n in graph.nodes if n.outputs and n.outputs[0] in sources}
    new_inputs = []
    for name in op.inputs:
        if name in sources:
            new_inputs.append(sources[name])
        elif name in graph.initializers and graph.initializers[name].size > 1:
            arr = graph.initializers[name]
            full = arr.reshape((1,) * (len(perm) - arr.ndim) + arr.shape)
            new_inputs.append(graph.add_initializer(np.ascontiguousarray(np.transpose(full, inverse)), f"{name}_T"))
        else:
            new_inputs.append(name)
    out = op.outputs[0]
    inner = graph.fresh_name(f"{out}_untransposed")
    op.inputs = new_inputs
    op.outputs = [inner]
    shape = graph.value(out).shape
    if shape is not None:
        graph.set_value(Value(inner, graph.value(out).dtype, tuple(shape[i] for i in inverse)))
    sink = Node("Transpose", [inner], [out], {"perm": list(perm)}, name=graph.fresh_name(f"{op.name}_transpose"))
    graph.nodes = [n for n in graph.nodes if id(n) not in transposes]
    graph.nodes.insert(graph.nodes.index(op) + 1, sink)

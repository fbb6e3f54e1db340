"""cancel_transposes: compose Transpose pairs and sink Transposes through elementwise ops and reductions.

1. `Transpose(Transpose(x, p), q)` -> `Transpose(x, p[q])`; an identity result reads `x`
   directly (the first Transpose goes when nothing else reads it).
2. An elementwise op (fuse_pointwise.is_fusable, or a per-tensor QuantizeLinear / DequantizeLinear
   with constant parameters) whose non-constant inputs are all
   `Transpose(., p)` with one perm and full rank, read by nothing else but Transposes, becomes
   `Transpose(op(inputs untransposed, constants transposed by p^-1), p)` when that removes a
   Transpose: two or more transposed inputs, or an output that flows (through any of its
   readers, and on through elementwise ops whose other inputs are constants or Transposes by p)
   into another Transpose, which rule 1 then composes, or into a reduction (rule 3). Constants are re-laid out at build time
   (new initializers).
3. A reduction (Reduce*, constant axes) reading a Transpose that nothing else reads reduces the
   untransposed tensor over the permuted axes; a Transpose of the (smaller) result follows
   unless its permutation became the identity (keepdims=0 over the moved axes).
4. A Transpose that moves only size-1 dims keeps the data order: Reshape / Flatten readers
   read its input directly (a channels-last pooled [N, 1, 1, C] feeding Flatten).
5. A GroupNormalization / InstanceNormalization (float, any rank >= 3) reading a Transpose from
   channels last to channels first (perm [0, r - 1, 1, ..., r - 2]) that nothing else reads, whose
   output flows into a Transpose as in rule 2, becomes `Transpose(GroupNormNHWC(x), perm)`: the
   norm runs on the channels-last tensor and the Transpose moves on (a 1-D conv's GroupNorm + GELU
   between channels-last convs: wav2vec2's feature extractor).
Repeats until nothing changes, so transposes travel down chains of elementwise ops.
"""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir.graph import Graph, Node, Value
from polykit.compiler.ops.math.reduce import REDUCE_OPS
from polykit.compiler.ops.nn.group_norm_nhwc import CHANNEL_NORMS, FLOATS, channels_last_perm, group_norm_nhwc
from polykit.compiler.passes.fuse_pointwise import is_fusable
from polykit.compiler.passes.rewrite import const, protected, rename_produced, replace_tensor

#: passes over the graph before giving up (each sinks transposes by at least one op)
MAX_SWEEPS = 32


def cancel_transposes(graph: Graph, *, keep: frozenset[str] = frozenset()) -> bool:
    """Compose and sink Transposes; True if the graph changed."""
    changed = False
    fixed = protected(graph, keep)
    for _ in range(MAX_SWEEPS):
        step = False
        for rule in (_compose_pairs, _sink_through_elementwise, _sink_through_reductions, _sink_through_norms,
                     _bypass_into_reshapes):
            step |= rule(graph, fixed)
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
    """An identity Transpose writing a kept name: its producer writes that name instead (the
    producer's other readers read it under that name)."""
    producers = graph.producers()
    dead = []
    for t in graph.nodes:
        perm = perm_of(graph, t)
        if perm is None or not _is_identity(perm) or t.outputs[0] not in fixed:
            continue
        src = t.inputs[0]
        if src in fixed or src not in producers:
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
    changed = False
    for op in list(graph.nodes):
        plan = _sink_plan(graph, op, producers, readers, fixed)
        if plan is not None:
            _sink(graph, op, *plan)
            producers, readers = graph.producers(), graph.consumers()  # names and readers moved
            changed = True
    return changed


def elementwise(graph: Graph, node: Node) -> bool:
    """Whether `node` computes each output element from the same element of its inputs: a fusable
    op, or a per-tensor Q/DQ (INT8 graphs keep them between channels-last layers)."""
    if node.domain == "" and node.op_type in ("QuantizeLinear", "DequantizeLinear"):
        params = [graph.initializers.get(n) for n in node.inputs[1:] if n]
        return (len(node.outputs) == 1 and not int(node.attrs.get("block_size", 0))
                and all(p is not None and p.size == 1 for p in params))
    return is_fusable(graph, node)


def _sink_plan(graph: Graph, op: Node, producers: dict[str, Node], readers: dict[str, list[Node]],
               fixed: set[str]) -> tuple[list[int], dict[str, str]] | None:
    if not elementwise(graph, op):
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
        if name in fixed or any(r is not op and perm_of(graph, r) is None for r in readers.get(name, [])):
            return None  # other Transposes may read it too: rule 1 composes them with it
        perm, sources[name] = p, t.inputs[0]
    if perm is None or any(const(graph, n).ndim > len(perm) for n in op.inputs if n in graph.initializers):
        return None
    if len(sources) >= 2 or _reaches_transpose(graph, op, perm, producers, readers, fixed):
        return perm, sources
    return None


def _reaches_transpose(graph: Graph, op: Node, perm: list[int], producers: dict[str, Node],
                       readers: dict[str, list[Node]], fixed: set[str]) -> bool:
    """Whether `op`'s output flows into a Transpose or a reduction (rule 3) through ops a
    Transpose by `perm` sinks into too: elementwise ops whose other inputs are constants or
    Transposes by `perm`."""
    todo, seen = [op], set()
    while todo:
        node = todo.pop()
        name = node.outputs[0]
        if name in fixed or id(node) in seen:
            continue
        seen.add(id(node))
        for user in readers.get(name, []):
            if perm_of(graph, user) is not None or (user.domain == "" and user.op_type in REDUCE_OPS):
                return True
            if elementwise(graph, user) and all(_sinks_beside(graph, n, perm, producers)
                                                for n in user.inputs if n and n != name):
                todo.append(user)
    return False


def _sinks_beside(graph: Graph, name: str, perm: list[int], producers: dict[str, Node]) -> bool:
    if name in graph.initializers:
        return const(graph, name).ndim <= len(perm)
    t = producers.get(name)
    return t is not None and perm_of(graph, t) == perm


def _sink(graph: Graph, op: Node, perm: list[int], sources: dict[str, str]) -> None:
    inverse = list(np.argsort(perm))
    new_inputs = [sources[name] if name in sources else relayout_constant(graph, name, inverse) for name in op.inputs]
    out = op.outputs[0]
    inner = graph.fresh_name(f"{out}_untransposed")
    op.inputs = new_inputs
    op.outputs = [inner]
    shape = graph.value(out).shape
    if shape is not None:
        graph.set_value(Value(inner, graph.value(out).dtype, tuple(shape[i] for i in inverse)))
    sink = Node("Transpose", [inner], [out], {"perm": list(perm)}, name=graph.fresh_name(f"{op.name}_transpose"))
    readers = graph.consumers()
    graph.nodes = [n for n in graph.nodes if not (n.outputs and n.outputs[0] in sources and not readers.get(n.outputs[0]))]
    graph.nodes.insert(graph.nodes.index(op) + 1, sink)


def _on_transposes(graph: Graph, op_types, producers: dict[str, Node]):
    """(op, the Transpose writing its first input, its perm) for each one-output ONNX op of `op_types`
    that reads a Transpose of known perm."""
    for op in list(graph.nodes):
        t = producers.get(op.input(0)) if op.domain == "" and op.op_type in op_types and len(op.outputs) == 1 else None
        perm = perm_of(graph, t) if t is not None else None
        if perm is not None:
            yield op, t, perm


def _sink_through_norms(graph: Graph, fixed: set[str]) -> bool:
    producers, readers = graph.producers(), graph.consumers()
    changed = False
    for op, t, perm in list(_on_transposes(graph, CHANNEL_NORMS, producers)):
        name = op.input(0)
        shape, dtype = graph.value(name).shape, graph.value(name).dtype
        if (shape is None or len(perm) < 3 or perm != channels_last_perm(len(perm))
                or dtype is None or dtype.name not in FLOATS or not isinstance(shape[1], int)
                or name in fixed or len(readers.get(name, [])) != 1
                or not _reaches_transpose(graph, op, perm, producers, readers, fixed)):
            continue
        out = op.outputs[0]
        inner = graph.fresh_name(f"{out}_nhwc")
        graph.set_value(Value(inner, graph.value(out).dtype, graph.value(t.inputs[0]).shape))
        at = graph.nodes.index(op)
        graph.nodes[at:at + 1] = [group_norm_nhwc(op, t.inputs[0], inner, shape[1]),
                                  Node("Transpose", [inner], [out], {"perm": perm},
                                       name=graph.fresh_name(f"{op.name}_transpose"))]
        graph.remove_nodes([t])
        producers, readers = graph.producers(), graph.consumers()
        changed = True
    return changed


def relayout_constant(graph: Graph, name: str, axes: list[int]) -> str:
    """An elementwise op's input `name` for the op run transposed by `axes`: a constant of more
    than one element (broadcast to that rank) transposed into a new initializer, else `name`."""
    arr = graph.initializers.get(name) if name else None
    if arr is None or arr.size <= 1:
        return name
    full = arr.reshape((1,) * (len(axes) - arr.ndim) + arr.shape)
    return graph.add_initializer(np.ascontiguousarray(np.transpose(full, axes)), f"{name}_T")


def reduce_axes(graph: Graph, op: Node, rank: int) -> list[int] | None:
    """The reduced axes (normalized, sorted) of a canonical Reduce* node; None if unknown or a no-op."""
    if not op.input(1):
        return None if op.attrs.get("noop_with_empty_axes", 0) else list(range(rank))
    axes = const(graph, op.input(1))
    if axes is None or (axes.size == 0 and op.attrs.get("noop_with_empty_axes", 0)):
        return None
    picked = sorted({int(a) % rank for a in axes.reshape(-1)}) if axes.size else list(range(rank))
    return picked if all(-rank <= int(a) < rank for a in axes.reshape(-1)) else None


def _sink_through_reductions(graph: Graph, fixed: set[str]) -> bool:
    producers, readers = graph.producers(), graph.consumers()
    dead: list[Node] = []
    for op, t, perm in list(_on_transposes(graph, REDUCE_OPS, producers)):
        name = op.input(0)
        if name in fixed or len(readers.get(name, [])) != 1:
            continue
        axes = reduce_axes(graph, op, len(perm))
        if axes is None:
            continue
        source_axes = sorted(perm[a] for a in axes)
        if bool(op.attrs.get("keepdims", 1)):
            after = perm
        else:
            kept = [perm[a] for a in range(len(perm)) if a not in axes]
            after = [sorted(kept).index(a) for a in kept]
        op.inputs = [t.inputs[0], graph.add_initializer(np.array(source_axes, dtype=np.int64), f"{op.name}_axes")]
        if not _is_identity(after):
            out, shape = op.outputs[0], graph.value(t.inputs[0]).shape
            op.outputs = [graph.fresh_name(f"{out}_untransposed")]
            if shape is not None:
                keep_dims = bool(op.attrs.get("keepdims", 1))
                inner = tuple(1 if i in source_axes else d for i, d in enumerate(shape)
                              if keep_dims or i not in source_axes)
                graph.set_value(Value(op.outputs[0], graph.value(out).dtype, inner))
            sink = Node("Transpose", op.outputs[:], [out], {"perm": after}, name=graph.fresh_name(f"{op.name}_transpose"))
            graph.nodes.insert(graph.nodes.index(op) + 1, sink)
        dead.append(t)
    graph.remove_nodes(dead)
    return bool(dead)


def keeps_data_order(perm: list[int], shape) -> bool:
    """Whether the Transpose moves only size-1 dims (its output is its input, reshaped)."""
    moved = [a for a in perm if shape[a] != 1]
    return moved == sorted(moved)


def _reads_flat(graph: Graph, reader: Node, name: str, source_shape) -> bool:
    """Whether `reader` (a Reshape / Flatten of `name`) gives the same result on a tensor of
    `source_shape` holding the same data in the same order."""
    if reader.domain != "" or reader.input(0) != name or name in reader.inputs[1:]:
        return False
    if reader.op_type == "Reshape":
        target = const(graph, reader.input(1))
        return target is not None and (0 not in target.reshape(-1).tolist() or bool(reader.attrs.get("allowzero", 0)))
    if reader.op_type != "Flatten":
        return False
    axis = int(reader.attrs.get("axis", 1)) % max(len(source_shape), 1)
    if not all(isinstance(d, int) for d in source_shape):  # a dynamic batch: the same dims lead
        shape = graph.value(name).shape
        return shape is not None and [d for d in source_shape[:axis] if d != 1] == [d for d in shape[:axis] if d != 1]
    flat = (int(np.prod(source_shape[:axis])), int(np.prod(source_shape[axis:])))
    return graph.value(reader.outputs[0]).shape == flat


def _bypass_into_reshapes(graph: Graph, fixed: set[str]) -> bool:
    readers = graph.consumers()
    changed = False
    for t in graph.nodes:
        perm = perm_of(graph, t)
        shape = graph.value(t.inputs[0]).shape if perm is not None else None
        if shape is None or len(shape) != len(perm) or not keeps_data_order(perm, shape):
            continue
        for reader in readers.get(t.outputs[0], []):
            if _reads_flat(graph, reader, t.outputs[0], shape):
                reader.inputs = [t.inputs[0]] + reader.inputs[1:]
                changed = True
    if changed:
        readers = graph.consumers()
        graph.remove_nodes(t for t in list(graph.nodes) if perm_of(graph, t) is not None
                           and t.outputs[0] not in fixed and not readers.get(t.outputs[0]))
    return changed

"""Resolve sequences and optionals away at build time: a plan runs tensors only.

A plan is built for known input shapes; for a sequence input that means its length and each
element's shape, given as input_shapes of the flattened names `s/0`, `s/1`, ... (an optional
input `o` holds `o/0` when it has an element; an optional sequence `o/0/0`, ...). With those,
every sequence the graph makes has a length the build knows, as long as the positions,
trip counts and conditions that shape it are build-time constants. This pass walks the graph
in order and keeps each sequence as the list of the tensor names it holds (an optional as
None or its element), so:

- SequenceConstruct/Empty/Insert/Erase, Optional, Identity on them only move names;
- SequenceAt, OptionalGetElement become an Identity of the element; SequenceLength and
  OptionalHasElement constants; SplitToSequence a Split (+ Squeeze) -- one reading the sizes
  when a 1-D split is known only at run time (its length is the sequence's; a ruled build
  binds the pieces' dims per run, polykit.compiler.graph.shape_rules); ConcatFromSequence a
  Concat (+ Unsqueeze with new_axis);
- SequenceMap inlines its body once per element; a Loop that carries or builds sequences is
  unrolled (its trip count and condition must be constants; at most MAX_UNROLL iterations), unless
  the run decides its count and its body only appends to its carried sequences: then it stays one
  Loop whose sequences are ragged outputs (passes.sequence_loop);
  an If that gives or takes them inlines the branch its constant condition picks, and one on
  a run-time condition whose branches give sequences of one structure (lengths, optionals'
  presence) stays an If over their elements' tensors;
- sequence/optional graph outputs become their elements' tensors `s/0`, `s/1`, ...

`resolve_sequences` returns the layout of the sequence inputs and outputs (the runtime form,
polykit.compiler.ir.sequences, with flattened tensor names where the arrays go) for the engine,
which flattens feeds and packs outputs with it. A position known only at run time (an input,
or computed from data) is checked and selects at run time (passes/sequence_positions.py).
What a build cannot resolve (a loop whose trip count depends on data, a sequence whose length
a run-time value decides) is a BuildError; such models run in the graph evaluator
(`evaluate_model`), which handles sequences of any length.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from polykit.compiler.ir.graph import OPTIONAL, Graph, Node, Value, subgraphs
from polykit.compiler.ops.control.sequence import split_to_sequence_sizes
from polykit.compiler.passes.control.sequence_if import if_at_run_time
from polykit.compiler.passes.control.sequence_loop import loop_appending
from polykit.compiler.passes.control.sequence_positions import (at_run_time, erase_at_run_time, insert_at_run_time,
                                                        position_at_run_time)
from polykit.compiler.passes.control.sequence_walk import (PRESENT, RAGGED, RAGGED_PREFIX, RAGGED_SHAPES, RUN_LENGTH, Layout,
                                                   Walk, layout_names)
from polykit.compiler.ir.subgraphs import captured
from polykit.errors import BuildError

#: a Loop over sequences is unrolled up to this many iterations
MAX_UNROLL = 1024


#: ops only this pass lowers, even on plain tensors (OptionalGetElement of a tensor is its input)
_OPTIONAL_OPS = ("Optional", "OptionalHasElement", "OptionalGetElement")


def touches_sequences(graph: Graph) -> bool:
    """Whether any value of the graph (bodies included) is a sequence or an optional, or a node
    is an optional op (which no target runs as a layer)."""
    if any(v.wrap for v in graph.values.values()):
        return True
    if any(n.op_type in _OPTIONAL_OPS and n.domain == "" for n in graph.nodes):
        return True
    return any(touches_sequences(body) for n in graph.nodes for _, body in subgraphs(n))


def resolve_sequences(graph: Graph, input_shapes: Mapping[str, Any],
                      input_values: Mapping[str, np.ndarray] | None = None) -> dict[str, dict[str, Layout]]:
    """Rewrite `graph` (shape-inferred) in place to tensors only; returns {"inputs": {name:
    layout}, "outputs": {name: layout}} for its sequence/optional inputs and outputs.
    `input_values` are build-time values of inputs (BuilderConfig.input_values): trip counts,
    conditions and positions fed as inputs."""
    walk = Walk(graph, _RESOLVERS)
    walk.consts.update({k: np.asarray(v) for k, v in (input_values or {}).items()})
    inputs: list[str] = []
    for name in graph.inputs:  # plain inputs at their build shapes: the walk infers exact shapes
        v = graph.value(name)
        if not v.wrap and name in input_shapes:
            graph.set_value(v.with_(shape=tuple(input_shapes[name])))
    layouts: dict[str, dict[str, Layout]] = {"inputs": {}, "outputs": {}}
    for name in graph.inputs:
        v = graph.value(name)
        if not v.wrap:
            inputs.append(name)
            continue
        layout = _input_layout(name, v.wrap, input_shapes)
        layouts["inputs"][name] = layout
        for flat in layout_names(layout):
            inputs.append(flat)
            graph.set_value(Value(flat, v.dtype, tuple(input_shapes[flat])))
        walk.structs[name] = layout
    graph.inputs = inputs
    walk.run(graph.nodes)
    outputs: list[str] = []
    for name in graph.outputs:
        if not graph.value(name).wrap:
            outputs.append(name)
            continue
        layout = _flatten_output(walk, name, walk.struct(name))
        layouts["outputs"][name] = layout
        outputs.extend(layout_names(layout))
    graph.nodes, graph.outputs = walk.emitted, outputs
    graph.values = {k: v for k, v in graph.values.items() if not v.wrap}
    return layouts


def _input_layout(name: str, wrap: tuple[str, ...], shapes: Mapping[str, Any]) -> Layout:
    """The layout input_shapes give a sequence/optional input (module docstring)."""
    if not wrap:
        if name not in shapes:
            raise BuildError(f"no shape for {name!r}", where=f"tensor {name!r}",
                             hint="give input_shapes for each element of a sequence input: 's/0', 's/1', ...")
        return name
    if wrap[0] == OPTIONAL:
        present = any(k == f"{name}/0" or k.startswith(f"{name}/0/") for k in shapes)
        return _input_layout(f"{name}/0", wrap[1:], shapes) if present else None
    items = []
    while any(k == f"{name}/{len(items)}" or k.startswith(f"{name}/{len(items)}/") for k in shapes):
        items.append(_input_layout(f"{name}/{len(items)}", wrap[1:], shapes))
    return items


def _flatten_output(walk: "Walk", name: str, struct: Layout) -> Layout:
    """Identity layers that give a sequence output's elements the names `name/i`."""
    if struct is None:
        return None
    if isinstance(struct, list):
        return [_flatten_output(walk, f"{name}/{i}", item) for i, item in enumerate(struct)]
    if isinstance(struct, dict) and PRESENT in struct:  # a run-time presence: `name/present`, its elements
        return {PRESENT: _flatten_output(walk, f"{name}/{PRESENT}", struct[PRESENT]),
                "item": _flatten_output(walk, name, struct["item"])}
    if isinstance(struct, dict) and RAGGED in struct:  # grown by a loop: its prefix `name/i`, the rest ragged
        return {RAGGED: _flatten_output(walk, f"{name}/{RAGGED}", struct[RAGGED]),
                RAGGED_SHAPES: _flatten_output(walk, f"{name}/{RAGGED_SHAPES}", struct[RAGGED_SHAPES]),
                RAGGED_PREFIX: _flatten_output(walk, name, struct[RAGGED_PREFIX])}
    if isinstance(struct, dict):  # a run-time length: its elements, and the length as `name/length`
        return {RUN_LENGTH: _flatten_output(walk, f"{name}/{RUN_LENGTH}", struct[RUN_LENGTH]),
                "items": _flatten_output(walk, name, struct["items"])}
    walk.emit(Node("Identity", [struct], [name], name=f"{name}__element"))
    return name


def _position(walk: Walk, node: Node, i: int, length: int, default: int, insert: bool = False) -> int:
    pos = walk.const(node, i, "position")
    if pos is None:
        return default
    p = int(pos.reshape(-1)[0])
    top = length if insert else length - 1
    if not -length <= p <= top:
        raise BuildError(f"position {p} is out of range for a sequence of {length} element(s)",
                         where=node.describe(), hint=f"positions lie in [-{length}, {top}]")
    return p + length if p < 0 else p


def _empty(walk: Walk, node: Node) -> None:
    walk.structs[node.outputs[0]] = []


def _construct(walk: Walk, node: Node) -> None:
    walk.structs[node.outputs[0]] = list(node.inputs)


def _insert(walk: Walk, node: Node) -> None:
    if position_at_run_time(walk, node, 2):
        insert_at_run_time(walk, node)
        return
    seq = list(walk.items(node))
    seq.insert(_position(walk, node, 2, len(seq), len(seq), insert=True), node.input(1))
    walk.structs[node.outputs[0]] = seq


def _erase(walk: Walk, node: Node) -> None:
    if position_at_run_time(walk, node, 1):
        erase_at_run_time(walk, node)
        return
    seq = list(walk.items(node))
    if not seq:
        raise BuildError("SequenceErase of an empty sequence", where=node.describe())
    del seq[_position(walk, node, 1, len(seq), len(seq) - 1)]
    walk.structs[node.outputs[0]] = seq


def _at(walk: Walk, node: Node) -> None:
    if position_at_run_time(walk, node, 1):
        at_run_time(walk, node)
        return
    seq = walk.items(node)
    if not seq:
        raise BuildError("SequenceAt of an empty sequence", where=node.describe())
    walk.alias(seq[_position(walk, node, 1, len(seq), 0)], node.outputs[0])


def _length(walk: Walk, node: Node) -> None:
    seq = walk.struct(node.input(0))
    if isinstance(seq, dict) and RUN_LENGTH in seq:  # known at run time
        walk.emit(Node("Identity", [seq[RUN_LENGTH]], [node.outputs[0]], name=f"{node.name}__length"))
        return
    walk.add_const(np.array(len(walk.items(node)), np.int64), node.outputs[0])


def _split(walk: Walk, node: Node) -> None:
    shape = walk.graph.value(node.input(0)).shape
    axis = int(node.attrs.get("axis", 0))
    if shape is None or not isinstance(shape[axis], int):
        raise walk.fail(node, "the split axis has no known length")
    axis %= len(shape)
    if node.input(1) and node.input(1) not in walk.consts:
        if _split_length(walk, node) is not None:
            _split_at_run_time(walk, node, axis)
            return
        if shape[axis] <= MAX_UNROLL:
            _chunks_at_run_time(walk, node, axis, shape[axis])
            return
    split = walk.const(node, 1, "split")
    sizes = split_to_sequence_sizes(shape[axis], split)
    if sizes is None:
        raise BuildError(f"cannot split dim {shape[axis]} by {np.asarray(split).tolist()}", where=node.describe())
    parts = [walk.graph.fresh_name(f"{node.outputs[0]}/part") for _ in sizes]
    walk.emit(Node("Split", [node.input(0), walk.add_const(np.array(sizes, np.int64))], parts, {"axis": axis},
                   f"{node.name}__split"))
    if split is None and not node.attrs.get("keepdims", 1):
        axes = walk.add_const(np.array([axis], np.int64))
        squeezed = [walk.graph.fresh_name(f"{p}/squeezed") for p in parts]
        for p, s in zip(parts, squeezed):
            walk.emit(Node("Squeeze", [p, axes], [s], name=f"{s}__squeeze"))
        parts = squeezed
    walk.structs[node.outputs[0]] = parts


def _split_length(walk: Walk, node: Node) -> int | None:
    """The number of pieces a 1-D split of a static length gives (None for a scalar chunk size, whose
    value decides the sequence's length)."""
    shape = walk.graph.value(node.input(1)).shape
    return shape[0] if shape is not None and len(shape) == 1 and isinstance(shape[0], int) else None


def _split_at_run_time(walk: Walk, node: Node, axis: int) -> None:
    """A split whose sizes are known only at run time: as many pieces as it has entries, a Split that
    reads the sizes (a ruled build binds the pieces' dims per run: polykit.compiler.graph.shape_rules)."""
    parts = [walk.graph.fresh_name(f"{node.outputs[0]}/part") for _ in range(_split_length(walk, node))]
    walk.emit(Node("Split", [node.input(0), node.input(1)], parts, {"axis": axis}, f"{node.name}__split"))
    walk.structs[node.outputs[0]] = parts


def _chunks_at_run_time(walk: Walk, node: Node, axis: int, dim: int) -> None:
    """Chunks of a scalar size `s` known only at run time: a Split into `dim` pieces of sizes
    max(0, min(s, dim - i*s)) and a sequence of the first ceil(dim / s) of them (a run-time length;
    in a ruled build the sizes and the length are host values of the ruled `s`)."""
    split, name = node.input(1), node.outputs[0]
    steps = walk.add_const(np.arange(dim, dtype=np.int64))
    names = {k: walk.graph.fresh_name(f"{name}/{k}") for k in ("starts", "left", "capped", "sizes", "span", "length")}
    for op, inputs, out in (("Mul", [steps, split], "starts"),
                            ("Sub", [walk.add_const(np.array(dim, np.int64)), names["starts"]], "left"),
                            ("Min", [names["left"], split], "capped"),
                            ("Max", [names["capped"], walk.add_const(np.array(0, np.int64))], "sizes"),
                            ("Add", [split, walk.add_const(np.array(dim - 1, np.int64))], "span"),
                            ("Div", [names["span"], split], "length")):
        walk.emit(Node(op, inputs, [names[out]], name=f"{names[out]}__{op.lower()}"))
    parts = [walk.graph.fresh_name(f"{name}/part") for _ in range(dim)]
    walk.emit(Node("Split", [node.input(0), names["sizes"]], parts, {"axis": axis}, f"{node.name}__split"))
    walk.structs[name] = {RUN_LENGTH: names["length"], "items": parts}


def _concat(walk: Walk, node: Node) -> None:
    seq = walk.items(node)
    if not seq:
        raise BuildError("ConcatFromSequence of an empty sequence", where=node.describe())
    axis = int(node.attrs["axis"])
    if node.attrs.get("new_axis", 0):
        axes = walk.add_const(np.array([axis], np.int64))
        parts = [walk.graph.fresh_name(f"{node.outputs[0]}/item") for _ in seq]
        for src, dst in zip(seq, parts):
            walk.emit(Node("Unsqueeze", [src, axes], [dst], name=f"{dst}__unsqueeze"))
        seq = parts
    walk.emit(Node("Concat", list(seq), [node.outputs[0]], {"axis": axis}, node.name))


def _map(walk: Walk, node: Node) -> None:
    n = len(node.inputs) - captured(node)
    seqs = {i: walk.items(node, i) for i in range(n) if walk.graph.value(node.inputs[i]).wrap}
    length = len(seqs[0])
    outs: list[list[Layout]] = [[] for _ in node.outputs]
    for k in range(length):
        bound = [seqs[i][k] if i in seqs else node.inputs[i] for i in range(n)]
        for j, item in enumerate(walk.inline(node.attrs["body"], node, bound, f"{node.name}/{k}")):
            outs[j].append(item)
    for name, items in zip(node.outputs, outs):
        walk.structs[name] = items


def _optional(walk: Walk, node: Node) -> None:
    walk.structs[node.outputs[0]] = walk.struct(node.input(0)) if node.input(0) in walk.structs else (
        node.input(0) or None)


def _has_element(walk: Walk, node: Node) -> None:
    name = node.input(0)
    held = walk.structs.get(name)
    if isinstance(held, dict) and PRESENT in held:  # the run decides: its flag
        walk.emit(Node("Identity", [held[PRESENT]], [node.outputs[0]], name=f"{node.outputs[0]}__present"))
        return
    present = bool(name) and (walk.struct(name) is not None if walk.graph.value(name).wrap else True)
    walk.add_const(np.array(present), node.outputs[0])


def _get_element(walk: Walk, node: Node) -> None:
    name = node.input(0)
    src = walk.struct(name) if walk.graph.value(name).wrap else name
    if src is None:
        raise BuildError("OptionalGetElement of an empty optional", where=node.describe(),
                         hint="check OptionalHasElement first")
    if isinstance(src, dict) and PRESENT in src:
        raise walk.fail(node, f"whether {name!r} holds an element is known only at run time")
    walk.alias(src, node.outputs[0])


def _identity(walk: Walk, node: Node) -> None:
    walk.alias(walk.struct(node.input(0)), node.outputs[0])


def _if(walk: Walk, node: Node) -> None:
    if node.input(0) not in walk.consts and if_at_run_time(walk, node):
        return
    key = "then_branch" if bool(walk.const(node, 0, "condition").reshape(-1)[0]) else "else_branch"
    for out, item in zip(node.outputs, walk.inline(node.attrs[key], node, [], f"{node.name}/{key}")):
        walk.alias(item, out)


def _loop(walk: Walk, node: Node) -> None:
    """Unroll the loop: its trip count and every iteration's condition must be constants (or the
    body only appends to its carried sequences: passes.sequence_loop)."""
    if any(x and x not in walk.consts for x in node.inputs[:2]) and loop_appending(walk, node):
        return
    trip = walk.const(node, 0, "trip count")
    go = walk.const(node, 1, "condition")
    limit = MAX_UNROLL if trip is None else int(trip.reshape(-1)[0])
    n = len(node.inputs) - 2 - captured(node)
    state: list[Layout] = [walk.struct(x) if walk.graph.value(x).wrap else x for x in node.inputs[2:2 + n]]
    scans: list[list[str]] = [[] for _ in node.outputs[n:]]
    i = 0
    while (go is None or bool(go.reshape(-1)[0])) and i < limit:
        if i == MAX_UNROLL:
            raise walk.fail(node, f"it runs more than {MAX_UNROLL} iterations")
        tag = f"{node.name}/{i}"
        bound = [walk.add_const(np.array(i, np.int64)), walk.add_const(np.array(True))]
        for k, item in enumerate(state):
            if isinstance(item, str) or not walk.graph.value(node.inputs[2 + k]).wrap:
                bound.append(item)
            else:  # a sequence state: a name that holds its structure for the body
                holder = walk.graph.fresh_name(f"{tag}/state{k}")
                walk.graph.set_value(walk.graph.value(node.inputs[2 + k]).with_(name=holder))
                walk.structs[holder] = item
                bound.append(holder)
        outs = walk.inline(node.attrs["body"], node, bound, tag)
        cond = outs[0]
        if cond not in walk.consts:
            raise walk.fail(node, "its condition depends on data")
        go = walk.consts[cond]
        state = outs[1:1 + n]
        for k, part in enumerate(outs[1 + n:]):
            scans[k].append(part)
        i += 1
    for out, item in zip(node.outputs[:n], state):
        walk.alias(item, out)
    for out, parts in zip(node.outputs[n:], scans):
        if not parts:
            raise walk.fail(node, "it runs no iteration, so its scan outputs have no known shape")
        axes = walk.add_const(np.array([0], np.int64))
        items = [walk.graph.fresh_name(f"{out}/item") for _ in parts]
        for src, dst in zip(parts, items):
            walk.emit(Node("Unsqueeze", [src, axes], [dst], name=f"{dst}__unsqueeze"))
        walk.emit(Node("Concat", items, [out], {"axis": 0}, f"{out}__stack"))


_RESOLVERS: dict[str, Callable[[Walk, Node], None]] = {
    "SequenceEmpty": _empty, "SequenceConstruct": _construct, "SequenceInsert": _insert,
    "SequenceErase": _erase, "SequenceAt": _at, "SequenceLength": _length, "SplitToSequence": _split,
    "ConcatFromSequence": _concat, "SequenceMap": _map, "Optional": _optional,
    "OptionalHasElement": _has_element, "OptionalGetElement": _get_element, "Identity": _identity,
    "If": _if, "Loop": _loop,
}

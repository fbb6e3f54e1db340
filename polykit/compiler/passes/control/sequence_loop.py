"""A Loop whose trip count or condition the run decides, carrying sequences it only appends to
(resolve_sequences' walk).

Unrolling needs constant control; a loop-carried sequence that the body only grows (one
SequenceInsert at the end per iteration, the carried sequence read by nothing else: no
SequenceAt, SequenceLength, position, ...) needs none: it becomes a *ragged* output of one tensor
Loop that serves every trip count. Each appended element is flattened and concatenated onto a
carried 1-D buffer (its bytes in iteration order; a carried value whose length changes across
iterations, which body plans run with a profile: polykit.compiler.builder.bodies.body_profile), and its
shape is a scan output (rows of the element's rank). The sequence's layout is
`{"ragged": buffer, "shapes": rows, "prefix": [the initial elements]}` (sequence_walk.RAGGED);
the engine slices the buffer into elements (polykit.runtime.sequences).

Whether the body appends is found by walking it (the same resolvers, each carried sequence held
as a list of one *sentinel*) with a guard that refuses any op reading a sentinel other than an
end insert, an Identity, or the optional ops (the carried value is present: the initial one by the
feed's structure, every later one a body output); the body's output must then hold
[sentinel, element]. An If on a constant condition (OptionalHasElement of the carried optional)
is inlined on the way, so test_loop16_seq_none's "start with a scalar when empty" resolves by the
structure the plan is built for.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from polykit.compiler.ir.graph import Graph, Node, Value, subgraphs
from polykit.compiler.passes.control.sequence_walk import RAGGED, RAGGED_PREFIX, RAGGED_SHAPES, Layout, Walk
from polykit.compiler.ir.subgraphs import CAPTURES, captured
from polykit.errors import BuildError

#: ops that may read a carried sequence (a sentinel) and still leave it appended-only
_PASSING = ("Identity", "Optional", "OptionalHasElement", "OptionalGetElement")


class _NotAppending(Exception):
    """The body reads a carried sequence other than by appending to it (the loop is not rewritten)."""


class _BodyWalk(Walk):
    """The walk over a Loop body with its carried sequences held as sentinels, refusing reads."""

    def __init__(self, outer: Walk, sentinels: set[str]):
        super().__init__(outer.graph, {op: _guarded(fn, sentinels) for op, fn in outer.resolvers.items()})
        self.structs = dict(outer.structs)
        self.consts = dict(outer.consts)
        self.sentinels = sentinels

    def run(self, nodes: list[Node]) -> None:
        for node in nodes:
            if node.op_type != "If" or node.input(0) not in self.consts:
                held = {n for n, s in self.structs.items() if _holds(s, self.sentinels)}
                if any(_reads(body, held) for _, body in subgraphs(node)):
                    raise _NotAppending(node.describe())
            super().run([node])


def _guarded(handler: Callable[[Walk, Node], None], sentinels: set[str]) -> Callable[[Walk, Node], None]:
    def run(walk: Walk, node: Node) -> None:
        held = [i for i, n in enumerate(node.inputs) if n and _holds(walk.structs.get(n), sentinels)]
        appends = node.op_type == "SequenceInsert" and held == [0] and not node.input(2)
        inlined = node.op_type == "If" and node.input(0) in walk.consts  # its branch walks through this guard
        if held and node.op_type not in _PASSING and not appends and not inlined:
            raise _NotAppending(node.describe())
        handler(walk, node)
    return run


def _holds(layout: Layout, sentinels: set[str]) -> bool:
    if isinstance(layout, list):
        return any(_holds(item, sentinels) for item in layout)
    if isinstance(layout, dict):
        return any(_holds(item, sentinels) for item in layout.values())
    return layout in sentinels


def _reads(body: Graph, names: set[str]) -> bool:
    return any(n in names for node in body.nodes for n in node.inputs) or any(
        _reads(sub, names) for node in body.nodes for _, sub in subgraphs(node))


def loop_appending(walk: Walk, node: Node) -> bool:
    """Emit `node` as a tensor Loop with a ragged output per carried sequence (module docstring);
    False (nothing emitted) when a carried sequence is read otherwise, its initial value's length
    is not known, or a scan output or capture is a sequence."""
    graph, body = walk.graph, node.attrs["body"]
    c = captured(node)
    n = len(node.inputs) - 2 - c
    states = node.inputs[2:2 + n]
    seqs = [k for k, x in enumerate(states) if graph.value(x).wrap]
    if not seqs or any(graph.value(x).wrap for x in node.inputs[2 + n:]) or \
            any(graph.value(o).wrap for o in node.outputs[n:]):
        return False
    prefixes = {k: walk.struct(states[k]) for k in seqs}
    if any(not isinstance(p, list) or any(not isinstance(i, str) for i in p) for p in prefixes.values()):
        return False
    tag = graph.fresh_name(f"{node.name}/body")
    sentinels = {k: graph.fresh_name(f"{tag}/carried{k}") for k in seqs}
    bw = _BodyWalk(walk, set(sentinels.values()))
    before = set(graph.initializers)
    bound = [_fresh_input(graph, body, i, tag) for i in range(2 + n)]
    for k in seqs:
        bw.structs[bound[2 + k]] = [sentinels[k]]
    try:
        outs = bw.inline(body, node, bound, tag)
    except (_NotAppending, BuildError):
        _drop_initializers(graph, set(graph.initializers) - before)
        return False
    appended = {k: outs[1 + k] for k in seqs}
    if any(not isinstance(a, list) or len(a) != 2 or a[0] != sentinels[k] or not isinstance(a[1], str)
           or _holds(a[1], bw.sentinels) for k, a in appended.items()) or \
            any(_holds(o, bw.sentinels) for j, o in enumerate(outs) if j - 1 not in appended):
        _drop_initializers(graph, set(graph.initializers) - before)
        return False
    _emit(walk, bw, node, bound, outs, {k: a[1] for k, a in appended.items()}, prefixes, before)
    return True


def _fresh_input(graph: Graph, body: Graph, i: int, tag: str) -> str:
    name = graph.fresh_name(f"{tag}/{body.inputs[i]}")
    graph.set_value(body.value(body.inputs[i]).with_(name=name))
    return name


def _drop_initializers(graph: Graph, names: set[str]) -> None:
    for name in names:
        graph.initializers.pop(name, None)


def _emit(walk: Walk, bw: _BodyWalk, node: Node, bound: list[str], outs: list[Layout], elements: dict[int, str],
          prefixes: dict[int, list[str]], before: set[str]) -> None:
    """The tensor Loop: each carried sequence k a flat buffer (initially empty) that its element's
    bytes extend, its element's shape a scan output; the sequence output's layout RAGGED."""
    graph = walk.graph
    n = len(node.inputs) - 2 - captured(node)
    shape_outs, body_outs = [], list(outs[:1 + n])
    for k, element in elements.items():
        flat = graph.fresh_name(f"{element}/flat")
        bw.emit(Node("Reshape", [element, bw.add_const(np.array([-1], np.int64))], [flat], name=f"{flat}__flatten"))
        body_outs[1 + k] = graph.fresh_name(f"{bound[2 + k]}/grown")
        bw.emit(Node("Concat", [bound[2 + k], flat], [body_outs[1 + k]], {"axis": 0}, f"{body_outs[1 + k]}__append"))
        shape_outs.append(graph.fresh_name(f"{element}/shape"))
        bw.emit(Node("Shape", [element], [shape_outs[-1]], name=f"{shape_outs[-1]}__shape"))
        graph.set_value(Value(bound[2 + k], graph.value(element).dtype, (None,)))
    body = _body_graph(graph, bw.emitted, bound, body_outs + list(outs[1 + n:]) + shape_outs,
                       set(graph.initializers) - before, node)
    free = body.inputs[2 + n:]
    inputs = list(node.inputs[:2 + n]) + free
    for k, element in elements.items():
        inputs[2 + k] = walk.add_const(np.zeros((0,), graph.value(element).dtype))
    outputs = list(node.outputs)
    for k in elements:
        outputs[k] = graph.fresh_name(f"{node.outputs[k]}/values")
    outputs += [graph.fresh_name(f"{node.outputs[k]}/rows") for k in elements]
    attrs = {key: v for key, v in node.attrs.items() if key != CAPTURES}
    attrs["body"] = body
    if free:
        attrs[CAPTURES] = len(free)
    walk.emit(Node("Loop", inputs, outputs, attrs, node.name))
    for j, k in enumerate(elements):
        walk.structs[node.outputs[k]] = {RAGGED: outputs[k], RAGGED_SHAPES: outputs[len(node.outputs) + j],
                                         RAGGED_PREFIX: prefixes[k]}


def _body_graph(graph: Graph, nodes: list[Node], bound: list[str], outputs: list[str], consts: set[str],
                node: Node) -> Graph:
    """The new body: `nodes`, inputs `bound` and the outer tensors they read (captures, same names),
    the constants the walk added as its initializers."""
    inits = {name: graph.initializers.pop(name) for name in consts if name in graph.initializers}
    defined = set(bound) | set(inits) | {o for nd in nodes for o in nd.outputs}
    free = list(dict.fromkeys(i for nd in nodes for i in nd.inputs if i and i not in defined))
    free += [o for o in outputs if o not in defined and o not in free]
    names = {n for nd in nodes for n in (*nd.inputs, *nd.outputs) if n} | set(bound) | set(outputs)
    values = {n: graph.value(n) for n in names}
    return Graph(nodes, list(bound) + free, outputs, inits, values, dict(graph.opsets),
                 f"{node.name}_body", {})

"""hoist_activations: move elementwise ops from after a Reshape to before it.

`base -> Reshape -> act` becomes `base -> act -> Reshape`, so the activation can join the
base op's epilogue (GPT-2's `Gemm -> Reshape -> Gelu`) or a Pointwise group. Legal when
`act` is elementwise and its other inputs are one-element constants (Gelu, Relu, Mul by a
scalar, Clip with scalar bounds, Cast...), which commute with any layout change, or have the
reshaped tensor's full shape: those are read under the source's shape, a constant re-laid out
at build time, an activation through a new Reshape (a view, no copy). So GPT-2's residual
`Gemm -> Reshape -> Add(residual)` becomes a Gemm epilogue too. Applies to Reshape, Flatten, Squeeze and Unsqueeze whose
input comes from Conv / Gemm / MatMul (plain or with an epilogue) or from an elementwise
op, and is read by nothing else; repeats so a whole chain of such ops moves up.
"""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Graph, Node, Value
from polykit.compiler.ops.nn.fused import EPILOGUE_ARITY
from polykit.compiler.passes.fuse_pointwise import is_fusable
from polykit.compiler.passes.rewrite import protected, sole_reader

#: layout-only ops an elementwise op commutes with
RESHAPES = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})

#: how many ops one call moves at most (each move is one op over one reshape)
MAX_MOVES = 10_000


def hoist_activations(graph: Graph, *, keep: frozenset[str] = frozenset()) -> bool:
    """Move scalar-operand elementwise ops above reshapes; True if any moved."""
    moved = 0
    while moved < MAX_MOVES and _move_one(graph, protected(graph, keep)):
        moved += 1
    return moved > 0


def _feeds_fusion(graph: Graph, node: Node | None) -> bool:
    if node is None or len(node.outputs) != 1:
        return False
    if node.op_type in EPILOGUE_ARITY and node.domain in ("", POLYKIT_DOMAIN):
        return True
    return is_fusable(graph, node) or (node.domain == POLYKIT_DOMAIN and node.op_type == "Pointwise")


def _movable(graph: Graph, act: Node, src: str, reshaped: str, tensors: bool) -> bool:
    """`act` reads `reshaped` and otherwise one-element constants whose rank does not exceed
    either side's (a (1,1,1,1) constant would broadcast a rank-1 `src` up to rank 4) or, when
    `tensors` (`src` comes straight from an op that takes epilogues: the move lets `act` join
    it; elsewhere two such moves could undo each other forever), tensors of `reshaped`'s full
    static shape (read under `src`'s shape, `_full_shape`); its output keeps that shape."""
    if not is_fusable(graph, act):
        return False
    shapes = [graph.value(n).shape for n in (src, reshaped, act.outputs[0])]
    if any(s is None for s in shapes):
        return False
    ranks = [len(s) for s in shapes[:2]]
    for name in act.inputs:
        if not name or name == reshaped:
            continue
        const = graph.initializers.get(name)
        if const is not None and const.size == 1 and const.ndim <= min(ranks):
            continue
        if not tensors or not _full_shape(graph, name, reshaped) or tuple(shapes[2]) != tuple(shapes[1]):
            return False
    return True


def _full_shape(graph: Graph, name: str, reshaped: str) -> bool:
    """`name` has `reshaped`'s static shape and dtype (so it can be read under another shape)."""
    v, r = graph.value(name), graph.value(reshaped)
    return v.is_static and r.is_static and tuple(v.shape) == tuple(r.shape) and v.dtype == r.dtype


def _move_one(graph: Graph, fixed: set[str]) -> bool:
    producers = graph.producers()
    readers = graph.consumers()
    for reshape in graph.nodes:
        if reshape.op_type not in RESHAPES or reshape.domain != "" or not reshape.inputs:
            continue
        src, mid = reshape.inputs[0], reshape.outputs[0]
        if not _feeds_fusion(graph, producers.get(src)) or sole_reader(graph, src, readers, fixed) is None:
            continue
        act = sole_reader(graph, mid, readers, fixed)
        base = producers[src]
        takes_epilogue = base.op_type in EPILOGUE_ARITY and base.domain in ("", POLYKIT_DOMAIN)
        if act is None or not _movable(graph, act, src, mid, takes_epilogue):
            continue
        _swap(graph, reshape, act)
        return True
    return False


def _swap(graph: Graph, reshape: Node, act: Node) -> None:
    """reshape(src) -> mid, act(mid) -> out  ==>  act(src) -> new, reshape(new) -> out."""
    src, mid, out = reshape.inputs[0], reshape.outputs[0], act.outputs[0]
    new = graph.fresh_name(f"{out}_before_{reshape.op_type.lower()}")
    src_shape = graph.value(src).shape
    count = len(graph.nodes)
    inputs = []
    for name in act.inputs:
        if name == mid:
            inputs.append(src)
        elif name and name != mid and _full_shape(graph, name, mid):
            inputs.append(_as_shape(graph, name, src_shape, before=reshape))
        else:
            inputs.append(name)
    act.inputs = inputs
    act.outputs = [new]
    reshape.inputs = [new] + reshape.inputs[1:]
    reshape.outputs = [out]
    graph.set_value(Value(new, graph.value(out).dtype, src_shape))
    graph.values.pop(mid, None)
    graph.nodes.remove(act)
    graph.nodes.insert(graph.nodes.index(reshape), act)
    if len(graph.nodes) != count:  # views of full-shape operands: their producers may come later
        graph.toposort()


def _as_shape(graph: Graph, name: str, shape: tuple, before: Node) -> str:
    """`name` read under `shape` (same element count): a re-laid-out constant, or the output of
    a new Reshape (a view) placed before `before`."""
    const = graph.initializers.get(name)
    if const is not None:
        return graph.add_initializer(const.reshape(shape), f"{name}_as")
    target = graph.add_initializer(np.array(shape, np.int64), f"{name}_shape")
    out = graph.fresh_name(f"{name}_as")
    graph.set_value(Value(out, graph.value(name).dtype, tuple(shape)))
    view = Node("Reshape", [name, target], [out], {}, name=graph.fresh_name(f"{name}_view"))
    graph.nodes.insert(graph.nodes.index(before), view)
    return out

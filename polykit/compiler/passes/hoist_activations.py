"""hoist_activations: move elementwise ops from after a Reshape to before it.

`base -> Reshape -> act` becomes `base -> act -> Reshape`, so the activation can join the
base op's epilogue (GPT-2's `Gemm -> Reshape -> Gelu`) or a Pointwise group. Legal when
`act` is elementwise with one tensor input (the reshaped one) and only one-element
constants besides (Gelu, Relu, Mul by a scalar, Clip with scalar bounds, Cast...), so it
commutes with any layout change. Applies to Reshape, Flatten, Squeeze and Unsqueeze whose
input comes from Conv / Gemm / MatMul (plain or with an epilogue) or from an elementwise
op, and is read by nothing else; repeats so a whole chain of such ops moves up.
"""

from __future__ import annotations

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


def _movable(graph: Graph, act: Node, src: str, reshaped: str) -> bool:
    """`act` reads `reshaped` and otherwise only one-element constants whose rank does not
    exceed either side's (a (1,1,1,1) constant would broadcast a rank-1 `src` up to rank 4)."""
    if not is_fusable(graph, act):
        return False
    ranks = [len(s) for s in (graph.value(src).shape, graph.value(reshaped).shape) if s is not None]
    if len(ranks) < 2:
        return False
    for name in act.inputs:
        if not name or name == reshaped:
            continue
        const = graph.initializers.get(name)
        if const is None or const.size != 1 or const.ndim > min(ranks):
            return False
    return True


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
        if act is None or not _movable(graph, act, src, mid):
            continue
        _swap(graph, reshape, act)
        return True
    return False


def _swap(graph: Graph, reshape: Node, act: Node) -> None:
    """reshape(src) -> mid, act(mid) -> out  ==>  act(src) -> new, reshape(new) -> out."""
    src, mid, out = reshape.inputs[0], reshape.outputs[0], act.outputs[0]
    new = graph.fresh_name(f"{out}_before_{reshape.op_type.lower()}")
    act.inputs = [src if n == mid else n for n in act.inputs]
    act.outputs = [new]
    reshape.inputs = [new] + reshape.inputs[1:]
    reshape.outputs = [out]
    src_shape = graph.value(src).shape
    graph.set_value(Value(new, graph.value(out).dtype, src_shape))
    graph.values.pop(mid, None)
    graph.nodes.remove(act)
    graph.nodes.insert(graph.nodes.index(reshape), act)

"""Sequence positions known only at run time (resolve_sequences' walk): SequenceInsert, SequenceErase
and SequenceAt whose position is an input or computed from data, over a sequence whose length the
build knows.

The position passes a CheckRange layer (ONNX's range: [-n, n] for an insert into n elements, [-n,
n - 1] for erase and at; out of it the run stops with a RuntimeInputError naming the value; negative
positions count from the end), and each output element becomes an output of one SelectByIndex
layer among the elements it may be (polykit.compiler.ops.tensor.selection). Output k of an insert at p is
sequence[k] (k < p), the tensor (k == p) or sequence[k - 1] (k > p); of an erase sequence[k] (k < p)
or sequence[k + 1]; so its candidate is a table lookup at sign(k - p) + 1: one Sub, Sign, Add and
Gather for all outputs. An element whose candidates share a shape stays static; one whose candidates
differ gets the taken candidate's shape at run time (sized dims). SequenceAt is one output whose
candidate is the position itself.
"""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.ops.tensor.selection import CHECK_RANGE, SELECT_BY_INDEX
from polykit.compiler.passes.control.sequence_walk import Walk
from polykit.errors import BuildError

#: candidates an insert's / erase's output element may take, by sign(k - p) + 1
_WIDTH = 3


def position_at_run_time(walk: Walk, node: Node, i: int) -> bool:
    """Whether input `i` (a position) of `node` is given and not known at build time."""
    return bool(node.input(i)) and node.input(i) not in walk.consts


def insert_at_run_time(walk: Walk, node: Node) -> None:
    seq = _elements(walk, node, [node.input(1)])
    n = len(seq)
    p = _checked_position(walk, node, 2, n, n)
    # candidates: 0 the tensor, 1 + i sequence[i]
    table = [[k + 1 if k < n else -1, 0, k if k > 0 else -1] for k in range(n + 1)]
    walk.structs[node.outputs[0]] = _select(walk, node, p, [node.input(1), *seq], table)


def erase_at_run_time(walk: Walk, node: Node) -> None:
    seq = _elements(walk, node, [])
    n = len(seq)
    p = _checked_position(walk, node, 1, n, n - 1)
    table = [[k, k + 1, k + 1] for k in range(n - 1)]  # candidate i is sequence[i]
    walk.structs[node.outputs[0]] = _select(walk, node, p, seq, table) if table else []


def at_run_time(walk: Walk, node: Node) -> None:
    seq = _elements(walk, node, [])
    p = _checked_position(walk, node, 1, len(seq), len(seq) - 1)
    walk.emit(Node(SELECT_BY_INDEX, [p, *seq], [node.outputs[0]], {"width": len(seq), "choices": list(range(len(seq)))},
                   f"{node.name}__select", POLYKIT_DOMAIN))


def _elements(walk: Walk, node: Node, extra: list[str]) -> list[str]:
    """The sequence's elements (tensor names): BuildError when it is empty, holds sequences or
    optionals, or its elements and `extra` differ in rank (a selection keeps its rank)."""
    seq = walk.items(node)
    if not seq:
        raise BuildError(f"{node.op_type} of an empty sequence", where=node.describe())
    if not all(isinstance(item, str) for item in seq):
        raise walk.fail(node, "its position is known only at run time and its elements are sequences or optionals")
    ranks = {len(s) if s is not None else None for s in (walk.graph.value(t).shape for t in [*seq, *extra])}
    if None in ranks or len(ranks) > 1:
        raise walk.fail(node, f"its position is known only at run time and its elements' ranks are {ranks}")
    return list(seq)


def _checked_position(walk: Walk, node: Node, i: int, length: int, top: int) -> str:
    """The position input `i` through a CheckRange of [-length, top] counting negatives from the end,
    as int64."""
    name = node.input(i)
    source = f"input {name!r}" if name in walk.graph.inputs else f"tensor {name!r}"
    what = f"{source}, the position of {node.op_type} {node.name!r} in a sequence of {length} element(s),"
    checked = walk.graph.fresh_name(f"{node.name}/position")
    walk.emit(Node(CHECK_RANGE, [name], [checked], {"lo": -length, "hi": top, "wrap": length, "what": what},
                   f"{node.name}__check_position", POLYKIT_DOMAIN))
    if walk.graph.value(name).dtype == np.dtype(np.int64):
        return checked
    wide = walk.graph.fresh_name(f"{node.name}/position64")
    walk.emit(Node("Cast", [checked], [wide], {"to": 7}, f"{node.name}__position64"))  # 7: TensorProto.INT64
    return wide


def _select(walk: Walk, node: Node, p: str, candidates: list[str], table: list[list[int]]) -> list[str]:
    """Output k: candidates[table[k][sign(k - p) + 1]] (one SelectByIndex layer for all)."""
    m = len(table)
    steps = walk.add_const(np.arange(m, dtype=np.int64))
    rows = walk.add_const(np.arange(m, dtype=np.int64) * _WIDTH + 1)
    flat = walk.add_const(np.array(table, np.int64).reshape(-1))
    names = {k: walk.graph.fresh_name(f"{node.name}/{k}") for k in ("offset", "sign", "entry", "index")}
    for op, inputs, out in (("Sub", [steps, p], "offset"), ("Sign", [names["offset"]], "sign"),
                            ("Add", [names["sign"], rows], "entry"), ("Gather", [flat, names["entry"]], "index")):
        walk.emit(Node(op, inputs, [names[out]], name=f"{names[out]}__{op.lower()}"))
    outs = [walk.graph.fresh_name(f"{node.name}/element{k}") for k in range(m)]
    walk.emit(Node(SELECT_BY_INDEX, [names["index"], *candidates], outs,
                   {"width": _WIDTH, "choices": [c for row in table for c in row]}, f"{node.name}__select",
                   POLYKIT_DOMAIN))
    return outs

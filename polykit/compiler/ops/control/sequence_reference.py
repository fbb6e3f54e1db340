"""Reference kernels: sequence and optional ops, over host values (polykit.compiler.ir.sequences):
a sequence is a list of arrays, an optional None (empty) or its element."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from polykit.compiler.ir.graph import Node
from polykit.compiler.ops.control.sequence import split_to_sequence_sizes
from polykit.compiler.ir.subgraphs import captured
from polykit.errors import RuntimeInputError
from polykit.compiler.ops.control.bodies import body_runner
from polykit.compiler.ops.references import reference


def _list(node: Node, value: Any, i: int = 0) -> list:
    if not isinstance(value, list):
        raise RuntimeInputError(f"input {i} ({node.input(i)!r}) is a {type(value).__name__}, not a sequence",
                                where=node.describe(), hint="feed a sequence as a list of arrays")
    return value


def _position(node: Node, value: Any, length: int, default: int, insert: bool = False) -> int:
    if value is None:
        return default
    p = int(np.asarray(value).reshape(-1)[0])
    top = length if insert else length - 1
    if not -length <= p <= top:
        raise RuntimeInputError(f"position {p} is out of range for a sequence of {length} element(s)",
                                where=node.describe(), hint=f"positions lie in [-{length}, {top}]")
    return p + length if p < 0 else p


@reference("SequenceEmpty")
def sequence_empty(node: Node, inputs: Sequence[Any]) -> list:
    return [[]]


@reference("SequenceConstruct")
def sequence_construct(node: Node, inputs: Sequence[Any]) -> list:
    return [[np.asarray(x) for x in inputs]]


@reference("SequenceInsert")
def sequence_insert(node: Node, inputs: Sequence[Any]) -> list:
    seq = list(_list(node, inputs[0]))
    pos = _position(node, inputs[2] if len(inputs) > 2 else None, len(seq), len(seq), insert=True)
    seq.insert(pos, np.asarray(inputs[1]))
    return [seq]


@reference("SequenceErase")
def sequence_erase(node: Node, inputs: Sequence[Any]) -> list:
    seq = list(_list(node, inputs[0]))
    if not seq:
        raise RuntimeInputError("SequenceErase of an empty sequence", where=node.describe())
    del seq[_position(node, inputs[1] if len(inputs) > 1 else None, len(seq), len(seq) - 1)]
    return [seq]


@reference("SequenceAt")
def sequence_at(node: Node, inputs: Sequence[Any]) -> list:
    seq = _list(node, inputs[0])
    if not seq:
        raise RuntimeInputError("SequenceAt of an empty sequence", where=node.describe())
    return [seq[_position(node, inputs[1], len(seq), 0)]]


@reference("SequenceLength")
def sequence_length(node: Node, inputs: Sequence[Any]) -> list:
    return [np.array(len(_list(node, inputs[0])), np.int64)]


@reference("SplitToSequence")
def split_to_sequence(node: Node, inputs: Sequence[Any]) -> list:
    x = np.asarray(inputs[0])
    axis = int(node.attrs.get("axis", 0)) % max(x.ndim, 1)
    split = inputs[1] if len(inputs) > 1 else None
    sizes = split_to_sequence_sizes(x.shape[axis], split)
    if sizes is None:
        raise RuntimeInputError(f"cannot split axis {axis} of shape {x.shape} by {np.asarray(split).tolist()}",
                                where=node.describe(), hint="the split sizes must add up to the axis length")
    bounds = np.cumsum([0] + sizes)
    parts = [np.array(np.take(x, np.arange(lo, hi), axis=axis)) for lo, hi in zip(bounds[:-1], bounds[1:])]
    if split is None and not node.attrs.get("keepdims", 1):
        parts = [np.squeeze(p, axis=axis) for p in parts]
    return [parts]


@reference("ConcatFromSequence")
def concat_from_sequence(node: Node, inputs: Sequence[Any]) -> list:
    seq = _list(node, inputs[0])
    if not seq:
        raise RuntimeInputError("ConcatFromSequence of an empty sequence", where=node.describe())
    axis = int(node.attrs["axis"])
    if node.attrs.get("new_axis", 0):
        return [np.stack(seq, axis=axis)]
    return [np.concatenate(seq, axis=axis)]


@reference("SequenceMap")
def sequence_map(node: Node, inputs: Sequence[Any]) -> list:
    n = len(inputs) - captured(node)
    seqs = [i for i in range(n) if isinstance(inputs[i], list)]
    length = len(inputs[0]) if isinstance(inputs[0], list) else 0
    if any(len(inputs[i]) != length for i in seqs):
        raise RuntimeInputError(f"the input sequences have lengths {[len(inputs[i]) for i in seqs]}",
                                where=node.describe(), hint="SequenceMap's sequences must have one length")
    outs: list[list[np.ndarray]] = [[] for _ in node.outputs]
    with body_runner(node.attrs["body"]) as run:
        for k in range(length):
            args = [inputs[i][k] if i in seqs else inputs[i] for i in range(n)] + list(inputs[n:])
            for j, value in enumerate(run(args)):
                outs[j].append(np.asarray(value))
    return outs


@reference("Optional")
def optional(node: Node, inputs: Sequence[Any]) -> list:
    return [inputs[0] if inputs else None]


@reference("OptionalHasElement")
def optional_has_element(node: Node, inputs: Sequence[Any]) -> list:
    return [np.array(bool(inputs) and inputs[0] is not None)]


@reference("OptionalGetElement")
def optional_get_element(node: Node, inputs: Sequence[Any]) -> list:
    if not inputs or inputs[0] is None:
        raise RuntimeInputError("OptionalGetElement of an empty optional", where=node.describe(),
                                hint="check OptionalHasElement first")
    return [inputs[0]]


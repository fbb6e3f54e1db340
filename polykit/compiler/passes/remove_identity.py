"""remove_identity: drop nodes that pass their input through unchanged.

Identity, inference Dropout (mask unused), Cast to the input's dtype, Reshape / Squeeze /
Unsqueeze / Flatten to the input's shape, Transpose with the identity permutation, a Concat of one input, and
Expand / Tile / Pad / Slice (steps of 1) that change nothing. Readers of the output read the input instead;
when the output is a graph output (or kept), the input's producer writes that name
instead, so graph output names stay. A node whose input and output must both keep their
names (e.g. a graph input copied to a graph output) stays.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from polykit.compiler.ir.dtypes import ONNX_TO_NUMPY
from polykit.compiler.ir.graph import Graph, Node
from polykit.compiler.passes.rewrite import const, protected, rename_produced, replace_tensor
from polykit.compiler.ir.symbolic import term_of

NoOpTest = Callable[[Graph, Node], bool]


def _same_shape(graph: Graph, node: Node) -> bool:
    a, b = graph.value(node.input(0)), graph.value(node.outputs[0])
    if a.shape is None or b.shape is None or len(a.shape) != len(b.shape):
        return False
    # a dim of a build for profiles is a SymInt: equal at opt is not equal everywhere, its expression must be;
    # a named dim (a dim_param, a shape rule's unknown) only equals itself
    return all(x is not None and y is not None and _dim_key(x) == _dim_key(y) for x, y in zip(a.shape, b.shape))


def _dim_key(d: "int | str") -> object:
    return d if isinstance(d, str) else term_of(d)


def _always(graph: Graph, node: Node) -> bool:
    return True


def _dropout(graph: Graph, node: Node) -> bool:
    mask = node.outputs[1] if len(node.outputs) > 1 else ""
    if mask and (mask in graph.outputs or any(mask in n.inputs for n in graph.nodes)):
        return False
    if not node.input(2):
        return True  # no training_mode: inference
    training = const(graph, node.input(2))
    return training is not None and not bool(training.reshape(-1)[0])


def _cast(graph: Graph, node: Node) -> bool:
    src = graph.value(node.input(0)).dtype
    if src is None or "to" not in node.attrs:
        return False
    return ONNX_TO_NUMPY.get(int(node.attrs["to"])) == np.dtype(src)


def _transpose(graph: Graph, node: Node) -> bool:
    perm = node.attrs.get("perm")
    if perm is None:
        shape = graph.value(node.input(0)).shape
        return shape is not None and len(shape) <= 1
    return list(perm) == list(range(len(perm)))


def _slice(graph: Graph, node: Node) -> bool:
    """Same shape with steps of 1 (constant or absent): every axis is kept whole from its start."""
    steps = const(graph, node.input(4)) if node.input(4) else np.ones(1, np.int64)
    return steps is not None and bool(np.all(steps == 1)) and _same_shape(graph, node)


def _tile(graph: Graph, node: Node) -> bool:
    reps = const(graph, node.input(1))
    return reps is not None and bool(np.all(reps == 1))


def _pad(graph: Graph, node: Node) -> bool:
    pads = const(graph, node.input(1))
    return pads is not None and bool(np.all(pads == 0))


NO_OP_TESTS: dict[str, NoOpTest] = {
    "Identity": _always,
    "Dropout": _dropout,
    "Cast": _cast,
    "Reshape": _same_shape,
    "Squeeze": _same_shape,
    "Unsqueeze": _same_shape,
    "Flatten": _same_shape,
    "Transpose": _transpose,
    "Expand": _same_shape,
    "Tile": _tile,
    "Pad": _pad,
    "Slice": _slice,
    "Concat": lambda graph, node: len(node.inputs) == 1,  # one input: a copy (DenseNet's first dense layer)
}


def remove_identity(graph: Graph, *, keep: frozenset[str] = frozenset()) -> bool:
    """Remove pass-through nodes; True if any went."""
    fixed = protected(graph, keep)
    removed: list[Node] = []
    for node in list(graph.nodes):
        test = NO_OP_TESTS.get(node.op_type) if node.domain == "" else None
        if test is None or not node.inputs or not node.input(0) or not node.outputs or not test(graph, node):
            continue
        src, out = node.input(0), node.outputs[0]
        if src == out:
            continue
        if out not in fixed:
            replace_tensor(graph, out, src)
        elif _can_take_name(graph, src, fixed):
            rename_produced(graph, src, out)
        else:
            continue
        removed.append(node)
        graph.remove_nodes([node])
    return bool(removed)


def _can_take_name(graph: Graph, src: str, fixed: set[str]) -> bool:
    """Whether `src`'s producer may be made to write a protected name instead."""
    if src in fixed or src in graph.inputs or src in graph.initializers:
        return False
    return any(src in n.outputs for n in graph.nodes)

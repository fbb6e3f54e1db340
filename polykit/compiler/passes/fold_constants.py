"""fold_constants: evaluate constant subgraphs with the reference kernels.

A node whose inputs are all initializers (or that has none, like Constant) is run once and
its outputs become initializers. Shape and Size of statically shaped tensors fold too, so
shape chains (Shape -> Gather -> Concat -> Reshape) collapse when shapes are static. Random
ops never fold; CastLike of a constant folds once the target's dtype is known; a node whose kernel fails stays as it is (the others still fold); an output
larger than `max_elements` that is also larger than the node's inputs (Expand, Tile,
ConstantOfShape of a huge shape) stays unmaterialized.
"""

from __future__ import annotations

import logging

import numpy as np

from polykit.compiler.ir import Graph, Node
from polykit.kernels.registry import find_reference

log = logging.getLogger("polykit.passes")

#: ops whose output is random: folding would freeze one draw
NONDETERMINISTIC = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                              "Multinomial", "Bernoulli"})
#: default cap on the elements of a folded output that grows beyond its inputs
MAX_ELEMENTS = 16 * 1024 * 1024


def fold_constants(graph: Graph, *, keep: frozenset[str] = frozenset(), max_elements: int = MAX_ELEMENTS) -> bool:
    """Replace constant nodes by initializers; True if any node folded."""
    folded: list[Node] = []
    for node in graph.nodes:
        values = _evaluate(graph, node, max_elements)
        if values is None:
            continue
        for name, arr in zip(node.outputs, values):
            if name:
                graph.initializers[name] = arr
        folded.append(node)
    graph.remove_nodes(folded)
    return bool(folded)


def _static_shape(graph: Graph, name: str) -> tuple[int, ...] | None:
    v = graph.value(name)
    return tuple(v.shape) if v.is_static else None


def _evaluate(graph: Graph, node: Node, max_elements: int) -> list[np.ndarray] | None:
    if node.op_type in NONDETERMINISTIC or not node.outputs:
        return None
    if node.op_type == "Dropout" and node.domain == "" and len(node.inputs) > 2 and node.inputs[2]:
        return None  # training_mode given as an input: may be random
    if node.op_type in ("Shape", "Size") and node.domain == "":
        shape = _static_shape(graph, node.input(0))
        if shape is None:
            return None
        args: list[np.ndarray | None] = [_stand_in(shape, graph.value(node.input(0)).dtype)]
    elif node.op_type == "CastLike" and node.domain == "" and node.input(0) in graph.initializers:
        target = graph.value(node.input(1)).dtype
        if target is None:
            return None
        args = [graph.initializers[node.input(0)], np.zeros((), target)]  # only its dtype is read
    else:
        if any(name and name not in graph.initializers for name in node.inputs):
            return None
        args = [graph.initializers[name] if name else None for name in node.inputs]
    in_size = sum(a.size for a in args if a is not None)
    if node.op_type == "Constant" and node.domain == "":
        in_size = max_elements * 1024  # its value is already materialized in the attribute
    for out in node.outputs:
        shape = _static_shape(graph, out) if out else None
        if shape is not None and int(np.prod(shape)) > max(max_elements, in_size):
            return None
    fn = find_reference(node.domain, node.op_type)
    if fn is None:
        return None
    try:
        outs = [np.asarray(o) for o in fn(node, args)]
    except Exception as exc:  # a failing node stays; the runtime reports it with context
        log.debug("fold_constants: %s not folded: %s: %s", node.describe(), type(exc).__name__, exc)
        return None
    if len(outs) < len([o for o in node.outputs if o]):
        return None
    if any(o.size > max(max_elements, in_size) for o in outs):
        return None
    return [np.array(o) if not o.flags.owndata else o for o in outs]


def _stand_in(shape: tuple[int, ...], dtype) -> np.ndarray:
    """An array of `shape` without memory (Shape/Size read only its shape)."""
    dt = np.dtype(dtype) if dtype is not None and np.dtype(dtype) != np.dtype(object) else np.dtype(np.float32)
    return np.lib.stride_tricks.as_strided(np.zeros(1, dt), shape=shape, strides=(0,) * len(shape))

"""fold_constants: evaluate constant subgraphs with the reference kernels.

A node whose inputs are all initializers (or that has none, like Constant) is run once and
its outputs become initializers. Shape and Size of statically shaped tensors fold too, so
shape chains (Shape -> Gather -> Concat -> Reshape) collapse when shapes are static. Random
ops never fold; CastLike of a constant folds once the target's dtype is known; a node whose
kernel fails stays as it is (the others still fold); an output larger than `max_elements`
that is also larger than the node's inputs (Expand, Tile, ConstantOfShape of a huge shape)
stays unmaterialized. The graph evaluator's partial evaluation does the work
(polykit.compiler.graph.evaluator.Partial with materialize=True).
"""

from __future__ import annotations

import numpy as np

from polykit.compiler.graph.evaluator import Partial, evaluate_nodes
from polykit.compiler.ir.graph import Graph, Value

#: default cap on the elements of a folded output that grows beyond its inputs
MAX_ELEMENTS = 16 * 1024 * 1024


def fold_constants(graph: Graph, *, keep: frozenset[str] = frozenset(), max_elements: int = MAX_ELEMENTS) -> bool:
    """Replace constant nodes by initializers; True if any node folded."""
    folded: dict[str, np.ndarray] = {}
    evaluate_nodes(graph.nodes, graph.initializers, partial=Partial(graph, max_elements, materialize=True),
                   on_tensor=lambda name, value, node: folded.__setitem__(name, value))
    done = [node for node in graph.nodes if any(name in folded for name in node.outputs)]
    graph.initializers.update(folded)
    for name, value in folded.items():  # what a shape rule said before (perhaps unknown) gives way to the value
        graph.set_value(Value(name, value.dtype, tuple(value.shape)))
    graph.remove_nodes(done)
    return bool(done)

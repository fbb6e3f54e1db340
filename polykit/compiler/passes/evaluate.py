"""Run a graph node by node with the reference kernels: the oracle the pass tests compare against.

It is deliberately simple (no memory planning, every value kept): use it to check that a
rewrite left a graph's outputs unchanged, or to look at intermediate values.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np

from polykit.compiler.ir import Graph
from polykit.errors import RuntimeInputError
from polykit.kernels.registry import run_reference


def evaluate(graph: Graph, feeds: Mapping[str, np.ndarray], *, outputs: Iterable[str] | None = None,
             keep_all: bool = False) -> dict[str, np.ndarray]:
    """Values of `outputs` (default: the graph outputs), or of every tensor with keep_all=True."""
    missing = [name for name in graph.inputs if name not in feeds and name not in graph.initializers]
    if missing:
        raise RuntimeInputError(f"no feed for graph input(s) {missing}", where=f"graph {graph.name!r}",
                                hint="pass an array for every graph input")
    env: dict[str, np.ndarray] = dict(graph.initializers)
    env.update({k: np.asarray(v) for k, v in feeds.items()})
    for node in graph.nodes:
        outs = run_reference(node, [env[name] if name else None for name in node.inputs])
        for name, arr in zip(node.outputs, outs):
            if name:
                env[name] = arr
    if keep_all:
        return env
    wanted = list(graph.outputs if outputs is None else outputs)
    return {name: env[name] for name in wanted}

"""Small graph builders and checks shared by the pass tests (imported by module name)."""

from __future__ import annotations

from collections import Counter
from typing import Iterable

import numpy as np

from polykit.compiler.graph.evaluator import evaluate_graph
from polykit.compiler.graph.infer import infer_shapes
from polykit.compiler.ir.graph import Graph, Node, Value

F32 = np.dtype(np.float32)


def graph(nodes: Iterable[Node], inputs: dict[str, tuple], outputs: list[str],
          initializers: dict[str, np.ndarray] | None = None, strict: bool = True) -> Graph:
    """A shape-inferred Graph; `inputs` maps name -> shape (float32) or (shape, dtype)."""
    values = {}
    for name, spec in inputs.items():
        shape, dtype = (spec if len(spec) == 2 and isinstance(spec[0], tuple) else (spec, F32))
        values[name] = Value(name, np.dtype(dtype), tuple(shape))
    g = Graph(list(nodes), list(inputs), outputs, dict(initializers or {}), values)
    g.validate()
    g.toposort()
    infer_shapes(g, strict=strict)
    return g


def node(op: str, inputs: list[str], outputs: list[str] | str, name: str | None = None, domain: str = "",
         **attrs) -> Node:
    outs = [outputs] if isinstance(outputs, str) else list(outputs)
    return Node(op, list(inputs), outs, attrs, name or f"{op.lower()}_{outs[0]}", domain)


def scalar(value: float, dtype=np.float32) -> np.ndarray:
    return np.array(value, dtype=dtype)


def feeds_for(g: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for name in g.inputs:
        v = g.value(name)
        if v.dtype == np.bool_:
            feeds[name] = rng.random(v.shape) > 0.3
        elif v.dtype.kind in "iu":
            feeds[name] = rng.integers(1, 5, v.shape).astype(v.dtype)
        else:
            feeds[name] = (rng.standard_normal(v.shape) + 0.1).astype(v.dtype)
    return feeds


def run_and_compare(g: Graph, rewrite, *, seed: int = 0, rtol: float = 1e-5, atol: float = 1e-6,
                    feeds: dict | None = None) -> tuple[Graph, bool]:
    """Apply `rewrite(copy) -> bool` and assert the outputs are unchanged (on `feeds`, else random ones of
    `seed`); (rewritten, changed)."""
    feeds = feeds if feeds is not None else feeds_for(g, seed)
    before = evaluate_graph(g, feeds)
    after_graph = g.copy()
    changed = rewrite(after_graph)
    after_graph.validate()
    after_graph.toposort()
    infer_shapes(after_graph, strict=False)
    after = evaluate_graph(after_graph, feeds)
    assert list(after) == list(before)
    for name in before:
        assert after[name].dtype == before[name].dtype, name
        np.testing.assert_allclose(after[name], before[name], rtol=rtol, atol=atol, err_msg=name)
    return after_graph, changed


def op_counts(g: Graph) -> Counter:
    return Counter(n.op_type if not n.domain else f"{n.domain}:{n.op_type}" for n in g.nodes)

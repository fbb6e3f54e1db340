"""Property: any DAG of elementwise ops computes the same values after pointwise fusion."""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .passes_testkit import graph, node, run_and_compare

from polykit.compiler.passes import fuse_pointwise

UNARY = ["Relu", "Sigmoid", "Tanh", "Neg", "Abs", "Exp", "Softsign"]
BINARY = ["Add", "Sub", "Mul", "Max", "Min"]
SHAPES = [(2, 3, 4), (3, 4), (4,), (1, 3, 1), ()]


@st.composite
def elementwise_dags(draw):
    inputs = {"x0": (2, 3, 4)}
    for k in range(1, draw(st.integers(1, 3))):
        inputs[f"x{k}"] = draw(st.sampled_from(SHAPES))
    names = list(inputs)
    nodes = []
    for k in range(draw(st.integers(2, 9))):
        out = f"t{k}"
        if draw(st.booleans()):
            nodes.append(node(draw(st.sampled_from(UNARY)), [draw(st.sampled_from(names))], out))
        else:
            a, b = draw(st.sampled_from(names)), draw(st.sampled_from(names))
            nodes.append(node(draw(st.sampled_from(BINARY)), [a, b], out))
        names.append(out)
    outputs = sorted({names[-1], *draw(st.lists(st.sampled_from(names[len(inputs):]), max_size=2))})
    return nodes, inputs, outputs


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(elementwise_dags(), st.integers(0, 1000))
def test_fusing_any_elementwise_dag_keeps_every_output(dag, seed):
    nodes, inputs, outputs = dag
    g = graph(nodes, inputs, outputs)
    out, _ = run_and_compare(g, fuse_pointwise, seed=seed)
    assert set(out.outputs) == set(outputs)
    for n in out.nodes:
        if n.op_type == "Pointwise":
            shapes = {out.value(o).shape for o in n.outputs}
            assert len(shapes) == 1

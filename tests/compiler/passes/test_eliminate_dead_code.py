import numpy as np

from .passes_testkit import graph, node, op_counts, run_and_compare

from polykit.compiler.passes import eliminate_dead_code


def _graph():
    return graph([node("Relu", ["x"], "r"), node("Exp", ["x"], "unused"), node("Neg", ["unused"], "unused2"),
                  node("Add", ["r", "w"], "y")],
                 {"x": (2, 3), "spare": (1,)}, ["y"], {"w": np.ones(3, np.float32), "w_unused": np.ones(2, np.float32)})


def test_nodes_nobody_reads_are_removed():
    out, changed = run_and_compare(_graph(), eliminate_dead_code)
    assert changed and op_counts(out) == {"Relu": 1, "Add": 1}


def test_unused_initializers_are_removed_and_used_ones_stay():
    g = _graph()
    eliminate_dead_code(g)
    assert set(g.initializers) == {"w"}


def test_graph_inputs_stay_even_when_unused():
    g = _graph()
    eliminate_dead_code(g)
    assert g.inputs == ["x", "spare"]


def test_kept_tensors_keep_their_producers_alive():
    g = _graph()
    eliminate_dead_code(g, keep=frozenset({"unused"}))
    assert op_counts(g) == {"Relu": 1, "Exp": 1, "Add": 1}


def test_a_clean_graph_reports_no_change():
    g = _graph()
    eliminate_dead_code(g)
    assert not eliminate_dead_code(g)

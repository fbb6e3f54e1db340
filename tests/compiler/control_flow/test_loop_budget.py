"""Loops are bounded: constant folding stops a Loop at the fold_iterations budget (at once when
its trip count is known to exceed it), and a run stops one at run_iterations."""

from __future__ import annotations

import numpy as np
import pytest

from polykit import limits
from polykit.compiler.graph.evaluator import evaluate_graph
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.compiler.passes.fold_constants import fold_constants
from polykit.errors import LimitError
from polykit.testing import hostile


def test_folding_a_loop_of_2_62_iterations_fails_at_once_naming_the_limit(tmp_path):
    graph = load_onnx(hostile.model_loop_constant(tmp_path))
    with pytest.raises(LimitError, match=r"runs 4611686018427387904 iterations at build time .* fold_iterations") as info:
        fold_constants(graph)
    assert "--limit fold_iterations=" in info.value.hint


def test_folding_a_loop_within_the_budget_still_folds(tmp_path):
    model = hostile._loop_model(5, cond_from_input=False)
    graph = load_onnx(model)
    assert fold_constants(graph) and not any(n.op_type == "Loop" for n in graph.nodes)
    assert evaluate_graph(graph, {"x": np.zeros(1, np.float32)})["y"].tolist() == [5.0]


def test_a_loop_whose_condition_is_known_only_at_run_time_stops_at_the_run_budget(tmp_path):
    graph = load_onnx(hostile.model_loop_runtime(tmp_path))
    with limits.raised(run_iterations=50), pytest.raises(LimitError, match=r"iterations in one run, more than the run_iterations limit \(50\)"):
        evaluate_graph(graph, {"x": np.zeros(1, np.float32)})
    short = load_onnx(hostile._loop_model(7, cond_from_input=True))
    with limits.raised(run_iterations=50):
        assert evaluate_graph(short, {"x": np.ones(1, np.float32)})["y"].tolist() == [8.0]

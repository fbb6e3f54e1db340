"""polykit.tools.debug.precision_search with fake checks and arrays: the search finds the nodes a
build needs in fp32 (a set, not a prefix of the ranking) within its trial bound; the
rankings score what each node adds to the error."""

from __future__ import annotations

import math

import numpy as np
import pytest

from polykit.errors import UsageError
from polykit.tools.debug.precision_search import (find_fp32_set, isolated_scores, layerwise_scores, rank, tensor_error,
                                            verdict_score)
from polykit.tools.debug.tactic_bisect import Verdict

NODES = [f"n{i}" for i in range(12)]


class NeedsFp32:
    """Passes when every node of `needed` is kept in fp32; records the sets it was asked about."""

    def __init__(self, needed: set[str]):
        self.needed, self.seen = needed, []

    def __call__(self, fp32: frozenset[str]) -> Verdict:
        self.seen.append(fp32)
        missing = len(self.needed - fp32)
        return Verdict(missing == 0, max_abs=float(missing), max_rel=float(missing))


@pytest.mark.parametrize("needed", [{"n0"}, {"n11"}, {"n2", "n7"}, {"n1", "n5", "n9"}])
def test_the_needed_nodes_are_found_within_2_plus_log2_n_plus_k_checks(needed):
    check = NeedsFp32(needed)
    result = find_fp32_set(NODES, check)
    assert set(result.nodes) == needed and result.verdict.passed and not result.low.passed
    assert len(check.seen) == len(set(check.seen)) == result.checks
    k = NODES.index(max(needed, key=NODES.index)) + 1  # the prefix the bisection stops at
    assert result.checks <= 2 + math.ceil(math.log2(len(NODES))) + k


def test_a_good_ranking_keeps_the_search_short():
    ranked = ["n9", "n4"] + [n for n in NODES if n not in ("n9", "n4")]
    result = find_fp32_set(ranked, NeedsFp32({"n4", "n9"}))
    assert result.nodes == ("n9", "n4") and result.checks <= 2 + math.ceil(math.log2(len(NODES))) + 2


def test_a_build_that_passes_as_it_is_needs_no_fp32_node():
    result = find_fp32_set(NODES, NeedsFp32(set()))
    assert result.nodes == () and result.checks == 1


def test_a_failure_that_fp32_does_not_fix_is_a_usage_error():
    with pytest.raises(UsageError, match="fail even with every candidate node in fp32"):
        find_fp32_set(NODES, lambda fp32: Verdict(False, 1.0, 1.0, "y: off"))


def test_isolated_scores_put_one_node_at_a_time_in_low_precision():
    check = NeedsFp32({"n3"})
    scores = isolated_scores(NODES[:5], check)
    assert scores == {"n0": 0.0, "n1": 0.0, "n2": 0.0, "n3": 1.0, "n4": 0.0}
    assert all(len(s) == 4 for s in check.seen)


def test_rank_orders_by_score_nan_first_and_keeps_order_on_ties():
    scores = {"a": 0.5, "b": math.nan, "c": math.inf, "d": 0.5, "e": 0.0}
    assert rank(scores, ["a", "b", "c", "d", "e", "f"]) == ["b", "c", "a", "d", "e", "f"]
    assert verdict_score(Verdict(False, 1.0, math.inf)) == math.inf and verdict_score(Verdict(True, 1.0, 1.0)) == 0.0


def test_tensor_error_is_relative_to_the_references_largest_magnitude():
    ref = np.array([[1.0, -4.0], [2.0, 0.0]], np.float32)
    assert tensor_error(ref + np.float32(0.04), ref) == pytest.approx(0.01)
    assert tensor_error(np.array([np.inf, 1.0]), np.array([70000.0, 1.0])) == math.inf
    assert tensor_error(np.array([np.inf]), np.array([np.inf])) == 0.0
    assert tensor_error(np.zeros(3), np.zeros(2)) == math.inf


def test_layerwise_scores_name_the_node_that_overflows_not_those_that_carry_it_on():
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (4, 8))
    h = x * 1e5
    y = h * 1e-5
    reference = {"x": x, "h": h, "y": y, "z": y + 1}
    actual = {"x": x, "h": np.full_like(h, np.inf), "y": np.full_like(y, np.inf), "z": y + 1.5}
    nodes = [("overflow", ["x"], ["h"]), ("scale", ["h"], ["y"]), ("shift", ["y"], ["z"]), ("missing", ["x"], ["q"])]
    scores = layerwise_scores(nodes, actual, reference)
    assert scores["overflow"] == math.inf and scores["scale"] == 0.0 and scores["missing"] == 0.0
    assert scores["shift"] == 0.0  # its input was inf already: what it adds cannot be told
    growth = layerwise_scores([("shift", ["y"], ["z"])], {"y": y, "z": y + 1.5}, reference)
    assert growth["shift"] == pytest.approx(0.5 / float(np.abs(y + 1).max()))

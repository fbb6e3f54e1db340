"""polykit.tools.debug.reduce_search with fake checks: the bisection isolates any node, the first
included, linear refinement drops the nodes a failure does not need, within the trial bound."""

from __future__ import annotations

import math

import pytest

from polykit.errors import UsageError
from polykit.tools.debug.reduce_search import reduce_nodes
from polykit.tools.debug.tactic_bisect import Verdict


class FakeCheck:
    """Fails (Verdict.passed False) when every node of `needed` is in the set; counts its calls."""

    def __init__(self, needed: set[int]):
        self.needed, self.seen = needed, []

    def __call__(self, nodes: tuple[int, ...]) -> Verdict:
        self.seen.append(nodes)
        fails = self.needed <= set(nodes)
        return Verdict(not fails, max_abs=1.0 if fails else 0.0, max_rel=0.0)


@pytest.mark.parametrize("count, culprit", [(16, 0), (16, 7), (16, 15), (1, 0), (2, 0), (37, 36), (100, 1)])
def test_one_culprit_anywhere_is_isolated_within_1_plus_2_log2_n_plus_1_checks(count, culprit):
    check = FakeCheck({culprit})
    result = reduce_nodes(count, check)
    assert result.nodes == (culprit,) and not result.verdict.passed
    assert result.checks <= 1 + 2 * math.ceil(math.log2(max(count, 2))) + 1


def test_a_failure_that_needs_two_distant_nodes_keeps_both_and_only_them():
    check = FakeCheck({3, 11})
    result = reduce_nodes(20, check)
    assert result.nodes == (3, 11)
    assert len(check.seen) == len(set(check.seen)) == result.checks  # memoized: no set is checked twice
    assert result.checks <= 1 + 2 * math.ceil(math.log2(20)) + (11 - 3 + 1)


def test_the_nearest_passing_trial_differs_least_from_the_result():
    result = reduce_nodes(16, FakeCheck({5}))
    nodes, verdict = result.nearest_passing()
    assert verdict.passed and 5 not in nodes
    best = min(len({5} ^ set(n)) for n, v in result.trials if v.passed)
    assert len({5} ^ set(nodes)) == best


def test_nearest_passing_leaves_out_trials_that_could_not_be_checked():
    result = reduce_nodes(16, FakeCheck({5}))
    first, _ = result.nearest_passing()
    second, _ = result.nearest_passing(lambda nodes: nodes != first)
    assert second != first
    assert result.nearest_passing(lambda nodes: False) is None


def test_a_model_that_passes_is_returned_whole_with_its_passing_verdict():
    result = reduce_nodes(8, lambda nodes: Verdict(True))
    assert result.nodes == tuple(range(8)) and result.verdict.passed and result.checks == 1
    with pytest.raises(UsageError, match="no nodes"):
        reduce_nodes(0, FakeCheck(set()))


def test_bisect_mode_stops_at_the_failing_span_and_linear_mode_drops_each_node_in_turn():
    check = FakeCheck({3, 5})  # fails only when nodes 3 and 5 are both kept
    assert reduce_nodes(8, check, "bisect").nodes == (3, 4, 5)
    linear = reduce_nodes(8, FakeCheck({3, 5}), "linear")
    assert linear.nodes == (3, 5) and linear.checks == 1 + 8  # the full set, then one trial per node
    assert reduce_nodes(8, FakeCheck({3, 5})).nodes == (3, 5)
    with pytest.raises(UsageError, match="--mode 'fast'"):
        reduce_nodes(8, check, "fast")

"""The bisection of `polykit debug tactics` on synthetic checks: the culprits it names, the
trials it needs (O(k log n)), interacting culprits, and the errors of bad assignments."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polykit.errors import UsageError
from polykit.tools.debug.tactic_bisect import Verdict, bisect_tactics


def _assignments(n: int, same: int = 0) -> tuple[dict[str, str], dict[str, str]]:
    """n layers whose tactics differ (good: ref, bad: fast), then `same` layers that agree."""
    names = [f"layer{i}" for i in range(n + same)]
    good = {name: "ref" for name in names}
    bad = {name: ("fast" if i < n else "ref") for i, name in enumerate(names)}
    return good, bad


def _culprits_each_alone(culprits, calls=None):
    """A check that fails when any culprit runs its bad tactic, with an error of 0.1 per culprit."""

    def is_good(assignment):
        if calls is not None:
            calls.append(dict(assignment))
        wrong = [name for name in culprits if assignment[name] == "fast"]
        return Verdict(not wrong, max_abs=0.1 * len(wrong), max_rel=0.01 * len(wrong), detail=f"{len(wrong)} wrong")

    return is_good


def _bound(k: int, n: int) -> int:
    return k * (math.ceil(math.log2(n)) + 2) + 1


@pytest.mark.parametrize("n, culprits", [
    (7, [3]), (7, [0, 6]), (7, [1, 2, 5]), (8, [7]), (8, [0, 1]), (16, [4, 11]), (33, [0, 16, 32]), (100, [50, 51]),
])
def test_independent_culprits_are_found_exactly_within_the_trial_bound(n, culprits):
    good, bad = _assignments(n, same=3)
    names = [f"layer{i}" for i in culprits]
    result = bisect_tactics(good, bad, _culprits_each_alone(names))
    assert [c.layer for c in result.culprits] == names
    assert result.suspects == tuple(f"layer{i}" for i in range(n))
    assert result.checks <= _bound(len(names), n)


def test_two_culprits_among_seven_layers_take_at_most_2_log2_n_plus_4_trials():
    good, bad = _assignments(7)
    worst = 0
    for pair in itertools.combinations(range(7), 2):
        names = [f"layer{i}" for i in pair]
        result = bisect_tactics(good, bad, _culprits_each_alone(names))
        assert [c.layer for c in result.culprits] == names
        worst = max(worst, result.checks)
    assert worst <= 2 * math.ceil(math.log2(7)) + 4


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 40).flatmap(lambda n: st.tuples(st.just(n), st.sets(st.integers(0, n - 1), min_size=1, max_size=4))))
def test_any_set_of_independent_culprits_is_found_within_k_log_n_trials(case):
    n, culprits = case
    good, bad = _assignments(n)
    names = [f"layer{i}" for i in sorted(culprits)]
    calls = []
    result = bisect_tactics(good, bad, _culprits_each_alone(names, calls))
    assert [c.layer for c in result.culprits] == names
    assert result.checks == len(calls) <= _bound(len(names), n)
    assert len({tuple(sorted(c.items())) for c in calls}) == len(calls)  # no assignment checked twice


def test_each_culprit_reports_its_tactics_and_the_error_it_introduces_alone():
    good, bad = _assignments(6)
    result = bisect_tactics(good, bad, _culprits_each_alone(["layer1", "layer4"]))
    first = result.culprits[0]
    assert (first.layer, first.tactic, first.good_tactic, first.group) == ("layer1", "fast", "ref", ())
    assert first.alone == Verdict(False, 0.1, 0.01, "1 wrong")
    assert result.bad == Verdict(False, 0.2, 0.02, "2 wrong")


def test_the_last_trial_proves_the_culprits_are_a_fix():
    good, bad = _assignments(9)
    result = bisect_tactics(good, bad, _culprits_each_alone(["layer2", "layer3", "layer8"]))
    on_bad, verdict = result.trials[-1]
    assert verdict.passed and set(on_bad) == set(result.suspects) - {"layer2", "layer3", "layer8"}


def test_a_bad_assignment_that_passes_has_no_culprits_after_one_trial():
    good, bad = _assignments(5)
    result = bisect_tactics(good, bad, _culprits_each_alone([]))
    assert result.culprits == () and result.checks == 1 and result.bad.passed


def test_a_bool_check_is_a_verdict_without_errors():
    good, bad = _assignments(4)
    result = bisect_tactics(good, bad, lambda a: a["layer2"] != "fast")
    assert [c.layer for c in result.culprits] == ["layer2"]
    assert result.culprits[0].alone == Verdict(False)


def test_culprits_that_fail_only_together_are_found_as_one_group():
    good, bad = _assignments(8)
    result = bisect_tactics(good, bad, lambda a: not (a["layer2"] == "fast" and a["layer5"] == "fast"))
    assert [(c.layer, c.group, c.alone.passed) for c in result.culprits] == [("layer2", ("layer5",), True),
                                                                              ("layer5", ("layer2",), True)]


def test_interacting_and_independent_culprits_are_all_found():
    good, bad = _assignments(12)

    def is_good(a):
        return not (a["layer11"] == "fast" or (a["layer2"] == "fast" and a["layer5"] == "fast") or a["layer0"] == "fast")

    result = bisect_tactics(good, bad, is_good)
    assert {c.layer: c.group for c in result.culprits} == {"layer0": (), "layer2": ("layer5",), "layer5": ("layer2",),
                                                           "layer11": ()}
    assert result.trials[-1][1].passed


def test_a_pair_hidden_behind_an_independent_culprit_is_not_missed():
    """The pair's halves land in passing trials while the search finds layer7; the check of
    everything but layer7 still fails and the pair is searched for."""
    good, bad = _assignments(8)
    result = bisect_tactics(good, bad, lambda a: not (a["layer7"] == "fast" or
                                                      (a["layer2"] == "fast" and a["layer5"] == "fast")))
    assert [c.layer for c in result.culprits] == ["layer2", "layer5", "layer7"]


def test_a_good_assignment_that_fails_too_is_a_usage_error():
    good, bad = _assignments(6)
    with pytest.raises(UsageError, match="the good tactic assignment fails the check too \\(always\\)"):
        bisect_tactics(good, bad, lambda a: Verdict(False, detail="always"))


def test_identical_assignments_that_fail_are_a_usage_error_after_one_trial():
    good, _ = _assignments(0, same=4)
    calls = []
    with pytest.raises(UsageError, match="fails the check too"):
        bisect_tactics(good, dict(good), lambda a: calls.append(a) or False)
    assert len(calls) == 1


def test_assignments_of_different_layers_are_a_usage_error():
    with pytest.raises(UsageError, match="different layers: 'b'"):
        bisect_tactics({"a": "ref", "b": "ref"}, {"a": "fast"}, lambda a: True)

"""Search for a small set of nodes that must stay in fp32 for a reduced-precision build to pass.

`find_fp32_set(ranked, check)` takes the candidate nodes ranked by their error contribution
(largest first) and a check of a set S (a build with S in fp32, every other node in the low
precision; Verdict.passed: the outputs meet the tolerance). It assumes that keeping more
nodes in fp32 never makes the outputs worse:

1. every candidate in fp32 must pass (else precision is not what fails), and the build with
   none in fp32 is checked (passing: the empty set is the answer);
2. bisection over the ranking: the smallest k such that the top k nodes in fp32 pass;
3. refinement: each of those k nodes in turn, lowest ranked first, leaves the set when the
   set passes without it, so every node left is needed (1-minimal) — a set, not a prefix.

Trials are memoized by set: at most 2 + ceil(log2 n) + k of them for n candidates.

The ranking comes from `isolated_scores` (the error of a build with only that node in low
precision) or `layerwise_scores` (how much a node's outputs err beyond its inputs in one
build with every tensor marked, against the reference's values of those tensors).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from polykit.errors import UsageError
from polykit.tools.debug.tactic_bisect import Verdict

#: check(nodes kept in fp32) -> Verdict (passed: the outputs meet the tolerance)
SetCheck = Callable[[frozenset[str]], Verdict]


@dataclass(frozen=True)
class PrecisionSearch:
    """The fp32 set found (in ranking order), its verdict, the low-precision build's verdict
    and every trial in order."""

    nodes: tuple[str, ...]
    verdict: Verdict
    low: Verdict
    trials: tuple[tuple[frozenset[str], Verdict], ...]

    @property
    def checks(self) -> int:
        return len(self.trials)


def find_fp32_set(ranked: Sequence[str], check: SetCheck) -> PrecisionSearch:
    """The small fp32 set of the module docstring; UsageError when even every node in fp32 fails."""
    trials: dict[frozenset[str], Verdict] = {}

    def trial(nodes: Iterable[str]) -> Verdict:
        key = frozenset(nodes)
        if key not in trials:
            trials[key] = check(key)
        return trials[key]

    low = trial(())
    if low.passed:
        return PrecisionSearch((), low, low, tuple(trials.items()))
    everything = trial(ranked)
    if not everything.passed:
        raise UsageError(f"the outputs fail even with every candidate node in fp32 ({everything.detail or 'failed'}): "
                         "the error does not come from reduced precision",
                         hint="loosen the tolerances (--atol/--rtol), or debug the build with `polykit debug tactics`")
    lo, hi = 1, len(ranked)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if trial(ranked[:mid]).passed else (mid + 1, hi)
    kept = list(ranked[:lo])
    for node in reversed(ranked[:lo]):
        if len(kept) > 1 and trial([n for n in kept if n != node]).passed:
            kept.remove(node)
    return PrecisionSearch(tuple(kept), trial(kept), low, tuple(trials.items()))


def rank(scores: Mapping[str, float], order: Sequence[str]) -> list[str]:
    """`order` (topological) sorted by score, largest first (NaN counts as largest); ties keep order."""
    def key(item: tuple[int, str]) -> tuple[float, int]:
        score = scores.get(item[1], 0.0)
        return (-math.inf if math.isnan(score) else -score, item[0])

    return [name for _, name in sorted(enumerate(order), key=key)]


def verdict_score(verdict: Verdict) -> float:
    """How badly a check failed, for ranking: its worst relative error (inf when not finite),
    0 for a pass."""
    if verdict.passed:
        return 0.0
    value = verdict.max_rel if verdict.max_rel is not None else math.inf
    return value if math.isfinite(value) else math.inf


def isolated_scores(candidates: Sequence[str], check: SetCheck) -> dict[str, float]:
    """Each candidate's score when it alone runs in low precision (the others in fp32): one check each."""
    everyone = frozenset(candidates)
    return {name: verdict_score(check(everyone - {name})) for name in candidates}


def tensor_error(actual: Any, reference: Any) -> float:
    """max |actual - reference| over max |reference| (inf where actual is not finite and the
    reference is), in float64."""
    a = np.asarray(actual, dtype=np.float64)
    r = np.asarray(reference, dtype=np.float64)
    if a.shape != r.shape:
        return math.inf
    if a.size == 0:
        return 0.0
    if np.any(~np.isfinite(a) & np.isfinite(r)):
        return math.inf
    finite = np.isfinite(r)
    if not finite.any():
        return 0.0
    scale = float(np.abs(r[finite]).max()) or 1.0
    return float(np.abs(a[finite] - r[finite]).max()) / scale


def layerwise_scores(nodes: Iterable[tuple[str, Sequence[str], Sequence[str]]], actual: Mapping[str, Any],
                     reference: Mapping[str, Any]) -> dict[str, float]:
    """Per node (name, input tensors, output tensors): the error of its outputs minus that of
    its inputs (tensor_error; tensors only one side has count as exact), at least 0; an output
    that goes non-finite from finite inputs scores inf."""
    def error(name: str) -> float:
        return tensor_error(actual[name], reference[name]) if name in actual and name in reference else 0.0

    scores = {}
    for name, inputs, outputs in nodes:
        out = max((error(t) for t in outputs if t), default=0.0)
        inp = max((error(t) for t in inputs if t), default=0.0)
        if math.isinf(out):
            scores[name] = 0.0 if math.isinf(inp) else math.inf
        else:
            scores[name] = max(out - inp, 0.0)
    return scores

"""Delta debugging over the nodes of a model: a small set of nodes that still fails a check.

`reduce_nodes(count, check, mode)` takes the number of nodes (indices 0..count-1 in
topological order) and a check of a set of them (the subgraph those nodes make, its inputs fed
with the values they have in the full model): Verdict.passed False means the subgraph still
shows the failure. When the full set passes there is nothing to reduce: the result is the full
set with its passing verdict (Polygraphy's `debug reduce` also ends normally then). Else, by
`mode` ("bisect": steps 1 and 2, Polygraphy's default; "linear": step 3 over every node, one
trial per node; "both", polykit's default: 1, 2 and 3):

1. Bisection for the first node the failure needs: the largest `lo` such that nodes
   lo..count-1 fail (binary search: the nodes before a culprit see exact inputs, so a range
   that starts after it passes). lo may be 0: the first node can be the culprit.
2. Bisection for the last node it needs: the smallest `hi` such that lo..hi fails (a range
   that ends before the error reaches a boundary output passes).
3. Linear refinement: each node of lo..hi in turn is dropped when the set without it still
   fails, so every node left is needed (1-minimal), also where lo..hi holds nodes of other
   branches that topological order put between them.

Trials are memoized by node set. For a culprit that fails alone the search takes at most
1 + 2 * ceil(log2 count) + (hi - lo + 1) trials.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from polykit.errors import UsageError
from polykit.tools.debug.tactic_bisect import Verdict

#: check(nodes: tuple of node indices, ascending) -> Verdict (passed: the failure is gone)
NodeCheck = Callable[[tuple[int, ...]], Verdict]


@dataclass(frozen=True)
class ReduceResult:
    """The minimal failing node set found, its verdict, and every trial in order."""

    nodes: tuple[int, ...]
    verdict: Verdict
    trials: tuple[tuple[tuple[int, ...], Verdict], ...]

    @property
    def checks(self) -> int:
        return len(self.trials)

    def nearest_passing(self, usable: Callable[[tuple[int, ...]], bool] = lambda nodes: True
                        ) -> tuple[tuple[int, ...], Verdict] | None:
        """The passing trial closest to the result (fewest nodes in one set and not the other,
        then fewest nodes); `usable` leaves out trials that passed only because they could not
        be checked."""
        want = set(self.nodes)
        passing = [(nodes, v) for nodes, v in self.trials if v.passed and nodes and usable(nodes)]
        return min(passing, key=lambda t: (len(want.symmetric_difference(t[0])), len(t[0])), default=None)


#: the values of reduce_nodes' `mode` (and of `debug reduce --mode`)
MODES = ("both", "bisect", "linear")


def require_mode(mode: str) -> None:
    if mode not in MODES:
        raise UsageError(f"--mode {mode!r} is not one of {', '.join(MODES)}", hint='give --mode bisect, linear or both')


def reduce_nodes(count: int, check: NodeCheck, mode: str = "both") -> ReduceResult:
    """The minimal failing set of nodes 0..count-1 (module docstring; the full set when it
    passes); UsageError when the model has no nodes or `mode` is unknown."""
    if count < 1:
        raise UsageError("the model has no nodes to reduce", hint="give a model with at least one node")
    require_mode(mode)
    search = _Search(check)
    full = search.trial(range(count))
    if full.passed:
        return ReduceResult(tuple(range(count)), full, search.history())
    kept = _bisect(search, count) if mode != "linear" else list(range(count))
    if mode != "bisect":
        for node in list(kept):
            if len(kept) > 1 and not search.trial([n for n in kept if n != node]).passed:
                kept.remove(node)
    nodes = tuple(kept)
    return ReduceResult(nodes, search.trial(nodes), search.history())


def _bisect(search: "_Search", count: int) -> list[int]:
    """Steps 1 and 2: the span lo..hi of the module docstring."""
    low, high = 0, count - 1
    while low < high:  # largest lo with lo..count-1 failing
        mid = (low + high + 1) // 2
        low, high = (mid, high) if not search.trial(range(mid, count)).passed else (low, mid - 1)
    lo = low
    low, high = lo, count - 1
    while low < high:  # smallest hi with lo..hi failing
        mid = (low + high) // 2
        low, high = (low, mid) if not search.trial(range(lo, mid + 1)).passed else (mid + 1, high)
    return list(range(lo, low + 1))


class _Search:
    def __init__(self, check: NodeCheck):
        self.check = check
        self.verdicts: dict[tuple[int, ...], Verdict] = {}

    def trial(self, nodes: Sequence[int]) -> Verdict:
        key = tuple(sorted(nodes))
        if key not in self.verdicts:
            self.verdicts[key] = self.check(key)
        return self.verdicts[key]

    def history(self) -> tuple[tuple[tuple[int, ...], Verdict], ...]:
        return tuple(self.verdicts.items())

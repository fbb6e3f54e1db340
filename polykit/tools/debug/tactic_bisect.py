"""Delta debugging over tactic choices: the layers whose tactics make a build wrong.

`bisect_tactics(good, bad, is_good)` takes two assignments (layer -> tactic name) of the same
layers and a check of an assignment. The layers whose tactics differ are the suspects (n of
them); a trial puts a set S of suspects on their bad tactics and every other layer on its
good one. The bad assignment (S = all) is the first trial; the good one (S = empty) must
pass, and is checked only when no other trial has passed by the time it matters.

The search runs in rounds over K, a failing set of suspects (first: all of them):

1. Binary splitting for a culprit that fails alone: trial the first half of K's suspects
   not yet seen in a passing trial; failing, keep it; passing, its suspects are clean and
   the second half is kept. The last suspect is tried alone: the error it introduces on its
   own, and the proof that it is a culprit.
2. If it passes alone, the culprits of K only fail together: QuickXplain (Junker, AAAI 2004)
   finds a minimal failing group of K (every member needed), trying each member alone too.
3. Trial all suspects but the culprits found: passing ends the search (the culprits are a
   fix: on their good tactics the build passes); failing makes that set the next K.

Trials are memoized by S. For k culprits that each fail alone among n suspects the search
takes at most k * (ceil(log2 n) + 2) + 1 trials, the bad one included (2 culprits among 7
suspects: 10); interacting culprits cost O(g log n) more per group of g.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from polykit.errors import UsageError


@dataclass(frozen=True)
class Verdict:
    """The check of one assignment: passed or not, and (for a comparison of outputs) the worst
    absolute and relative error over the outputs; `detail` says what failed."""

    passed: bool
    max_abs: float | None = None
    max_rel: float | None = None
    detail: str = ""


#: is_good(assignment: {layer: tactic}) -> Verdict (or a bool: passed)
Check = Callable[[Mapping[str, str]], "Verdict | bool"]


@dataclass(frozen=True)
class Culprit:
    """A layer whose bad tactic breaks the build: `alone` is the check with only this layer on
    its bad tactic; `group` names the other layers it fails only together with (interacting
    culprits; empty when it fails alone)."""

    layer: str
    tactic: str
    good_tactic: str
    alone: Verdict
    group: tuple[str, ...] = ()


@dataclass(frozen=True)
class BisectResult:
    """What the search found: the culprits (in layer order), the suspects (layers whose tactics
    differ), the verdict of the bad assignment and every trial made, in order (the suspects it
    put on their bad tactics, its verdict)."""

    culprits: tuple[Culprit, ...]
    suspects: tuple[str, ...]
    bad: Verdict
    trials: tuple[tuple[tuple[str, ...], Verdict], ...] = ()

    @property
    def checks(self) -> int:
        """Assignments checked (builds made), the bad one included."""
        return len(self.trials)


def bisect_tactics(good: Mapping[str, str], bad: Mapping[str, str], is_good: Check) -> BisectResult:
    """The culprits among the layers whose tactics differ between `good` and `bad` (module
    docstring). UsageError when the assignments name different layers, or when the good
    assignment fails the check too (then no tactic choice is to blame)."""
    if set(good) != set(bad):
        only = sorted(set(good) ^ set(bad))
        raise UsageError(f"the good and bad tactic assignments name different layers: {', '.join(map(repr, only[:5]))}",
                         hint="give assignments (replay files) of builds of the same model with the same options")
    search = _Search(good, bad, is_good)
    suspects = tuple(name for name in bad if good[name] != bad[name])
    verdict = search.trial(suspects)
    if verdict.passed:
        return BisectResult((), suspects, verdict, search.history())
    if not suspects:
        raise search.good_fails()
    groups = search.culprit_groups(suspects)
    culprits = []
    for name in suspects:
        group = next((g for g in groups if name in g), None)
        if group is not None:
            culprits.append(Culprit(name, bad[name], good[name], search.trial((name,)),
                                    tuple(n for n in group if n != name)))
    return BisectResult(tuple(culprits), suspects, verdict, search.history())


class _Search:
    """The memoized trials of one bisection and the rounds of the module docstring."""

    def __init__(self, good: Mapping[str, str], bad: Mapping[str, str], is_good: Check):
        self.good, self.bad, self.is_good = good, bad, is_good
        self.order = {name: i for i, name in enumerate(bad)}
        self.verdicts: dict[frozenset[str], Verdict] = {}
        self.sequence: list[tuple[tuple[str, ...], Verdict]] = []
        self.clean: set[str] = set()  # suspects seen in a passing trial

    def trial(self, on_bad: Sequence[str]) -> Verdict:
        key = frozenset(on_bad)
        if key not in self.verdicts:
            assignment = {name: self.bad[name] if name in key else self.good[name] for name in self.good}
            verdict = self.is_good(assignment)
            verdict = verdict if isinstance(verdict, Verdict) else Verdict(bool(verdict))
            self.verdicts[key] = verdict
            self.sequence.append((tuple(sorted(key, key=self.order.__getitem__)), verdict))
            if verdict.passed:
                self.clean.update(key)
        return self.verdicts[key]

    def history(self) -> tuple[tuple[tuple[str, ...], Verdict], ...]:
        return tuple(self.sequence)

    def culprit_groups(self, suspects: Sequence[str]) -> list[tuple[str, ...]]:
        groups: list[tuple[str, ...]] = []
        failing = list(suspects)
        while True:
            if groups:
                self.require_good()
            group = self.alone_culprit(failing)
            if group is None:
                self.require_good()
                group = tuple(sorted(self.minimal_failing(failing), key=self.order.__getitem__))
            groups.append(group)
            found = {name for g in groups for name in g}
            rest = [name for name in suspects if name not in found]
            if not rest or self.trial(rest).passed:
                break
            failing = rest
        self.require_good()
        return groups

    def alone_culprit(self, failing: Sequence[str]) -> tuple[str] | None:
        """A suspect of `failing` that fails alone, by binary splitting over its unclean suspects."""
        pool = [name for name in failing if name not in self.clean]
        if not pool:
            return None
        while len(pool) > 1:
            half = pool[:len(pool) // 2]
            pool = pool[len(half):] if self.trial(half).passed else half
        return (pool[0],) if not self.trial(pool).passed else None

    def minimal_failing(self, failing: Sequence[str]) -> list[str]:
        """QuickXplain: a subset of `failing` (which fails; the empty set passes) that fails while
        every proper subset passes, under monotony (adding bad tactics never fixes a build)."""

        def search(background: list[str], added: list[str], pool: list[str]) -> list[str]:
            if added and not self.trial(background).passed:
                return []
            if len(pool) == 1:
                return pool
            left, right = pool[:len(pool) // 2], pool[len(pool) // 2:]
            from_right = search(background + left, left, right)
            return search(background + from_right, from_right, left) + from_right

        return search([], [], list(failing))

    def require_good(self) -> None:
        """Check the good assignment once, unless a passing trial already implies it passes."""
        if not any(v.passed for v in self.verdicts.values()) and not self.trial(()).passed:
            raise self.good_fails()

    def good_fails(self) -> UsageError:
        verdict = self.trial(())
        return UsageError(f"the good tactic assignment fails the check too ({verdict.detail or 'failed'}): the "
                          "difference is not in the tactics", where="polykit debug tactics",
                          hint="loosen the tolerances (--atol/--rtol), give --good-tactics of a build known good, or "
                               "look for the fault outside the tactics (precision flags, fusion)")

"""The comparator: run N runners on identical inputs, then compare every runner's outputs
against the first one's (the reference), output by output, paired by exact name.

    results = Comparator.run([PolykitRunner(...), OnnxrtRunner(...)], data_loader)
    report = Comparator.compare_accuracy(results, compare_func=simple(CompareOptions()))
    assert report.passed

An output the reference has and a runner lacks (or the reverse) fails explicitly, except
the `optional` ones (marked intermediate tensors: one runner fuses some away), which are
listed as not compared; nothing is ever paired by position. With an OutputStore, each
runner's outputs go to disk as they are produced and comparisons read them back one tensor
at a time (layerwise runs: polykit.tools.data.output_store).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Iterable, Mapping, Sequence

from polykit.backends.base import BaseRunner
from polykit.errors import UsageError
from polykit.tools.compare.funcs import OutputComparison, failed, is_float_dtype

log = logging.getLogger("polykit")


@dataclass
class RunResults:
    """Feeds and each runner's outputs per iteration (runner names are unique). Outputs are
    dicts, or mappings that read each array from disk on access (output_store.LazyOutputs)."""

    feeds: list[dict[str, Any]] = field(default_factory=list)
    outputs: dict[str, list[Mapping[str, Any]]] = field(default_factory=dict)
    times: dict[str, list[float]] = field(default_factory=dict)

    def add(self, runner: str, outputs: list[Mapping[str, Any]], times: Sequence[float] = ()) -> None:
        if runner in self.outputs:
            raise UsageError(f"two result sets are named {runner!r}", hint="give runners distinct names")
        self.outputs[runner] = outputs
        self.times[runner] = list(times)

    @property
    def runners(self) -> list[str]:
        return list(self.outputs)


@dataclass(frozen=True)
class PairResult:
    """One runner vs the reference on one iteration; `not_compared`: optional tensors only one
    of them has (fused away by the runner or by the reference)."""

    reference: str
    runner: str
    iteration: int
    outputs: tuple[OutputComparison, ...]
    not_compared: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)

    def __bool__(self) -> bool:
        return self.passed


@dataclass(frozen=True)
class AccuracyReport:
    """Every pair's comparisons; truthy exactly when the comparison passed, so Polygraphy's
    `assert bool(Comparator.compare_accuracy(results))` gates as it does there."""

    pairs: tuple[PairResult, ...]
    problems: tuple[str, ...] = ()  # --validate findings and other run-level failures

    @property
    def passed(self) -> bool:
        return not self.problems and all(p.passed for p in self.pairs)

    def __bool__(self) -> bool:
        return self.passed

    def failures(self) -> list[tuple[PairResult, OutputComparison]]:
        return [(p, o) for p in self.pairs for o in p.outputs if not o.passed]


def _unique_names(runners: Sequence[BaseRunner]) -> list[str]:
    names, seen = [], {}
    for r in runners:
        count = seen.get(r.name, 0)
        seen[r.name] = count + 1
        names.append(r.name if count == 0 else f"{r.name}-{count}")
    return names


class Comparator:
    @staticmethod
    def run(runners: Sequence[BaseRunner], data_loader: Iterable[dict[str, Any]] | None = None,
            *, feeds: list[dict[str, Any]] | None = None, warm_up: int = 0, store: Any = None) -> RunResults:
        """Activate each runner in turn, feed it the same inputs, collect outputs and times.

        The data loader is bound to the first runner's input metadata and iterated once;
        no runner sees another's changes to them (`_feed_for`). With `store` (an OutputStore), each
        iteration's outputs are spilled to disk as soon as the runner returns them; the store
        is sealed at the end, so the results read them back lazily.
        """
        import numpy as np

        if not runners:
            raise UsageError("no runners to compare", hint="select at least one, e.g. --trt --onnxrt")
        results = RunResults(feeds=list(feeds) if feeds is not None else [])
        for runner, name in zip(runners, _unique_names(runners)):
            with runner:
                if feeds is None and not results.feeds:
                    loader = data_loader
                    if loader is None:
                        from polykit.tools.data.loaders import DataLoader

                        loader = DataLoader()
                    if hasattr(loader, "bind"):
                        loader.bind(runner.get_input_metadata())
                    results.feeds = [dict(f) for f in loader]
                    if not results.feeds:
                        raise UsageError("the data loader gave no feeds", hint="check --iterations or load_data()")
                outs, times = [], []
                for _ in range(warm_up):
                    runner.infer(_feed_for(runner, results.feeds[0]))
                for i, feed in enumerate(results.feeds):
                    log.info("running %s, iteration %d", name, i)
                    out = runner.infer(_feed_for(runner, feed))
                    times.append(runner.last_inference_time() or 0.0)
                    outs.append(store.spill(name, i, out) if store is not None else
                                {k: np.asarray(v) for k, v in out.items()})
                    del out
                results.add(name, outs, times)
        if store is not None:
            store.seal()
        return results

    @staticmethod
    def compare_accuracy(results: RunResults, compare_func: Callable[[str, Any, Any], OutputComparison] | None = None,
                         *, validate: bool = False, optional: Collection[str] = frozenset()) -> AccuracyReport:
        """Compare every runner after the first with the first, per iteration and output name
        (`optional` names missing on one side are not compared rather than failed)."""
        if compare_func is None:
            from polykit.tools.compare.funcs import CompareOptions, simple

            compare_func = simple(CompareOptions())
        names = results.runners
        pairs = []
        problems = tuple(validate_outputs(results)) if validate else ()
        if len(names) < 2:
            return AccuracyReport((), problems)
        ref_name = names[0]
        for name in names[1:]:
            ref_iters, iters = results.outputs[ref_name], results.outputs[name]
            if len(ref_iters) != len(iters):
                problems += (f"{name} has {len(iters)} iteration(s), {ref_name} has {len(ref_iters)}",)
            for i, (ref, act) in enumerate(zip(ref_iters, iters)):
                compared, skipped = compare_outputs(ref, act, ref_name, name, compare_func, optional)
                pairs.append(PairResult(ref_name, name, i, tuple(compared), tuple(skipped)))
        return AccuracyReport(tuple(pairs), problems)


def compare_outputs(ref: Mapping[str, Any], act: Mapping[str, Any], ref_name: str, name: str,
                    compare_func: Callable[[str, Any, Any], OutputComparison],
                    optional: Collection[str] = frozenset()) -> tuple[list[OutputComparison], list[str]]:
    """Pair outputs by exact name: (comparisons, names not compared). A name only one side has
    is a failure of its own, unless it is `optional`. Each pair of arrays is read, compared
    and dropped before the next (lazy mappings never load more than two)."""
    out, skipped = [], []
    for key in ref:
        if key in act:
            out.append(compare_func(key, ref[key], act[key]))
        elif key in optional:
            skipped.append(key)
        else:
            out.append(failed(key, "pairing", f"missing: {ref_name} produced {key!r} but {name} did not"))
    for key in act:
        if key in ref:
            continue
        if key in optional:
            skipped.append(key)
        else:
            out.append(failed(key, "pairing", f"extra: {name} produced {key!r} but {ref_name} did not"))
    return out, skipped


def validate_outputs(results: RunResults) -> list[str]:
    """NaN/Inf findings, one line per runner, iteration and output."""
    import numpy as np

    problems = []
    for runner, iters in results.outputs.items():
        for i, outs in enumerate(iters):
            for name, value in outs.items():
                arr = np.asarray(value)
                if arr.dtype.kind != "c" and not is_float_dtype(arr.dtype):
                    continue
                nan, inf = int(np.isnan(arr).sum()), int(np.isinf(arr).sum())
                if nan or inf:
                    problems.append(f"{runner}: output {name!r} (iteration {i}) has {nan} NaN and {inf} Inf value(s)")
    return problems


def _feed_for(runner: Any, feed: Mapping[str, Any]) -> dict[str, Any]:
    """What `runner` is given of `feed`, so that no runner changes the next one's inputs: read-only
    views for a runner that says it only reads (`reads_feeds_only`: the built-in runners; no copy,
    so a GiB input stays a GiB), a copy of each array for any other."""
    import numpy as np

    if not getattr(runner, "reads_feeds_only", False):
        return {k: np.array(v, copy=True) for k, v in feed.items()}
    views = {}
    for name, value in feed.items():
        view = np.asarray(value).view()
        view.flags.writeable = False
        views[name] = view
    return views

"""One call from a model to an accuracy verdict: what `polykit run` and
`polykit.testing.assert_accuracy` both do.

    results, report = check_accuracy("m.onnx", runners=("trt", "onnxrt"), target="cpu")
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Collection, Mapping, Sequence

import pluggy

from polykit.backends.base import BaseRunner, RunnerRequest
from polykit.errors import UsageError
from polykit.tools.compare.comparator import AccuracyReport, Comparator, RunResults
from polykit.tools.compare.funcs import CompareOptions
from polykit.tools.data.loaders import DataLoaderOptions, FeedsDataLoader, make_data_loader


@dataclass(frozen=True)
class AccuracySettings:
    """Everything besides the model and the runners that steers a comparison."""

    compare: str = "simple"
    compare_options: CompareOptions = field(default_factory=CompareOptions)
    data_loader: str = "default"
    data_options: DataLoaderOptions = field(default_factory=DataLoaderOptions)
    validate: bool = False
    warm_up: int = 0


def make_runners(names: Sequence[str], request: RunnerRequest, pm: pluggy.PluginManager | None = None) -> list[BaseRunner]:
    """Runners by name ("trt", "onnxrt", or a plugin's) from the polykit_runners hook."""
    from polykit.backends.loaders import model_type
    from polykit.plugins import runner_specs

    specs = runner_specs(pm)
    kind = model_type(request.model)
    runners = []
    for name in names:
        spec = specs.get(name)
        if spec is None:
            raise UsageError(f"unknown runner {name!r}", hint=f"use one of: {', '.join(sorted(specs))}")
        if kind not in spec.model_types:
            able = sorted(n for n, s in specs.items() if kind in s.model_types)
            raise UsageError(f"the model is a {kind} file, which the {name} runner cannot run (it runs "
                             f"{', '.join(spec.model_types)} files)", where=str(request.model),
                             hint=f"runners for {kind} files: {', '.join(able) or 'none'}; to compare with the others, "
                                  "give the ONNX model the plan was built from")
        runners.append(spec.factory(request))
    return runners


def make_compare_func(name: str, options: CompareOptions, pm: pluggy.PluginManager | None = None) -> Any:
    from polykit.plugins import compare_func_specs

    specs = compare_func_specs(pm)
    if name not in specs:
        raise UsageError(f"unknown compare function {name!r}", hint=f"use one of: {', '.join(sorted(specs))}")
    return specs[name].factory(options)


def run_comparison(runners: Sequence[BaseRunner], settings: AccuracySettings = AccuracySettings(), *,
                   feeds: list[dict[str, Any]] | None = None,
                   reference_outputs: Mapping[str, list[Mapping[str, Any]]] | None = None,
                   pm: pluggy.PluginManager | None = None, store: Any = None,
                   optional: Collection[str] = frozenset()) -> tuple[RunResults, AccuracyReport]:
    """Run `runners` on the same feeds (given, or from the settings' data loader) and compare.

    `reference_outputs` ({name: outputs per iteration}, e.g. from --load-outputs) come first,
    so live runners are compared against them. Layerwise runs pass `store` (an OutputStore:
    live outputs go to disk as they are produced and are compared one tensor at a time) and
    `optional` (marked intermediate tensors, which a runner may have fused away:
    divergence.GraphOrder.intermediates).
    """
    from polykit.plugins import data_loader_specs

    compare_func = make_compare_func(settings.compare, settings.compare_options, pm)
    loader = None
    if feeds is None:
        loader = make_data_loader(settings.data_loader, settings.data_options, data_loader_specs(pm))
    else:
        loader = FeedsDataLoader(feeds, settings.data_options.strict_inputs)
    results = RunResults()
    for name, outs in (reference_outputs or {}).items():
        results.add(name, list(outs))
    if runners:
        live = Comparator.run(runners, loader, warm_up=settings.warm_up, store=store)
        results.feeds = live.feeds
        for name in live.runners:
            results.add(name if name not in results.outputs else f"{name}-live", live.outputs[name], live.times[name])
    elif not results.outputs:
        raise UsageError("nothing to run or compare", hint="select runners (e.g. --trt --onnxrt) or --load-outputs")
    settings.compare_options.check_output_names(
        name for iterations in results.outputs.values() for outs in iterations for name in outs)
    report = Comparator.compare_accuracy(results, compare_func, validate=settings.validate, optional=optional)
    return results, report


def check_accuracy(model: str, runners: Sequence[str] = ("trt", "onnxrt"), settings: AccuracySettings = AccuracySettings(),
                   *, request: RunnerRequest | None = None, feeds: list[dict[str, Any]] | None = None,
                   pm: pluggy.PluginManager | None = None) -> tuple[RunResults, AccuracyReport]:
    """Build the named runners for `model` and compare them (first runner = reference)."""
    request = request or RunnerRequest(model=str(model), input_shapes=dict(settings.data_options.input_shapes))
    return run_comparison(make_runners(runners, request, pm), settings, feeds=feeds, pm=pm)

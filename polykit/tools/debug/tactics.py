"""`polykit debug tactics`: find the layers and tactics that make a build wrong.

    report = debug_tactics("model.onnx", BuilderConfig(target="cpu", builder_optimization_level=0))
    for culprit in report.result.culprits:
        print(culprit.layer, culprit.tactic, culprit.alone.max_abs)

The bad assignment (layer -> tactic) is the build made now with `config`, or that build with
`DebugOptions.bad_tactics` forced; the good one is `good_tactics` where that replay names a
layer, else the layer's conservative tactic (polykit.kernels.tactics.conservative_tactic:
cpu.reference on cpu, the plainest kernel on cuda). polykit.tools.debug.tactic_bisect searches the
layers whose tactics differ. Each trial builds the model in process with an assignment forced
on every layer (nothing is timed) and checks it: its outputs on fixed feeds against reference
outputs computed once (onnxruntime in process, or `load_outputs`) with the compare function
and tolerances of `polykit run`; or, with `check`, a command run with `{tactics}` replaced by
a replay file of the assignment, whose exit code 0 means good. `builds` counts every plan
built, the bad one included.
"""

from __future__ import annotations

import logging
import os
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.builder.tactic_replay import LayerChoice, TacticReplay, load_replay, save_replay
from polykit.errors import UsageError
from polykit.tools.compare.accuracy import AccuracySettings
from polykit.tools.debug.check import (artifacts_folder, check_argv, error_json, onnxrt_outputs, refuse_check_conflicts,
                                       run_check, saved_reference, verdict, write_json)
from polykit.tools.debug.tactic_bisect import BisectResult, Verdict, bisect_tactics

log = logging.getLogger("polykit")

#: the placeholder of `check` that becomes the path of a replay file
TACTICS_PLACEHOLDER = "{tactics}"
CHECK_EXAMPLE = "polykit run MODEL --trt --onnxrt --load-tactics {tactics}"


@dataclass(frozen=True)
class DebugOptions:
    """good_tactics / bad_tactics: replay files (else: conservative tactics / the build made now);
    check: a command with {tactics} (else the built-in comparison, steered by `accuracy`, against
    onnxruntime with `providers` or against `load_outputs`, on `load_inputs` or the data loader's
    feeds); artifacts: a folder for good.json, bad.json, fixed.json and culprits.json."""

    good_tactics: str | os.PathLike | None = None
    bad_tactics: str | os.PathLike | None = None
    check: str | None = None
    accuracy: AccuracySettings = field(default_factory=AccuracySettings)
    load_inputs: str | os.PathLike | None = None
    load_outputs: str | os.PathLike | None = None
    providers: tuple[str, ...] = ()
    artifacts: str | os.PathLike | None = None


@dataclass(frozen=True)
class DebugReport:
    """The bisection's result, the plans built, the two assignments (as replays with the layers'
    dtypes) and where the good one came from ("conservative" or a file)."""

    result: BisectResult
    builds: int
    good: TacticReplay
    bad: TacticReplay
    good_source: str

    def fixed(self) -> TacticReplay:
        """The bad assignment with every culprit on its good tactic (the last trial passed it)."""
        culprits = {c.layer for c in self.result.culprits}
        return TacticReplay({name: self.good.layers[name] if name in culprits else choice
                             for name, choice in self.bad.layers.items()}, "fixed")

    def to_json(self) -> dict[str, Any]:
        """The culprits, the plans built, the suspects, the good side's source, the bad build's
        verdict and every trial in order (the suspects it put on their bad tactics, its verdict)."""
        return {
            "tool": "debug tactics",
            "culprits": [{"layer": c.layer, "tactic": c.tactic, "good_tactic": c.good_tactic, "error": error_json(c.alone),
                          "group": list(c.group)} for c in self.result.culprits],
            "builds": self.builds,
            "suspects": list(self.result.suspects),
            "good": self.good_source,
            "bad": {"passed": self.result.bad.passed, "error": error_json(self.result.bad), "detail": self.result.bad.detail},
            "trials": [{"bad_layers": list(on_bad), "passed": v.passed, "error": error_json(v), "detail": v.detail}
                       for on_bad, v in self.result.trials],
        }


def debug_tactics(model: Any, config: BuilderConfig | None = None, options: DebugOptions = DebugOptions()) -> DebugReport:
    """Bisect the tactics of `model` (an ONNX path or ModelProto) built with `config` (module docstring)."""
    from polykit.backends.loaders import GraphFromOnnx, model_type
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.tuner import SHOW_BUILD_PROGRESS, progress_bar

    if model_type(model) == "plan":
        raise UsageError("debug tactics builds the model again and again: it needs the ONNX model, not a plan",
                         where=str(model), hint="give the ONNX model the plan was built from")
    refuse_check_conflicts(options.check, TACTICS_PLACEHOLDER, CHECK_EXAMPLE, load_outputs=options.load_outputs,
                           load_inputs=options.load_inputs)
    folder = artifacts_folder(options.artifacts)
    config = config or BuilderConfig()
    good_file = load_replay(options.good_tactics) if options.good_tactics is not None else None
    if options.bad_tactics is not None:
        config = replace(config, tactic_replay=load_replay(options.bad_tactics))
    trial_config = replace(config, save_tactics=None, save_timing_cache=None)  # files only the bad build writes
    graph = GraphFromOnnx(model)()
    with ExitStack() as stack:
        advance = stack.enter_context(progress_bar(None, "debug tactics"))
        stack.callback(SHOW_BUILD_PROGRESS.reset, SHOW_BUILD_PROGRESS.set(False))
        bad_plan = build_plan(graph, config)
        good, bad = _assignments(bad_plan, good_file, config)
        advance(f"bad build: {len(bad_plan.layers)} layers, {sum(good[n] != bad[n] for n in bad)} with other tactics")
        if options.check is not None:
            trials = CommandTrials(options.check, bad_plan.layers, Path(stack.enter_context(tempfile.TemporaryDirectory())))
        else:
            trials = OutputTrials(model, graph, trial_config, bad_plan, options)
        result = bisect_tactics(good, bad, _Progress(trials, good, advance))
    report = DebugReport(result, result.checks + trials.extra_builds, _replay(good, bad_plan.layers, "good"),
                         _replay(bad, bad_plan.layers, "bad"), str(options.good_tactics or "conservative"))
    if folder is not None:
        write_artifacts(folder, report)
    return report


def conservative_assignment(layers: Sequence[Any], target: str, config: BuilderConfig) -> dict[str, str]:
    """Layer name -> its conservative tactic (at the layer's precision, else at another one the
    build may give it); a layer none runs keeps its own tactic (it is then not bisected)."""
    from polykit.compiler.builder.builder import target_arch
    from polykit.compiler.builder.tuner import precision_variants
    from polykit.kernels.tactics import conservative_tactic

    arch = target_arch(target) if target != "cpu" else None
    out = {}
    for layer in layers:
        tactic = conservative_tactic(target, layer.kind, layer, arch=arch)
        if tactic is None:
            tactic = next((t for variant in precision_variants(layer, config, target)
                           if (t := conservative_tactic(target, layer.kind, variant, arch=arch)) is not None), None)
        if tactic is None:
            log.warning("layer %r: no conservative tactic runs it; it keeps %s", layer.name, layer.tactic)
        out[layer.name] = tactic.name if tactic is not None else layer.tactic
    return out


def write_artifacts(folder: Path, report: DebugReport) -> list[Path]:
    """good.json, bad.json, fixed.json (replays) and culprits.json (the report and every trial)."""
    paths = [save_replay(folder / f"{name}.json", replay)
             for name, replay in (("good", report.good), ("bad", report.bad), ("fixed", report.fixed()))]
    return paths + [write_json(folder / "culprits.json", report.to_json(), "culprits file")]


class OutputTrials:
    """The built-in check: build an assignment, run it on the feeds, compare with the reference.

    The bad plan runs first, on the data loader's feeds (or load_inputs); the reference outputs
    come from onnxruntime on those feeds (or load_outputs), once."""

    extra_builds = 0

    def __init__(self, model: Any, graph: Any, config: BuilderConfig, bad_plan: Any, options: DebugOptions):
        from polykit.plugins import data_loader_specs
        from polykit.tools.data import results_io
        from polykit.tools.compare.accuracy import make_compare_func
        from polykit.tools.data.loaders import make_data_loader

        settings = options.accuracy
        self.graph, self.config, self.layers = graph, config, bad_plan.layers
        self.bad = {layer.name: layer.tactic for layer in bad_plan.layers}
        self.compare = make_compare_func(settings.compare, settings.compare_options)
        self.validate = settings.validate
        feeds = results_io.load_feeds(options.load_inputs) if options.load_inputs else None
        loader = None if feeds else make_data_loader(settings.data_loader, settings.data_options, data_loader_specs())
        self.feeds, self.bad_outputs = self._run(bad_plan, loader, feeds)
        self.reference = self._reference(model, options)
        settings.compare_options.check_output_names(name for outs in self.reference for name in outs)

    def __call__(self, assignment: Mapping[str, str]) -> Verdict:
        from polykit.compiler.builder.builder import build_plan

        if dict(assignment) == self.bad:
            return self._verdict(self.bad_outputs)
        plan = build_plan(self.graph, replace(self.config, tactic_replay=_replay(assignment, self.layers, "trial")))
        return self._verdict(self._run(plan, None, self.feeds)[1])

    def _run(self, plan: Any, loader: Any, feeds: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        from polykit.backends.polykit_runner import PolykitRunner
        from polykit.tools.compare.comparator import Comparator

        results = Comparator.run([PolykitRunner(plan)], loader, feeds=feeds)
        return results.feeds, results.outputs["trt"]

    def _reference(self, model: Any, options: DebugOptions) -> list[dict[str, Any]]:
        if options.load_outputs is None:
            return onnxrt_outputs(model, self.feeds, options.providers)
        return saved_reference(options.load_outputs, len(self.feeds))

    def _verdict(self, outputs: list[dict[str, Any]]) -> Verdict:
        return verdict(self.feeds, self.reference, outputs, self.compare, self.validate)


class CommandTrials:
    """`--check CMD`: each assignment saved as a replay file in `folder`, {tactics} in CMD replaced
    by its path, CMD run; exit code 0 means good. The bad build made to learn the layers is one
    more build."""

    extra_builds = 1

    def __init__(self, command: str, layers: Sequence[Any], folder: Path):
        self.argv = check_argv(command, TACTICS_PLACEHOLDER, CHECK_EXAMPLE)
        self.layers, self.folder, self.count = layers, folder, 0

    def __call__(self, assignment: Mapping[str, str]) -> Verdict:
        self.count += 1
        path = save_replay(self.folder / f"trial-{self.count}.json", _replay(assignment, self.layers, "trial"))
        return run_check(self.argv, {TACTICS_PLACEHOLDER: str(path)}, CHECK_EXAMPLE)


class _Progress:
    """A check that reports each trial to the progress display."""

    def __init__(self, check: Any, good: Mapping[str, str], advance: Any):
        self.check, self.good, self.advance, self.count = check, good, advance, 0

    def __call__(self, assignment: Mapping[str, str]) -> Verdict:
        verdict = self.check(assignment)
        self.count += 1
        on_bad = sum(assignment[name] != tactic for name, tactic in self.good.items())
        self.advance(f"trial {self.count}: {on_bad} layer(s) on bad tactics {'pass' if verdict.passed else 'fail'}")
        return verdict


def _assignments(bad_plan: Any, good_file: TacticReplay | None, config: BuilderConfig) -> tuple[dict, dict]:
    """(good, bad): the good replay's tactic where it names a layer (checked as a build forcing it
    checks: the layer exists, the tactic serves its kind, the dtypes match), else the conservative one."""
    bad = {layer.name: layer.tactic for layer in bad_plan.layers}
    good = conservative_assignment(bad_plan.layers, bad_plan.target, config)
    if good_file is not None:
        good_file.check_layers(bad_plan.layers, len(bad_plan.profiles.ranges) if bad_plan.profiles is not None else 1)
        for layer in bad_plan.layers:
            tactic = good_file.forced_tactic(layer, bad_plan.target)
            if tactic is not None:
                good[layer.name] = tactic.name
    return good, bad


def _replay(assignment: Mapping[str, str], layers: Sequence[Any], source: str) -> TacticReplay:
    """`assignment` forced on every layer, with the dtypes the bad build gave the layers; a layer
    left on its bad tactic keeps the bad build's tactic per optimization profile (profile_tactics)."""
    return TacticReplay({layer.name: LayerChoice(assignment[layer.name], tuple(layer.in_dtypes), tuple(layer.out_dtypes),
                                                 tuple(layer.profile_tactics) if assignment[layer.name] == layer.tactic
                                                 else ())
                         for layer in layers}, source)

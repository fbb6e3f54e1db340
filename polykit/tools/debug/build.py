"""`debug build`: build the model again and again and judge each build, to catch what makes
builds differ (Polygraphy's `debug build`; polykit's builder times tactics, so two builds can
choose differently).

Each iteration builds a plan with the builder options (with `save_tactics`, each build writes
its tactic replay, which `files.artifacts` then sorts into good/ and bad/ for
`polykit inspect diff-tactics --dir`), then judges it: with `check`, a command run with the
plan at the iteration artifact (`files.iter_artifact`, default polygraphy_debug.engine; {model}
in the command becomes its path), judged by `rules`; else the built-in check: the plan's outputs
against onnxruntime's (or `load_outputs`) on the same feeds, computed once. `until` stops it:
a number of iterations, "good" (the first passing build) or "bad" (the first failing one).
Iteration state lives in polykit.tools.debug.iteration.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from polykit.compiler.builder.config import BuilderConfig
from polykit.errors import UsageError
from polykit.tools.debug.check import (CheckOptions, command_argv, refuse_check_conflicts, run_check, saved_reference,
                                       verdict)
from polykit.tools.debug.tactic_bisect import Verdict

PLAN_PLACEHOLDER = "{model}"
CHECK_EXAMPLE = "polykit run polygraphy_debug.engine --trt --load-outputs golden.json"
ITER_ARTIFACT = "polygraphy_debug.engine"
#: more iterations than any --until asks for is a mistake, not a plan (Polygraphy stops at 100000 too)
MAX_ITERATIONS = 100_000


@dataclass(frozen=True)
class BuildOptions(CheckOptions):
    """The check (CheckOptions) and `until`: a number of iterations, "good" or "bad" (module
    docstring)."""

    until: int | str = 1


@dataclass(frozen=True)
class BuildIteration:
    """One build: its index (from 0), its verdict and where its artifacts were sorted to."""

    iteration: int
    verdict: Verdict
    sorted: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"iteration": self.iteration, "passed": self.verdict.passed, "detail": self.verdict.detail,
                "artifacts": list(self.sorted)}


@dataclass(frozen=True)
class BuildReport:
    iterations: tuple[BuildIteration, ...]

    @property
    def passed(self) -> int:
        return sum(it.verdict.passed for it in self.iterations)

    def to_json(self) -> dict[str, Any]:
        return {"tool": "debug build", "iterations": [it.to_json() for it in self.iterations],
                "passed": self.passed, "total": len(self.iterations)}


def debug_build(model: Any, config: BuilderConfig | None = None, options: BuildOptions = BuildOptions()
                ) -> BuildReport:
    """Build `model` (an ONNX path or ModelProto) until `options.until` (module docstring)."""
    from polykit.backends.loaders import GraphFromOnnx, model_type
    from polykit.compiler.builder.builder import build_plan

    if model_type(model) == "plan":
        raise UsageError("debug build builds the model again and again: it needs the ONNX model, not a plan",
                         where=str(model), hint="give the ONNX model the plan was built from")
    if not (options.until in ("good", "bad") or isinstance(options.until, int) and 0 < options.until <= MAX_ITERATIONS):
        raise UsageError(f"until {options.until!r} is neither good, bad nor a number of iterations from 1 to "
                         f"{MAX_ITERATIONS}", hint='give --until good, --until bad or a number of iterations')
    refuse_check_conflicts(options.check, PLAN_PLACEHOLDER, CHECK_EXAMPLE, placeholder_required=False,
                           load_outputs=options.load_outputs, load_inputs=options.load_inputs)
    config = config or BuilderConfig()
    graph = GraphFromOnnx(model)()
    check: Any = _CommandCheck(options) if options.check is not None else _BuiltinCheck(model, options)
    done: list[BuildIteration] = []
    for index in range(MAX_ITERATIONS):
        plan = build_plan(graph, config)
        result = check(plan)
        moved = options.files.sort(result.passed, index)
        done.append(BuildIteration(index, result, tuple(map(os.fspath, moved))))
        if options.until == ("good" if result.passed else "bad") or index + 1 == options.until:
            break
    return BuildReport(tuple(done))


class _CommandCheck:
    """The plan saved to the iteration artifact, the command run on it."""

    def __init__(self, options: BuildOptions):
        self.argv, _ = command_argv(options.check, PLAN_PLACEHOLDER)
        self.rules, self.files = options.rules, options.files
        self.artifact = options.files.claim(ITER_ARTIFACT)

    def __call__(self, plan: Any) -> Verdict:
        plan.save(self.artifact)
        try:
            return run_check(self.argv, {PLAN_PLACEHOLDER: str(self.artifact)}, CHECK_EXAMPLE, self.rules)
        finally:
            self.files.done(self.artifact)


class _BuiltinCheck:
    """Each plan's outputs against the reference on fixed feeds (module docstring)."""

    def __init__(self, model: Any, options: BuildOptions):
        from polykit.backends.onnxrt import OnnxrtRunner, SessionFromOnnx
        from polykit.plugins import data_loader_specs
        from polykit.tools.compare.accuracy import make_compare_func
        from polykit.tools.compare.comparator import Comparator
        from polykit.tools.data import results_io
        from polykit.tools.data.loaders import make_data_loader

        settings = options.accuracy
        self.compare = make_compare_func(settings.compare, settings.compare_options)
        self.validate = settings.validate
        feeds = results_io.load_feeds(options.load_inputs) if options.load_inputs else None
        loader = None if feeds else make_data_loader(settings.data_loader, settings.data_options, data_loader_specs())
        results = Comparator.run([OnnxrtRunner(SessionFromOnnx(model, options.providers))], loader, feeds=feeds)
        self.feeds = results.feeds
        self.reference = (results.outputs["onnxrt"] if options.load_outputs is None
                          else saved_reference(options.load_outputs, len(self.feeds)))
        settings.compare_options.check_output_names(name for outs in self.reference for name in outs)

    def __call__(self, plan: Any) -> Verdict:
        from polykit.backends.polykit_runner import PolykitRunner
        from polykit.tools.compare.comparator import Comparator

        outputs = Comparator.run([PolykitRunner(plan)], feeds=self.feeds).outputs["trt"]
        return verdict(self.feeds, self.reference, outputs, self.compare, self.validate)

"""`polykit debug reduce`: shrink a failing model to a minimal failing subgraph.

    report = debug_reduce("model.onnx", BuilderConfig(target="cpu"))
    onnx.save(report.reduced.model, "reduced.onnx")
    print(report.reduced.nodes, report.verdict.max_abs, report.checks)

The full model runs once in onnxruntime with every intermediate tensor marked as an output;
those values (on the data loader's feeds, or `load_inputs`; a `load_outputs` file's tensors
take precedence where it has them) are cached. A candidate is a set of the model's nodes
(polykit.tools.debug.reduce_search picks them: bisection, then linear refinement): the subgraph
they make (polykit.tools.model.subgraph) takes as inputs the tensors its nodes read and no node of
it writes, fed with their cached values, so it sees real data; its outputs are the tensors
it writes that the rest of the model reads, or the model's outputs. Intermediate non-float
inputs (shapes, indices) are baked in as initializers, so shape inference sees them.

The built-in check builds each candidate with polykit in process (`config`; one build per
check) and compares its outputs with their cached reference values (compare function and
tolerances of `polykit run`). A candidate polykit cannot build or run does not show the
failure. With `check`, a command runs instead: {model} becomes the path of the candidate,
{inputs} that of an .npz of its feeds (polykit's format), and exit code 0 means it passes
(`rules` change that). A command without {model} is Polygraphy's form: each candidate is
written to the iteration artifact (`files.iter_artifact`, default polygraphy_debug.onnx) for it
to read. After each check the files of `files.artifacts` are sorted into good/ and bad/
(polykit.tools.debug.iteration).

An --int8 / --fp8 build quantizes every subgraph with the whole model's scales
(polykit.tools.debug.quantized): the built-in check's build of the whole model (the search's
first) calibrates it, on the config's calibration data or the cached feeds, into its
calibration cache (else a temporary one), and every subgraph's build reads that cache and
never calibrates on the subgraph's inputs. With `check` the whole model is calibrated into
`calibration_cache` (which must be given) before the search, for the command to read.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

from polykit.compiler.builder.config import BuilderConfig
from polykit.errors import PolykitError, UsageError
from polykit.tools.compare.accuracy import AccuracySettings
from polykit.tools.debug.check import (CheckOptions, command_argv, error_json, refuse_check_conflicts, run_check,
                                       saved_reference, verdict)
from polykit.tools.debug.iteration import IterationFiles
from polykit.tools.debug.quantized import needs_data, quantizes, reading_cache, shared_calibration
from polykit.tools.debug.reduce_search import reduce_nodes, require_mode
from polykit.compiler.ir.subgraphs import outer_names
from polykit.tools.model.subgraph import Extractor, TensorSpec
from polykit.tools.debug.tactic_bisect import Verdict

MODEL_PLACEHOLDER, INPUTS_PLACEHOLDER = "{model}", "{inputs}"
CHECK_EXAMPLE = "polykit run {model} --trt --onnxrt --load-inputs {inputs}"
ITER_ARTIFACT = "polygraphy_debug.onnx"


@dataclass(frozen=True)
class ReduceOptions(CheckOptions):
    """The check (CheckOptions; a command: module docstring, with {model} and optionally
    {inputs}, or reading the iteration artifact) and `mode`, the search (reduce_search.MODES)."""

    mode: str = "both"


@dataclass(frozen=True)
class Candidate:
    """A subgraph of the model: its nodes (names), the onnx.ModelProto and its feeds per iteration."""

    nodes: tuple[str, ...]
    model: Any
    feeds: tuple[dict[str, Any], ...]


@dataclass(frozen=True)
class ReduceStep:
    """One check of the search: a set of nodes given as the span of the model's topological
    order from `first` to `last` without the nodes `left_out`, and its verdict."""

    nodes: int
    first: str
    last: str
    left_out: tuple[str, ...]
    verdict: Verdict

    @classmethod
    def of(cls, indices: Sequence[int], names: Sequence[str], verdict: Verdict) -> "ReduceStep":
        """The step that checked `indices` (ascending, into `names`: the nodes in order)."""
        kept = set(indices)
        span = range(indices[0], indices[-1] + 1)
        return cls(len(indices), names[indices[0]], names[indices[-1]], tuple(names[i] for i in span if i not in kept),
                   verdict)

    def to_json(self) -> dict[str, Any]:
        return {"nodes": self.nodes, "first": self.first, "last": self.last, "left_out": list(self.left_out),
                "passed": self.verdict.passed, "error": error_json(self.verdict), "detail": self.verdict.detail}


@dataclass(frozen=True)
class ReduceReport:
    """The minimal failing subgraph and its verdict, the nearest passing subgraph the search
    met (None when it met none) and its verdict, the model's node count, the checks made, the
    plans built in process (0 with `check`) and every check in order."""

    reduced: Candidate
    verdict: Verdict
    min_good: Candidate | None
    min_good_verdict: Verdict | None
    total_nodes: int
    checks: int
    builds: int
    steps: tuple[ReduceStep, ...] = ()

    def to_json(self) -> dict[str, Any]:
        from polykit.tools.model.subgraph import describe_io

        def subgraph(candidate: Candidate, v: Verdict) -> dict[str, Any]:
            return {**describe_io(candidate.model), "ops": [n.op_type for n in candidate.model.graph.node],
                    "passed": v.passed, "error": error_json(v), "detail": v.detail}

        good = self.min_good
        return {"tool": "debug reduce", "total_nodes": self.total_nodes, "reduced": subgraph(self.reduced, self.verdict),
                "min_good": None if good is None else subgraph(good, self.min_good_verdict),
                "checks": self.checks, "builds": self.builds, "steps": [step.to_json() for step in self.steps]}

    def save(self, output: str | os.PathLike, min_good: str | os.PathLike | None = None) -> dict[str, Any]:
        """Write the reduced model to `output` and, when asked and found, the nearest passing one
        to `min_good`; to_json() with the paths written ("path"; None where nothing was)."""
        from polykit.compiler.graph.onnx_export import save_model

        doc = self.to_json()
        save_model(self.reduced.model, output)
        doc["reduced"]["path"] = os.fspath(output)
        if doc["min_good"] is not None:
            if min_good is not None:
                save_model(self.min_good.model, min_good)
            doc["min_good"]["path"] = None if min_good is None else os.fspath(min_good)
        return doc


def debug_reduce(model: Any, config: BuilderConfig | None = None, options: ReduceOptions = ReduceOptions()
                 ) -> ReduceReport:
    """Reduce `model` (an ONNX path or ModelProto) that fails the check (module docstring)."""
    from polykit.backends.loaders import _model_proto, model_type
    from polykit.compiler.builder.tuner import SHOW_BUILD_PROGRESS, progress_bar

    if model_type(model) == "plan":
        raise UsageError("debug reduce cuts subgraphs out of the ONNX model: it needs the ONNX model, not a plan",
                         where=str(model), hint="give the ONNX model the plan was built from")
    require_mode(options.mode)
    refuse_check_conflicts(options.check, MODEL_PLACEHOLDER, CHECK_EXAMPLE, placeholder_required=False,
                           load_outputs=options.load_outputs)
    config = config or BuilderConfig()
    if options.check is not None and quantizes(config) and config.calibration_cache is None:
        flag = "--int8" if config.int8 else "--fp8"
        raise UsageError(f"debug reduce --check with {flag} quantizes nothing itself: the command builds each subgraph; "
                         "its scales must be the whole model's", hint=f"give --calibration-cache FILE (the whole "
                         f"model is calibrated into it first) and the command {flag} --calibration-cache FILE")
    subgraphs = Subgraphs(_model_proto(model))
    needs_values = options.check is None or INPUTS_PLACEHOLDER in options.check or needs_data(config)
    if needs_values:
        subgraphs.cache_values(options)
    with ExitStack() as stack:
        advance = stack.enter_context(progress_bar(None, "debug reduce"))
        stack.callback(SHOW_BUILD_PROGRESS.reset, SHOW_BUILD_PROGRESS.set(False))
        if quantizes(config):
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="polykit-reduce-")))
            config = shared_calibration(config, folder, subgraphs.model_feeds())
        if options.check is not None:
            if quantizes(config):
                subgraphs.calibrate(config)
            check: Any = CommandCheck(subgraphs, options, Path(stack.enter_context(tempfile.TemporaryDirectory())))
        else:
            check = BuiltinCheck(subgraphs, config, options.accuracy)
        result = reduce_nodes(len(subgraphs.order), _Progress(check, advance, options.files), options.mode)
    near = result.nearest_passing(lambda nodes: nodes not in check.unchecked)
    names = [subgraphs.nodes[i].name for i in subgraphs.order]
    return ReduceReport(subgraphs.candidate(result.nodes), result.verdict,
                        None if near is None else subgraphs.candidate(near[0]), None if near is None else near[1],
                        len(subgraphs.order), result.checks, check.builds,
                        tuple(ReduceStep.of(nodes, names, v) for nodes, v in result.trials))


class Subgraphs:
    """The model's nodes in topological order, cached tensor values, and the subgraph of a node set."""

    def __init__(self, model: Any):
        self.extractor = Extractor(model)
        g = self.extractor.model.graph
        self.nodes = list(g.node)
        self.order = self._order([o.name for o in g.output])
        self.model_outputs = [o.name for o in g.output]
        self.graph_inputs = set(self.extractor.graph_inputs)
        self.values: list[dict[str, Any]] | None = None

    def _order(self, outputs: list[str]) -> list[int]:
        """Indices of the nodes the outputs need: the model's order where it is topological."""
        needed = self.extractor.nodes_between(self.extractor.graph_inputs, outputs)
        ordered = sorted(needed)
        producer = self.extractor.producers
        topological = all(producer.get(t, -1) < i for i in ordered for t in self.nodes[i].input if t)
        return ordered if topological else needed

    def cache_values(self, options: ReduceOptions) -> None:
        """Every tensor's value per iteration: the feeds, onnxruntime's run of the model with
        every tensor marked, and the `load_outputs` file's tensors over them."""
        from polykit.backends.loaders import MARK_ALL, ModifyOutputs
        from polykit.backends.onnxrt import OnnxrtRunner, SessionFromOnnx
        from polykit.plugins import data_loader_specs
        from polykit.tools.data import results_io
        from polykit.tools.compare.comparator import Comparator
        from polykit.tools.data.loaders import make_data_loader

        settings = options.accuracy
        feeds = results_io.load_feeds(options.load_inputs) if options.load_inputs else None
        loader = None if feeds else make_data_loader(settings.data_loader, settings.data_options, data_loader_specs())
        marked = ModifyOutputs(self.extractor.model, outputs=MARK_ALL)
        results = Comparator.run([OnnxrtRunner(SessionFromOnnx(marked, options.providers))], loader, feeds=feeds)
        values = [{**feed, **outs} for feed, outs in zip(results.feeds, results.outputs["onnxrt"])]
        if options.load_outputs is not None:
            saved = saved_reference(options.load_outputs, len(values))
            values = [{**v, **s} for v, s in zip(values, saved)]
        self.values = values

    def io(self, nodes: Sequence[int]) -> tuple[list[str], list[str]]:
        """The subgraph's inputs (read, not written, not initializers) and outputs (written
        and read by another node or a model output; else the last node's outputs)."""
        chosen = [self.nodes[self.order[i]] for i in nodes]
        members = {id(n) for n in chosen}
        written = [t for n in chosen for t in n.output if t]
        read = [t for n in chosen for t in (*n.input, *outer_names(n)) if t]
        inputs = [t for t in dict.fromkeys(read) if t not in written and t not in self.extractor.initializers]
        outside = {t for n in self.nodes if id(n) not in members for t in (*n.input, *outer_names(n))}
        outputs = [t for t in written if t in outside or t in self.model_outputs]
        return inputs, outputs or [t for t in chosen[-1].output if t]

    def candidate(self, nodes: Sequence[int]) -> Candidate:
        """The subgraph of `nodes` (indices into `order`) with its feeds (none without cached values)."""
        inputs, outputs = self.io(nodes)
        values = self.values or []
        baked = [t for t in inputs if values and t not in self.graph_inputs and _constant(values, t)]
        specs = [TensorSpec(t, tuple(values[0][t].shape), values[0][t].dtype) if values else TensorSpec(t)
                 for t in inputs if t not in baked]
        sub = self.extractor.extract(specs, outputs, {t: values[0][t] for t in baked})
        feeds = tuple({s.name: v[s.name] for s in specs} for v in values)
        return Candidate(tuple(self.nodes[self.order[i]].name for i in nodes), sub, feeds)

    def model_feeds(self) -> list[dict[str, Any]]:
        """The model's inputs of each iteration, from the cached values."""
        return [{name: v[name] for name in self.extractor.graph_inputs if name in v} for v in self.values or []]

    def calibrate(self, config: BuilderConfig) -> None:
        """Build the whole model with `config`: an --int8 / --fp8 build calibrates it into its
        calibration cache (nothing happens when the cache exists)."""
        from polykit.compiler.builder.builder import build_plan

        if not Path(config.calibration_cache).is_file():  # the scales do not depend on tactics: none timed
            build_plan(self.candidate(tuple(range(len(self.order)))).model,
                       replace(candidate_config(config), builder_optimization_level=0))

    def reference(self, candidate: Candidate) -> list[dict[str, Any]]:
        names = [o.name for o in candidate.model.graph.output]
        return [{name: v[name] for name in names} for v in self.values or []]


def _tensor_names(model: Any) -> set[str]:
    """The tensors an onnx.ModelProto's graph reads or writes (inputs, node outputs)."""
    graph = model.graph
    return {i.name for i in graph.input} | {o for n in graph.node for o in n.output if o}


def _constant(values: list[dict[str, Any]], name: str) -> bool:
    """A non-float tensor (a shape, indices, a mask) equal in every iteration."""
    import numpy as np

    first = np.asarray(values[0][name])
    return first.dtype.kind in "biu" and all(np.array_equal(first, v[name]) for v in values[1:])


def candidate_config(config: BuilderConfig) -> BuilderConfig:
    """`config` for a build of a candidate: its inputs' shapes are its own, nothing marked, no
    tactics saved or forced (a replay names the whole model's layers)."""
    return replace(config, input_shapes={}, mark_outputs=(), mark_all=False, save_tactics=None,
                   save_timing_cache=None, tactic_replay=None)


class BuiltinCheck:
    """Build a candidate with polykit, run it on its feeds, compare with the cached values."""

    def __init__(self, subgraphs: Subgraphs, config: BuilderConfig, settings: AccuracySettings):
        from polykit.tools.compare.accuracy import make_compare_func

        self.subgraphs, self.settings = subgraphs, settings
        self.config = candidate_config(config)
        self.compare = make_compare_func(settings.compare, settings.compare_options)
        names = (name for v in subgraphs.values or [] for name in v)
        settings.compare_options.check_output_names(n for n in names if n in subgraphs.model_outputs)
        self.builds, self.full = 0, len(subgraphs.order)
        self.unchecked: set[tuple[int, ...]] = set()

    def __call__(self, nodes: tuple[int, ...]) -> Verdict:
        from polykit.backends.polykit_runner import PolykitRunner
        from polykit.compiler.builder.builder import build_plan
        from polykit.tools.compare.comparator import Comparator

        candidate = self.subgraphs.candidate(nodes)
        config = self.config
        if quantizes(config) and len(nodes) < self.full:  # the whole model's build (the first) calibrated
            config = reading_cache(config, _tensor_names(candidate.model))
        try:
            self.builds += 1
            plan = build_plan(candidate.model, config)
            outputs = Comparator.run([PolykitRunner(plan)], feeds=list(candidate.feeds)).outputs["trt"]
        except PolykitError as exc:
            if len(nodes) == self.full:
                raise
            self.unchecked.add(nodes)
            return Verdict(True, detail=f"not checked: polykit cannot build or run it: {exc.what}")
        return verdict(list(candidate.feeds), self.subgraphs.reference(candidate), outputs, self.compare,
                       self.settings.validate)


class CommandCheck:
    """`--check CMD`: each candidate written to `folder` ({model}) or to the iteration artifact
    (a CMD without {model}, or --iter-artifact given), its feeds to `folder` ({inputs})."""

    builds = 0  # the command builds what it runs

    def __init__(self, subgraphs: Subgraphs, options: ReduceOptions, folder: Path):
        self.subgraphs, self.folder, self.count = subgraphs, folder, 0
        self.argv, placeholder = command_argv(options.check, MODEL_PLACEHOLDER)
        self.rules, self.files = options.rules, options.files
        fixed = not placeholder or options.files.iter_artifact is not None
        self.artifact = options.files.claim(ITER_ARTIFACT) if fixed else None
        self.unchecked: set[tuple[int, ...]] = set()

    def __call__(self, nodes: tuple[int, ...]) -> Verdict:
        from polykit.compiler.graph.onnx_export import save_model
        from polykit.tools.data import results_io

        self.count += 1
        candidate = self.subgraphs.candidate(nodes)
        path = save_model(candidate.model, self.artifact or self.folder / f"candidate-{self.count}.onnx")
        replacements = {MODEL_PLACEHOLDER: str(path)}
        if candidate.feeds:
            replacements[INPUTS_PLACEHOLDER] = str(results_io.save_feeds(self.folder / f"candidate-{self.count}.npz",
                                                                         list(candidate.feeds)))
        try:
            return run_check(self.argv, replacements, CHECK_EXAMPLE, self.rules)
        finally:
            if self.artifact is not None:
                self.files.done(self.artifact)


class _Progress:
    """A check that reports each trial to the progress display and sorts the --artifacts files."""

    def __init__(self, check: Any, advance: Any, files: IterationFiles):
        self.check, self.advance, self.files, self.count = check, advance, files, 0

    def __call__(self, nodes: tuple[int, ...]) -> Verdict:
        verdict = self.check(nodes)
        self.files.sort(verdict.passed, self.count)
        self.count += 1
        self.advance(f"check {self.count}: {len(nodes)} node(s) {'pass' if verdict.passed else 'fail'}")
        return verdict

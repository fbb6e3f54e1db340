"""`polykit debug precision`: the ONNX nodes that must stay in fp32 for a reduced-precision build to pass.

    report = debug_precision("model.onnx", BuilderConfig(target="cpu", fp16=True))
    print(report.layer_precisions())       # e.g. "big_mm:fp32,scale:fp32", a --layer-precisions value

The low-precision build is the one `config` makes (it must ask for fp16 or bf16, int8 or fp8,
or one of each). Its feeds are the data loader's (or `load_inputs`); the reference outputs
come from onnxruntime on them, once (or from `load_outputs`). The candidates are the model's
nodes (by the names `--layer-precisions` matches): with fp16/bf16, those that compute a
float32 tensor and that the build may lower (not Constants, not nodes folded away, not nodes
that stay in fp32 anyway); with int8/fp8, the Conv / Gemm / MatMul the build quantizes
(insert_qdq's candidates; a node `--layer-precisions` names stays float), calibrated once for
every build (polykit.tools.debug.quantized; a model that carries its own Q/DQ is refused). They are ranked
(`rank`: RANKERS) by their measured error contribution, and polykit.tools.debug.precision_search
finds a small set of them to keep in fp32: each check builds the model in process with
`layer_precisions` = that set in fp32 and compares its outputs with the reference (compare
function and tolerances of `polykit run`). The error and the latency (median of a short
timing loop of polykit's engine, polykit.tools.bench.benchmark) are measured before (the
low-precision build) and after (with the set in fp32).
"""

from __future__ import annotations

import math
import os
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from polykit.compiler.builder.config import BuilderConfig
from polykit.errors import UsageError
from polykit.tools.compare.accuracy import AccuracySettings
from polykit.tools.debug.check import error_json, onnxrt_outputs, saved_reference, verdict
from polykit.tools.debug.precision_search import find_fp32_set, isolated_scores, layerwise_scores, rank
from polykit.tools.debug.quantized import (needs_data, quantized_kind, quantized_nodes, refuse_explicit,
                                           shared_calibration)
from polykit.tools.debug.tactic_bisect import Verdict


@dataclass(frozen=True)
class PrecisionOptions:
    """The built-in check (`accuracy` against onnxruntime with `providers` or `load_outputs`,
    on `load_inputs` or the data loader's feeds), the ranking (a RANKERS name) and the timed
    runs of each latency measurement (0: no timing)."""

    accuracy: AccuracySettings = field(default_factory=AccuracySettings)
    load_inputs: str | os.PathLike | None = None
    load_outputs: str | os.PathLike | None = None
    providers: tuple[str, ...] = ()
    rank: str = "layerwise"
    timing_iterations: int = 10


@dataclass(frozen=True)
class PrecisionReport:
    """The nodes to keep in fp32 (topological order) with their ops, every candidate's ranking
    score, the verdicts and latencies (ms, None when not timed) before and after, the checks
    made (ranking and search) and the plans built; every candidate's op (topological order) and
    every check of the search in order (the nodes it kept in fp32, in ranking order); the
    calibration cache an int8 / fp8 search's builds shared, where it outlives the search (the
    config's; None for a temporary one)."""

    precision: str
    nodes: tuple[str, ...]
    ops: tuple[str, ...]
    scores: Mapping[str, float]
    before: Verdict
    after: Verdict
    latency_before_ms: float | None
    latency_after_ms: float | None
    rank: str
    checks: int
    builds: int
    candidate_ops: Mapping[str, str] = field(default_factory=dict)
    steps: tuple[tuple[tuple[str, ...], Verdict], ...] = ()
    calibration_cache: str | None = None

    @property
    def flags(self) -> tuple[str, ...]:
        """The builder flags of the precision debugged ("fp16+fp8" -> --fp16, --fp8), and the
        calibration cache's."""
        flags = tuple(f"--{p}" for p in self.precision.split("+"))
        return flags + (("--calibration-cache", self.calibration_cache) if self.calibration_cache else ())

    def layer_precisions(self) -> str:
        """The result as a value of --layer-precisions ("" when no node needs fp32)."""
        return ",".join(f"{name}:fp32" for name in self.nodes)

    def save(self, path: str | os.PathLike) -> Path:
        """Write layer_precisions() and a newline to `path` (the file `debug precision -o` writes)."""
        from polykit.files import write_text

        return write_text(path, self.layer_precisions() + "\n", "--layer-precisions file")

    def to_json(self) -> dict[str, Any]:
        def number(value: float | None) -> Any:
            return value if value is None or math.isfinite(value) else str(value)

        return {
            "tool": "debug precision", "precision": self.precision, "layer_precisions": self.layer_precisions(),
            "nodes": [{"name": n, "op": op, "score": number(self.scores.get(n))} for n, op in zip(self.nodes, self.ops)],
            "before": {"passed": self.before.passed, "error": error_json(self.before), "detail": self.before.detail,
                       "latency_ms": self.latency_before_ms},
            "after": {"passed": self.after.passed, "error": error_json(self.after), "detail": self.after.detail,
                      "latency_ms": self.latency_after_ms},
            "calibration_cache": self.calibration_cache, "rank": self.rank, "candidates": len(self.scores),
            "checks": self.checks, "builds": self.builds,
            "scores": [{"name": n, "op": op, "score": number(self.scores.get(n))} for n, op in self.candidate_ops.items()],
            "steps": [{"fp32": list(fp32), "passed": v.passed, "error": error_json(v), "detail": v.detail}
                      for fp32, v in self.steps],
        }


def debug_precision(model: Any, config: BuilderConfig, options: PrecisionOptions = PrecisionOptions()
                    ) -> PrecisionReport:
    """Find the nodes of `model` (an ONNX path or ModelProto) to keep in fp32 (module docstring)."""
    from polykit.backends.loaders import GraphFromOnnx, model_type
    from polykit.compiler.builder.tuner import SHOW_BUILD_PROGRESS, progress_bar

    if model_type(model) == "plan":
        raise UsageError("debug precision builds the model again and again: it needs the ONNX model, not a plan",
                         where=str(model), hint="give the ONNX model the plan was built from")
    precision = low_precision(config)
    if options.rank not in RANKERS:
        raise UsageError(f"unknown ranking {options.rank!r}", hint=f"use one of: {', '.join(RANKERS)}")
    graph = GraphFromOnnx(model)()
    refuse_explicit(graph, config, "debug precision")
    candidates = precision_candidates(graph, config)
    with ExitStack() as stack:
        advance = stack.enter_context(progress_bar(None, "debug precision"))
        stack.callback(SHOW_BUILD_PROGRESS.reset, SHOW_BUILD_PROGRESS.set(False))
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="polykit-precision-")))
        trials = PrecisionTrials(model, graph, config, options, advance, folder)
        scores = RANKERS[options.rank](trials, candidates)
        ranked = rank(scores, candidates)
        search = find_fp32_set(ranked, trials)
        chosen = set(search.nodes)
        nodes = tuple(n for n in candidates if n in chosen)
        plans = (trials.low_plan, trials.plan(nodes) if nodes else trials.low_plan)
        before, after = (trials.latency(plan, options.timing_iterations) for plan in plans)
    ops = {n.name: n.op_type for n in graph.nodes}
    steps = tuple((tuple(n for n in ranked if n in fp32), v) for fp32, v in search.trials)
    return PrecisionReport(precision, nodes, tuple(ops[n] for n in nodes), scores, search.low,
                           search.verdict, before, after, options.rank, trials.checks, trials.builds,
                           {n: ops[n] for n in candidates}, steps,
                           None if config.calibration_cache is None or not quantized_kind(config)
                           else os.fspath(config.calibration_cache))


def low_precision(config: BuilderConfig) -> str:
    """The reduced precision `config` builds in: "fp16", "bf16", "int8", "fp8", or a half type and
    a quantized one ("fp16+fp8"); UsageError when it asks for none, or for fp16 and bf16."""
    half = "fp16" if config.fp16 else "bf16" if config.bf16 else None
    quantized = quantized_kind(config)
    if config.fp16 and config.bf16 or half is None and quantized is None:
        raise UsageError("debug precision needs one reduced precision to debug: --fp16 or --bf16, --int8 or --fp8 "
                         "(a half type and a quantized one together too)",
                         hint="e.g. polykit debug precision MODEL --fp16 --atol 1e-2 --rtol 1e-2")
    return "+".join(p for p in (half, quantized) if p)


def precision_candidates(graph: Any, config: BuilderConfig) -> list[str]:
    """The nodes the build lowers to its reduced precision, in graph order: fp32_candidates with
    fp16/bf16, and the nodes it quantizes with int8/fp8."""
    chosen = set(fp32_candidates(graph) if config.fp16 or config.bf16 else ())
    chosen.update(quantized_nodes(graph) if quantized_kind(config) else ())
    return [node.name for node in graph.nodes if node.name in chosen]


def fp32_candidates(graph: Any) -> list[str]:
    """Names of the nodes a reduced-precision build may lower that compute a float32 tensor."""
    import numpy as np

    from polykit.compiler.passes.precision import is_pinned

    out = []
    for node in graph.nodes:
        if node.op_type == "Constant" or is_pinned(node) or all(not t or t in graph.initializers for t in node.inputs):
            continue
        if any(o and graph.value(o).dtype == np.float32 for o in node.outputs):
            out.append(node.name)
    return out


class PrecisionTrials:
    """Builds with a set of nodes in fp32, run on fixed feeds, checked against the reference.

    The low-precision build runs first, on the data loader's feeds (or load_inputs), which
    every later build reuses; the reference comes from onnxruntime on them (or load_outputs).
    An int8 / fp8 build calibrates once, into the config's calibration cache or one in
    `folder` (polykit.tools.debug.quantized): with no calibration data given, the feeds come
    first (with onnxruntime's outputs on them) and calibrate it."""

    def __init__(self, model: Any, graph: Any, config: BuilderConfig, options: PrecisionOptions, advance: Any,
                 folder: Path):
        from polykit.backends.onnxrt import OnnxrtRunner, SessionFromOnnx
        from polykit.plugins import data_loader_specs
        from polykit.tools.data import results_io
        from polykit.tools.compare.accuracy import make_compare_func
        from polykit.tools.compare.comparator import Comparator
        from polykit.tools.data.loaders import make_data_loader

        settings = options.accuracy
        self.model, self.graph, self.providers, self.advance = model, graph, options.providers, advance
        self.config = replace(config, save_tactics=None, save_timing_cache=None, tactic_replay=None)
        self.compare, self.validate = make_compare_func(settings.compare, settings.compare_options), settings.validate
        self.builds = self.checks = 0
        feeds = results_io.load_feeds(options.load_inputs) if options.load_inputs else None
        loader = None if feeds else make_data_loader(settings.data_loader, settings.data_options, data_loader_specs())
        reference = None
        if feeds is None and needs_data(config):  # the feeds calibrate: they come first, with the reference
            results = Comparator.run([OnnxrtRunner(SessionFromOnnx(model, self.providers))], loader)
            feeds, loader, reference = results.feeds, None, results.outputs["onnxrt"]
        if quantized_kind(config):
            self.config = shared_calibration(self.config, folder, feeds)
        self.low_plan = self.plan(())
        self.feeds, self.low_outputs = self.run(self.low_plan, loader, feeds)
        if options.load_outputs is not None:
            reference = saved_reference(options.load_outputs, len(self.feeds))
        self.reference = reference if reference is not None else onnxrt_outputs(model, self.feeds, self.providers)
        settings.compare_options.check_output_names(name for outs in self.reference for name in outs)

    def plan(self, fp32: Any, **changes: Any) -> Any:
        from polykit.compiler.builder.builder import build_plan

        self.builds += 1
        asked = {**self.config.layer_precisions, **{name: "fp32" for name in fp32}}
        return build_plan(self.graph, replace(self.config, layer_precisions=asked, **changes))

    def run(self, plan: Any, loader: Any = None, feeds: Any = None) -> tuple[list[dict], list[dict]]:
        from polykit.backends.polykit_runner import PolykitRunner
        from polykit.tools.compare.comparator import Comparator

        if loader is None and feeds is None:
            feeds = self.feeds
        results = Comparator.run([PolykitRunner(plan)], loader, feeds=feeds)
        return results.feeds, results.outputs["trt"]

    def __call__(self, fp32: frozenset[str]) -> Verdict:
        self.checks += 1
        outputs = self.low_outputs if not fp32 else self.run(self.plan(fp32))[1]
        result = verdict(self.feeds, self.reference, outputs, self.compare, self.validate)
        self.advance(f"{len(fp32)} node(s) in fp32: {'pass' if result.passed else 'fail'}")
        return result

    def latency(self, plan: Any, iterations: int) -> float | None:
        """The median latency in ms of `iterations` timed runs of `plan` on the first feeds (None for 0)."""
        from polykit.backends.loaders import EngineFromPlan
        from polykit.tools.bench.benchmark import BenchOptions, benchmark

        if iterations <= 0:
            return None
        with EngineFromPlan(plan)() as engine:
            return benchmark(engine, BenchOptions(warm_up_ms=20, iterations=iterations, duration_s=0),
                             feeds=self.feeds[0]).latency.median


def layerwise_ranking(trials: PrecisionTrials, candidates: list[str]) -> dict[str, float]:
    """One low-precision build with every tensor marked, against onnxruntime's values of them.
    The marks are forced (BuilderConfig.mark_outputs), not observed: each node is scored on
    its own outputs, so no fusion may hide them."""
    from polykit.backends.loaders import MARK_ALL, ModifyOutputs

    g = trials.graph
    names = tuple(dict.fromkeys(o for n in g.nodes if not (n.op_type == "Constant" and n.domain == "")
                                for o in n.outputs if o and o not in g.outputs))
    plan = trials.plan((), mark_outputs=names)
    feeds = trials.feeds[:1]
    actual = {**feeds[0], **trials.run(plan, feeds=feeds)[1][0]}
    reference = {**feeds[0], **onnxrt_outputs(ModifyOutputs(trials.model, outputs=MARK_ALL), feeds, trials.providers)[0]}
    wanted = set(candidates)
    return layerwise_scores(((n.name, n.inputs, n.outputs) for n in trials.graph.nodes if n.name in wanted),
                            actual, reference)


def isolated_ranking(trials: PrecisionTrials, candidates: list[str]) -> dict[str, float]:
    """One build per candidate, with only that node in low precision."""
    return isolated_scores(candidates, trials)


#: --rank NAME -> how the candidates are scored (largest error contribution first)
RANKERS: dict[str, Callable[[PrecisionTrials, list[str]], dict[str, float]]] = {
    "layerwise": layerwise_ranking,
    "isolated": isolated_ranking,
}

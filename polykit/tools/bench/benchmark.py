"""Benchmark an engine (trtexec's role): latency percentiles, throughput, compute vs end-to-end.

    with EngineFromPath("model.plan")() as engine:
        result = benchmark(engine, BenchOptions(iterations=100, duration_s=0))
    print(result.latency.median, result.throughput)

Semantics (trtexec's):
- warm-up: untimed runs for at least `warm_up_ms` milliseconds (default 200; 0 = none, and
  the timed runs then include a cuda context's first, eager run and its CUDA-graph capture);
- timed runs: at least `iterations` runs AND at least `duration_s` seconds of wall clock;
- latency: host wall clock of each run (perf_counter). On cuda, a run with data transfers
  copies the inputs host -> device, enqueues the engine on device buffers, copies the
  outputs device -> host and synchronizes; without (`data_transfers=False`) it enqueues on
  device buffers that hold the inputs already and synchronizes. The device buffers are
  copied into and out of the context's arena around the layers, or, with `in_place`, bound
  with set_tensor_address so the layers read and write them directly;
- compute: the engine alone — on cuda, CUDA events around `ExecutionContext.enqueue`; on
  cpu, where there is no device and no copy, the same perf_counter time as the latency;
- throughput: timed runs / their total wall clock (inferences/s); samples/s multiplies it by
  the batch (the leading dim of the first input; 1 for a scalar input);
- percentiles: nearest rank (the smallest sample with at least p% of the samples <= it);
- profile (`profile_runs` > 0): a separate pass with a profiling context (per-layer times;
  CUDA events on cuda, where profiling runs the layers without a CUDA graph), so it does
  not disturb the timed runs.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

import numpy as np

from polykit.compiler.builder.config import BuilderConfig
from polykit.errors import UsageError
from polykit.runtime.weight_streaming import check_budget_request, requested_budget
from polykit.tools.report.profile import ProfileSummary, summarize


@dataclass(frozen=True)
class BenchOptions:
    """How to benchmark (see the module docstring for the semantics)."""

    warm_up_ms: float = 200.0
    iterations: int = 10
    duration_s: float = 3.0
    data_transfers: bool = True
    cuda_graph: bool = True
    profile_runs: int = 0
    seed: int = 1
    val_ranges: Mapping[str, tuple[float, float]] = field(default_factory=dict, hash=False)
    #: feed shapes (a plan built for optimization profiles runs at them; default its opt shapes)
    input_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict, hash=False)
    #: cuda: bind the device buffers in place (set_tensor_address) instead of copying them
    in_place: bool = False
    #: Polygraphy's weight streaming budget (-2 off, -1 automatic, bytes) or percent of the
    #: streamable weights kept resident (polykit.runtime.weight_streaming.requested_budget)
    weight_streaming_budget: int | None = None
    weight_streaming_percent: float | None = None

    def __post_init__(self) -> None:
        check_budget_request(self.weight_streaming_budget, self.weight_streaming_percent, "BenchOptions")
        for name, flag, low in (("warm_up_ms", "--warm-up", 0), ("iterations", "--iterations", 1),
                                ("duration_s", "--duration", 0), ("profile_runs", "--profile", 0)):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= low):
                raise UsageError(f"{flag} (BenchOptions.{name}) must be a finite number >= {low}, not {value!r}",
                                 hint="e.g. --warm-up 200 --iterations 10 --duration 3")


@dataclass(frozen=True)
class Stats:
    """Milliseconds over the timed runs."""

    min: float
    mean: float
    median: float
    p90: float
    p95: float
    p99: float
    max: float

    @staticmethod
    def of(samples: list[float]) -> "Stats":
        ordered = sorted(samples)

        def rank(p: float) -> float:
            return ordered[max(math.ceil(p / 100 * len(ordered)) - 1, 0)]

        return Stats(ordered[0], statistics.fmean(ordered), statistics.median(ordered), rank(90), rank(95), rank(99),
                     ordered[-1])


@dataclass(frozen=True)
class BenchResult:
    """What `benchmark` measured; `build_s`/`load_s` are filled in by `bench_model`."""

    target: str
    batch: int
    warm_up_runs: int
    iterations: int
    wall_s: float
    latency: Stats
    compute: Stats
    #: None where the target has no device copies / no CUDA graphs (cpu)
    data_transfers: bool | None
    cuda_graph: bool | None
    build_s: float | None = None
    load_s: float | None = None
    profile: ProfileSummary | None = field(default=None, compare=False)
    #: a plan built --weight-streaming: [budget, streamable] bytes it ran at (None otherwise)
    weight_streaming: tuple[int, int] | None = None
    #: cuda: what NVTX ranges the timed runs had (polykit.runtime.nvtx.describe); None on cpu
    nvtx: str | None = None

    @property
    def throughput(self) -> float:
        """Inferences per second over the timed runs."""
        return self.iterations / self.wall_s if self.wall_s > 0 else math.inf

    @property
    def samples_per_s(self) -> float:
        return self.throughput * self.batch

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target, "batch": self.batch, "warm_up_runs": self.warm_up_runs,
            "iterations": self.iterations, "wall_s": self.wall_s, "throughput": self.throughput,
            "samples_per_s": self.samples_per_s, "latency_ms": vars(self.latency), "compute_ms": vars(self.compute),
            "data_transfers": self.data_transfers, "cuda_graph": self.cuda_graph, "build_s": self.build_s,
            "load_s": self.load_s, "profile": self.profile.to_json() if self.profile else None,
            **({"weight_streaming": {"budget": self.weight_streaming[0], "streamable": self.weight_streaming[1]}}
               if self.weight_streaming else {}),
            **({"nvtx": self.nvtx} if self.nvtx is not None else {}),
        }


# ---- the timed loops, one per target ----------------------------------------------------------
class _CpuLoop:
    """`execute` on host arrays, timed with perf_counter (latency and compute are the same time)."""

    data_transfers: bool | None = None
    cuda_graph: bool | None = None
    nvtx: str | None = None

    def __init__(self, engine: Any, options: BenchOptions, feeds: Mapping[str, np.ndarray]):
        self.context = engine.create_execution_context(profile=False)
        self.feeds = feeds

    def run(self) -> tuple[float, float]:
        start = time.perf_counter()
        self.context.execute(self.feeds)
        ms = (time.perf_counter() - start) * 1e3
        return ms, ms

    def close(self) -> None:
        self.context.close()


class _CudaLoop:
    """`enqueue` on device buffers of our own, CUDA events around it, host copies when asked."""

    def __init__(self, engine: Any, options: BenchOptions, feeds: Mapping[str, np.ndarray]):
        from polykit.runtime.cuda.memory import DeviceBuffer, upload
        from polykit.runtime.cuda.stream import Event, Stream

        self.data_transfers, self.cuda_graph = options.data_transfers, options.cuda_graph
        self.engine, self.feeds = engine, feeds
        self.buffers: dict[str, Any] = {}
        self.stream = self.start = self.end = None
        try:
            self.context = engine.create_execution_context(profile=False, cuda_graph=options.cuda_graph)
            for name, array in feeds.items():
                self.context.set_input_shape(name, array.shape)
            for name in engine.io_tensors:
                self.buffers[name] = DeviceBuffer(engine.plan.tensors[name].nbytes, what=f"bench binding {name!r}")
            for name, array in feeds.items():
                upload(self.buffers[name].ptr, array)
            self.stream, self.start, self.end = Stream(), Event(), Event()
        except BaseException:
            self.close()
            raise
        self.bindings = {name: buf.ptr for name, buf in self.buffers.items()}
        from polykit.runtime.nvtx import describe

        # a replayed graph launches no layer from the host: only its capture recorded ranges
        self.nvtx = describe(self.context.nvtx_verbosity) + (", at the graph's capture only" if self.cuda_graph else "")
        self.in_place = options.in_place
        if self.in_place:
            for name, ptr in self.bindings.items():
                self.context.set_tensor_address(name, ptr)

    def run(self) -> tuple[float, float]:
        from polykit.runtime.cuda.memory import download, upload

        t0 = time.perf_counter()
        if self.data_transfers:
            for name, array in self.feeds.items():
                upload(self.bindings[name], array, self.stream.handle)
        self.start.record(self.stream)
        self.context.enqueue(None if self.in_place else self.bindings, self.stream)
        self.end.record(self.stream)
        if self.data_transfers:
            for name in self.engine.plan.outputs:
                desc = self.engine.plan.tensors[name]
                download(self.bindings[name], self.context.get_tensor_shape(name), desc.np_dtype, self.stream.handle)
        self.stream.synchronize()
        return (time.perf_counter() - t0) * 1e3, self.end.elapsed_ms(self.start)

    def close(self) -> None:
        for part in (self.start, self.end, getattr(self, "context", None), self.stream):
            if part is not None:
                part.close()
        for buf in self.buffers.values():
            buf.free()


#: target name -> the loop that times an engine on it
LOOPS: dict[str, type] = {"cpu": _CpuLoop, "cuda": _CudaLoop}


# ---- the API ------------------------------------------------------------------------------------
def random_feeds(engine: Any, seed: int = 1, val_ranges: Mapping[str, tuple[float, float]] | None = None,
                 input_shapes: Mapping[str, tuple[int, ...]] | None = None) -> dict[str, np.ndarray]:
    """One feed dict of the engine's input dtypes and shapes (`input_shapes` where given, else
    the engine's: a dynamic input's opt shape) from the default data loader."""
    from polykit.tools.data.loaders import DataLoader, DataLoaderOptions

    options = DataLoaderOptions(seed=seed, val_ranges=dict(val_ranges or {}), input_shapes=dict(input_shapes or {}))
    loader = DataLoader(options, engine.input_metadata)
    return next(iter(loader))


def benchmark(engine: Any, options: BenchOptions = BenchOptions(),
              feeds: Mapping[str, np.ndarray] | None = None) -> BenchResult:
    """Time `engine` (a polykit Engine) on `feeds` (checked against the engine's inputs; default:
    random data from options.seed)."""
    from polykit.runtime.engine import check_feeds

    loop_type = LOOPS.get(engine.target)
    if loop_type is None:
        raise UsageError(f"polykit bench cannot time the {engine.target!r} target", hint=f"targets: {', '.join(LOOPS)}")
    feeds = check_feeds(engine.plan, feeds) if feeds is not None else \
        random_feeds(engine, options.seed, options.val_ranges, options.input_shapes)
    loop = loop_type(engine, options, feeds)
    try:
        warm_up_runs = 0
        deadline = time.perf_counter() + options.warm_up_ms / 1e3
        while options.warm_up_ms > 0 and (warm_up_runs == 0 or time.perf_counter() < deadline):
            loop.run()
            warm_up_runs += 1
        latency, compute = [], []
        start = time.perf_counter()
        while len(latency) < options.iterations or time.perf_counter() - start < options.duration_s:
            wall_ms, compute_ms = loop.run()
            latency.append(wall_ms)
            compute.append(compute_ms)
        wall_s = time.perf_counter() - start
    finally:
        loop.close()
    first = feeds.get(engine.plan.inputs[0]) if engine.plan.inputs else None
    batch = int(first.shape[0]) if first is not None and first.ndim else 1
    profile = profile_engine(engine, feeds, options.profile_runs) if options.profile_runs else None
    return BenchResult(engine.target, batch, warm_up_runs, len(latency), wall_s, Stats.of(latency), Stats.of(compute),
                       loop.data_transfers, loop.cuda_graph, profile=profile, nvtx=loop.nvtx)


def profile_engine(engine: Any, feeds: Mapping[str, np.ndarray], runs: int) -> ProfileSummary:
    """Per-layer times of `runs` profiled runs (after one unrecorded run), summarized per layer and tactic."""
    with engine.create_execution_context(profile=True) as context:
        context.execute(feeds)
        profiles = []
        for _ in range(max(runs, 1)):
            context.execute(feeds)
            profiles.append(context.profile)
    return summarize(profiles, engine.plan.layers)


def bench_model(model: str | os.PathLike, config: BuilderConfig | None = None, options: BenchOptions = BenchOptions(),
                save_engine: str | os.PathLike | None = None,
                feeds: Mapping[str, np.ndarray] | None = None) -> BenchResult:
    """Build `model` with `config` (timed) — or load it when it is a plan file — and benchmark it
    (on `feeds` when given, e.g. loaded with --load-inputs)."""
    from polykit.backends.loaders import EngineFromPath, EngineFromPlan, PlanFromOnnx, SaveEngine, model_type

    build_s = None
    start = time.perf_counter()
    if model_type(model) == "plan":
        engine = EngineFromPath(model, config.target if config is not None else None,
                                config.device if config is not None else None)()
    else:
        plan = PlanFromOnnx(model, config)()
        build_s = time.perf_counter() - start
        if save_engine:
            SaveEngine(plan, save_engine)()
        start = time.perf_counter()
        engine = EngineFromPlan(plan, device=config.device if config is not None else None)()
    load_s = time.perf_counter() - start
    with engine:
        budget = requested_budget(engine, options.weight_streaming_budget, options.weight_streaming_percent)
        if budget is not None:
            engine.set_weight_streaming_budget(budget)
        streaming = (engine.get_weight_streaming_budget(), engine.streamable_weights_size) \
            if engine.streamable_weights_size else None
        return replace(benchmark(engine, options, feeds), build_s=build_s, load_s=load_s, weight_streaming=streaming)

"""The cuda target: CudaTarget -> CudaEngine (weights uploaded once, kernels compiled or
fetched from the kernel cache) -> CudaContext (one activation arena, a stream, a CUDA graph).

    engine = CudaTarget().load(plan)
    ctx = engine.create_context(cuda_graph=True, profile=False)
    outputs = ctx.execute({"x": x})            # host numpy in and out
    ctx.enqueue({"x": x_dev, "y": y_dev}, stream)  # device buffers, no synchronization

Static shapes: every layer's kernels and launch geometry are fixed at load, so the layer
sequence is captured once into a CUDA graph (after one eager warm-up run that also sizes
the workspace) and replayed; `cuda_graph=False` launches layer by layer. `profile=True`
times each layer with CUDA events into `last_profile`: the layers are enqueued behind a
kernel that holds the stream until they are all queued, so they run back to back and the
events measure GPU time, not the host's launch gaps (if enqueueing outlasts the hold, the
pass is repeated once with a hold sized from the measured enqueue time).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Mapping

import numpy as np

from polykit.errors import DeviceError, PlanError, RuntimeInputError
from polykit.kernels.cuda.base import CudaTactic, DeviceTensor, KernelSource, unpack_kernel_rows
from polykit.kernels.cuda.hold import HOLD
from polykit.kernels.tactics import find_tactic
from polykit.runtime.cuda import driver
from polykit.runtime.cuda.bindings import device_pointer, stream_handle
from polykit.runtime.cuda.launcher import CudaLauncher, KernelModules
from polykit.runtime.cuda.memory import Arena, DeviceBuffer, WorkspacePool, align_up, copy_device, download, upload
from polykit.runtime.cuda.stream import CudaGraph, Event, Stream

log = logging.getLogger("polykit")


class CudaTarget:
    """The target named "cuda"."""

    name = "cuda"

    def __init__(self, device: int = 0):
        self.device = device

    def available(self) -> bool:
        return driver.is_available()

    def gpu_arch(self) -> str:
        return driver.current_device(self.device).arch

    def load(self, plan: Any) -> "CudaEngine":
        return CudaEngine(plan, self.device)


def plan_kernels(plan: Any, layer: Any) -> list[KernelSource]:
    """The kernels the plan recorded for `layer` (PlanError when it recorded none)."""
    try:
        recorded = unpack_kernel_rows(plan.metadata.get("kernels", {}), layer.name)
    except (KeyError, TypeError, AttributeError) as exc:
        raise PlanError(f"the plan's kernel table is damaged ({exc!r})", where=f"layer {layer.name!r}",
                        hint="rebuild the plan for --target cuda with this polykit version") from None
    if recorded is None:
        raise PlanError(f"the plan records no kernels for layer {layer.name!r}", where=f"layer {layer.name!r}",
                        hint="rebuild the plan for --target cuda with this polykit version")
    return recorded


def _accepts(tactic: CudaTactic, layer: Any) -> bool:
    """The tactic's own predicate on a loaded layer (one that raises on it does not accept it)."""
    try:
        return bool(tactic.supports(layer))
    except Exception:  # a predicate fed a layer it was never meant for (a crafted plan)
        return False


class CudaEngine:
    """A plan on the GPU: tactics resolved, kernels loaded, weights in one device buffer."""

    def __init__(self, plan: Any, device: int = 0):
        self.plan = plan
        self.info = driver.current_device(device)
        if plan.gpu_arch and plan.gpu_arch != self.info.arch:
            log.warning("plan was built for %s, this GPU is %s: kernels are compiled for %s",
                        plan.gpu_arch, self.info.arch, self.info.arch)
        self.steps: list[tuple[Any, CudaTactic]] = []
        sources: list[KernelSource] = []
        for layer in plan.layers:
            tactic = find_tactic("cuda", layer.kind, layer.tactic)
            if not isinstance(tactic, CudaTactic):
                raise PlanError(f"layer uses tactic {layer.tactic!r}, which the cuda target does not have",
                                where=f"layer {layer.name!r}", hint="rebuild the plan with this polykit version")
            if not _accepts(tactic, layer):
                raise PlanError(f"tactic {layer.tactic!r} cannot run this {layer.kind} layer on this GPU "
                                f"({self.info.arch}): its dtypes, shapes or attributes are not the tactic's",
                                where=f"layer {layer.name!r}", hint="rebuild the plan on this machine")
            self.steps.append((layer, tactic))
            sources.extend(plan_kernels(plan, layer))
        self.modules = KernelModules(self.info.arch)
        self.weights: DeviceBuffer | None = None
        try:
            self.modules.load(sources)
            self._upload_weights()
        except BaseException:
            self.close()
            raise

    def _upload_weights(self) -> None:
        descs = {n: t for n, t in self.plan.tensors.items() if t.kind == "weight"}
        size = max((align_up(max(d.offset, 0) + d.nbytes) for d in descs.values()), default=0)
        self.weights = DeviceBuffer(size, what="engine weights")
        self.weight_tensors: dict[str, DeviceTensor] = {}
        for name, desc in descs.items():
            arr = np.ascontiguousarray(self.plan.weights[name], dtype=desc.np_dtype).reshape(desc.shape)
            ptr = self.weights.ptr + desc.offset
            upload(ptr, arr)
            self.weight_tensors[name] = DeviceTensor(ptr, tuple(desc.shape), desc.np_dtype)

    def create_context(self, **options: Any) -> "CudaContext":
        return CudaContext(self, cuda_graph=bool(options.get("cuda_graph", True)),
                           profile=bool(options.get("profile", False)))

    def close(self) -> None:
        if self.weights is not None:
            self.weights.free()
            self.weights = None
        self.modules.close()
        self.steps = []


class CudaContext:
    """One activation arena and stream; runs the engine's layers (eager, graph or profiled)."""

    def __init__(self, engine: CudaEngine, cuda_graph: bool = True, profile: bool = False):
        self.engine = engine
        self.use_graph = cuda_graph and not profile
        self.profile = profile
        #: (layer, milliseconds) of the last run when profiling
        self.last_profile: list[tuple[str, float]] = []
        plan = engine.plan
        driver.current_device(engine.info.ordinal)
        self.arena = Arena(plan.memory.arena_bytes)
        self.stream = Stream()
        self._workspace = WorkspacePool()
        self._graph: CudaGraph | None = None
        self._runs = 0
        self._hold_ns = 0  # profiler: stream hold for the next pass (0: not measured yet)
        self._hold_loaded = False
        self.tensors: dict[str, DeviceTensor] = dict(engine.weight_tensors)
        for name, desc in plan.tensors.items():
            if desc.kind == "weight":
                continue
            if desc.offset < 0:
                raise PlanError(f"tensor {name!r} has no arena offset", where=f"tensor {name!r}",
                                hint="the plan's memory plan is incomplete; rebuild it")
            self.tensors[name] = DeviceTensor(self.arena.at(desc.offset), tuple(desc.shape), desc.np_dtype)

    # ---- the layer sequence -------------------------------------------------------------
    def _record_layers(self, stream: Any) -> None:
        for layer, tactic in self.engine.steps:
            self._run_layer(layer, tactic, stream)

    def _run_layer(self, layer: Any, tactic: CudaTactic, stream: Any) -> None:
        self._workspace.reset()
        launcher = CudaLauncher(self.engine.modules, stream, self._workspace.take, layer.name,
                                sm_count=self.engine.info.sm_count)
        try:
            tactic.enqueue(layer, launcher, self.tensors)
        except DeviceError:
            raise
        except Exception as exc:
            raise DeviceError(f"tactic {tactic.name!r} failed to enqueue: {type(exc).__name__}: {exc}",
                              where=f"layer {layer.name!r} ({layer.kind})",
                              hint="rebuild with this layer's tactic excluded, or run it on --target cpu") from exc

    def _profiled(self, stream: Stream) -> None:
        # first guess: 50 us of host time per layer; afterwards what the last pass measured
        hold_ns = self._hold_ns or 50_000 * len(self.engine.steps) + 1_000_000
        for _ in range(2):
            enqueue_ns = self._profiled_pass(stream, hold_ns)
            self._hold_ns = int(enqueue_ns * 1.5) + 1_000_000
            if enqueue_ns < hold_ns:
                break
            hold_ns = self._hold_ns

    def _profiled_pass(self, stream: Stream, hold_ns: int) -> int:
        """One timed pass behind a `hold_ns` stream hold; returns the host's enqueue time in ns."""
        if not self._hold_loaded:
            self.engine.modules.load([HOLD])
            self._hold_loaded = True
        events = []
        CudaLauncher(self.engine.modules, stream.handle, self._workspace.take, "profiler hold").launch(
            HOLD, (1,), (1,), [hold_ns])
        t0 = time.perf_counter_ns()
        try:
            for layer, tactic in self.engine.steps:
                start, end = Event(), Event()
                events.append((layer.name, start, end))
                start.record(stream)
                self._run_layer(layer, tactic, stream.handle)
                end.record(stream)
            enqueue_ns = time.perf_counter_ns() - t0
            if events:
                events[-1][2].synchronize()
            self.last_profile = [(name, end.elapsed_ms(start)) for name, start, end in events]
        finally:
            for _, start, end in events:
                start.close()
                end.close()
        return enqueue_ns

    def _run(self, stream: Stream) -> None:
        """Enqueue the layers on `stream`: eager the first time, graph replay afterwards."""
        if self.profile:
            self._profiled(stream)
        elif self.use_graph and self._runs > 0:
            if self._graph is None:
                self._workspace.frozen = True
                try:
                    self._graph = CudaGraph(self.stream, lambda s: self._record_layers(s.handle))
                finally:
                    self._workspace.frozen = False
            self._graph.launch(stream)
        else:
            self._record_layers(stream.handle)
        self._runs += 1

    # ---- public API -------------------------------------------------------------------------
    def execute(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Host arrays in, host arrays out (synchronizes: the outputs are ready on return)."""
        driver.current_device(self.engine.info.ordinal)
        plan = self.engine.plan
        for name in plan.inputs:
            upload(self.tensors[name].ptr, np.ascontiguousarray(feeds[name]), self.stream.handle)
        self._run(self.stream)
        out = {}
        for name in plan.outputs:
            t = self.tensors[name]
            out[name] = download(t.ptr, t.shape, t.dtype, self.stream.handle)
        self.stream.synchronize()
        return out

    def enqueue(self, bindings: Mapping[str, Any], stream: Any = None) -> None:
        """Run on device buffers: inputs are copied into the arena and outputs out of it on
        `stream`, in order with the caller's other work; returns without synchronizing."""
        driver.current_device(self.engine.info.ordinal)
        plan = self.engine.plan
        missing = [n for n in list(plan.inputs) + list(plan.outputs) if n not in bindings]
        if missing:
            raise RuntimeInputError(f"enqueue needs a binding for every input and output; missing {missing}",
                                    hint="pass {name: device buffer} for each engine I/O tensor")
        user = Stream(stream_handle(stream))
        for name in plan.inputs:
            t = self.tensors[name]
            copy_device(t.ptr, device_pointer(bindings[name], name, t.shape), t.size * t.dtype.itemsize, user.handle)
        self._run(user)
        for name in plan.outputs:
            t = self.tensors[name]
            copy_device(device_pointer(bindings[name], name, t.shape), t.ptr, t.size * t.dtype.itemsize, user.handle)

    def close(self) -> None:
        if self.stream.handle is not None:
            self.stream.synchronize()
        if self._graph is not None:
            self._graph.close()
            self._graph = None
        self._workspace.free()
        self.arena.free()
        self.stream.close()

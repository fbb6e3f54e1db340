"""The cuda target: CudaTarget -> CudaEngine (weights uploaded once, kernels compiled or
fetched from the kernel cache) -> CudaContext (one activation arena, a stream, the
workspace the plan asks for) implementing polykit.runtime.target's protocol; the engine
(polykit.runtime.engine) runs the layer loop over it.

Static shapes: every layer's kernels and launch geometry are fixed at load, so the layer
sequence is captured once into a CUDA graph (`capture`, after one eager run) and replayed.
The context's timer (`CudaTimer`) records CUDA events around launches; a timed pass is
enqueued behind a kernel that holds the stream until every launch is queued, so the
launches run back to back and the events measure GPU time, not the host's launch gaps (if
enqueueing outlasts the hold, the engine repeats the pass once with a hold sized from the
measured enqueue time). Each context's scratch is its arena followed by the largest
workspace the plan records (`CudaEngine.memory_size` bytes), allocated up front or given by
the caller (`set_device_memory`); a layer that asks for more workspace (a plan built for a
GPU with other SM counts) grows the pool on the first, eager run. Every allocation goes
through the engine's allocator when it has one.

I/O tensors bound at caller addresses (`bind_addresses`) move there with their views, so the
layers read inputs and write outputs in the caller's memory; a captured graph holds the
addresses it was captured with, and the engine decides which sets of addresses get one
(polykit.runtime.io_binding).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

import numpy as np

from polykit.kernels.profile_tactics import profile_layers
from polykit.errors import DeviceError, PlanError, PolykitError, RankError
from polykit.kernels.cuda.base import CudaTactic, DeviceTensor
from polykit.kernels.cuda.hold import HOLD
from polykit.kernels.tactics import find_tactic
from polykit.runtime.cuda import driver
from polykit.runtime.cuda.bindings import device_pointer, event_handle, stream_handle
from polykit.runtime.cuda.bodies import BodyContexts, BodyDriver
from polykit.runtime.cuda.bound_shapes import BoundShapes
from polykit.runtime.cuda.count_words import CountWords
from polykit.runtime.cuda.launcher import CudaLauncher, KernelModules
from polykit.runtime.cuda.memory import (ALIGN, Arena, DeviceBuffer, Region, WorkspacePool, align_up, copy_device,
                                         download, upload)
from polykit.runtime.cuda.nccl import check_communicator
from polykit.runtime.cuda.layer_outputs import LayerOutputs
from polykit.runtime.cuda.sized import HeldReplay, SizedRegions, data_sized_groups
from polykit.runtime.cuda.staging import StagedValues, placed_root, value_layout
from polykit.runtime.compatibility import check_hardware
from polykit.runtime.cuda.stream import CudaGraph, Event, Stream
from polykit.runtime.cuda.weight_streaming import StreamedWeights
from polykit.runtime.weight_streaming import RECORD_KEY
#: a layer's kernels, regenerated from its tactics and checked against the plan's record (no source
#: text comes from a plan)
from polykit.runtime.tactic_check import plan_kernels
from polykit.runtime.io_binding import place_in_caller_memory, view_groups
from polykit.runtime.memory import check_scratch

log = logging.getLogger("polykit")


class CudaTarget:
    """The target named "cuda"."""

    name = "cuda"

    def __init__(self, device: int = 0):
        self.ordinal = device

    def available(self) -> bool:
        return driver.is_available()

    def device(self) -> driver.DeviceInfo:
        return driver.current_device(self.ordinal)

    def load(self, plan: Any, allocator: Any = None, pdl: bool = False) -> "CudaEngine":
        return CudaEngine(plan, self.ordinal, allocator, pdl)


def _accepts(tactic: CudaTactic, layer: Any) -> bool:
    """The tactic's own predicate on a loaded layer (one that raises on it does not accept it)."""
    try:
        return bool(tactic.supports(layer))
    except Exception:  # a predicate fed a layer it was never meant for (a crafted plan)
        return False


class CudaEngine:
    """A plan on the GPU: tactics resolved, kernels loaded, weights in one device buffer. `pdl`: the
    kernels launch as programmatic dependents where the GPU runs them (sm_90+; launcher.KernelModules)."""

    def __init__(self, plan: Any, device: int = 0, allocator: Any = None, pdl: bool = False):
        self.plan = plan
        self.allocator = allocator
        self.info = driver.current_device(device)
        check_hardware(plan, self.info.arch)  # kernels are compiled for this GPU's arch
        #: a context's scratch: its arena, then the largest workspace the plan records
        self.memory_size = align_up(plan.memory.arena_bytes) + align_up(planned_workspace(plan))
        count = len(plan.profiles.ranges) if plan.profiles is not None else 1
        #: each optimization profile's (layer, tactic) per layer (profile_tactics.profile_layers: its
        #: tactic, stamped at its opt); a context launches those of the profile its shapes are bound to
        self.profile_steps = [self._steps(profile_layers(plan, p)) for p in range(count)]
        self.steps = self.profile_steps[0]
        sources = [source for layer in plan.layers for source in plan_kernels(plan, layer)]  # every profile's
        self.modules = KernelModules(self.info.arch, pdl=pdl)
        if pdl and not self.modules.pdl:
            log.info("PDL asked for, but %s (%s) has no programmatic dependent launch: kernels launch plainly",
                     self.info.name, self.info.arch)
        self.weights: DeviceBuffer | None = None
        #: weight streaming (polykit.runtime.cuda.weight_streaming): where each weight lives at the budget
        self.streamed: StreamedWeights | None = None
        try:
            self.modules.load(sources)
            if RECORD_KEY not in plan.metadata:  # a --weight-streaming plan places them once the budget is known
                self._upload_weights()
        except BaseException:
            self.close()
            raise

    def _steps(self, layers: Any) -> list[tuple[Any, CudaTactic]]:
        steps = []
        for layer in layers:
            tactic = find_tactic("cuda", layer.kind, layer.tactic)
            if not isinstance(tactic, CudaTactic):
                raise PlanError(f"layer uses tactic {layer.tactic!r}, which the cuda target does not have",
                                where=f"layer {layer.name!r}", hint="rebuild the plan with this polykit version")
            if not tactic.runs_on(self.info.arch) or not _accepts(tactic, layer):
                raise PlanError(f"tactic {layer.tactic!r} cannot run this {layer.kind} layer on this GPU "
                                f"({self.info.arch}): its dtypes, shapes or attributes are not the tactic's",
                                where=f"layer {layer.name!r}", hint="rebuild the plan on this machine")
            steps.append((layer, tactic))
        return steps

    def _upload_weights(self) -> None:
        descs = {n: t for n, t in self.plan.tensors.items() if t.kind == "weight"}
        size = max((align_up(max(d.offset, 0) + d.nbytes) for d in descs.values()), default=0)
        self.weights = DeviceBuffer(size, what="engine weights", allocator=self.allocator)
        self.weight_tensors: dict[str, DeviceTensor] = {}
        for name, desc in descs.items():
            arr = np.ascontiguousarray(self.plan.weights[name], dtype=desc.np_dtype).reshape(desc.shape)
            ptr = self.weights.ptr + desc.offset
            upload(ptr, arr)
            self.weight_tensors[name] = DeviceTensor(ptr, tuple(desc.shape), desc.np_dtype)

    def update_weights(self, weights: dict[str, np.ndarray]) -> None:
        """Copy new weight values over the old ones in the engine's weight buffer, once the
        device's work in flight is done (contexts and captured graphs keep their pointers)."""
        driver.current_device(self.info.ordinal)
        driver.synchronize()
        if self.streamed is not None:
            self.streamed.update(weights)
            return
        for name, arr in weights.items():
            desc = self.plan.tensors[name]
            upload(self.weights.ptr + desc.offset, np.ascontiguousarray(arr, dtype=desc.np_dtype).reshape(desc.shape))

    def set_weight_streaming(self, schedule: Any) -> None:
        """Resident weights on the device, streamed ones in pinned host memory, at the schedule's
        budget (polykit.runtime.weight_streaming; no context is open)."""
        driver.current_device(self.info.ordinal)
        driver.synchronize()
        self._free_weights()
        self.streamed = StreamedWeights(self.plan, schedule, self.allocator)
        self.weight_tensors = self.streamed.tensors

    def free_memory(self) -> int:
        driver.current_device(self.info.ordinal)
        return driver.mem_info()[0]

    def _free_weights(self) -> None:
        if self.weights is not None:
            self.weights.free()
            self.weights = None
        if self.streamed is not None:
            self.streamed.free()
            self.streamed = None

    def create_context(self, *, communicator: Any = None, device_memory: str | None = "owned",
                       **options: Any) -> "CudaContext":
        """A context; `communicator` (an NcclCommunicator on this engine's device) is required
        by a plan with collective layers (a rank's plan) and lent to their tactic;
        `device_memory` None: no scratch until set_device_memory."""
        if self.weights is None and self.streamed is None:  # a --weight-streaming plan's first context
            self.set_weight_streaming(None)
        return CudaContext(self, check_communicator(self.plan, communicator, self.info.ordinal), device_memory)

    def close(self) -> None:
        self._free_weights()
        self.modules.close()
        self.steps = []
        self.profile_steps = []


class CudaContext:
    """One activation arena, stream and workspace; launches the engine's layers."""

    io_alignment = ALIGN  # as the arena's slots: tactics may assume it (vector loads, TMA)
    can_capture = True  # unless a layer is driven from the host (`capture` returns None then)

    def __init__(self, engine: CudaEngine, communicator: Any = None, device_memory: str | None = "owned"):
        self.engine = engine
        self.communicator = communicator
        plan = engine.plan
        driver.current_device(engine.info.ordinal)
        alloc = engine.allocator

        def buffer(what: str) -> Callable[[int], DeviceBuffer]:
            return lambda n: DeviceBuffer(n, what=what, allocator=alloc)

        self.arena: Arena | None = None
        self.stream = Stream()
        self._workspace = WorkspacePool(buffer("layer workspace"))
        self._timer = CudaTimer(engine.modules, self._workspace)
        self._bodies = BodyContexts(alloc, pdl=engine.modules.pdl)
        self.tensors: dict[str, DeviceTensor] = dict(engine.weight_tensors)
        #: tensors in the arena (placed at their offsets once the context has memory)
        self._in_arena = [name for name, desc in plan.tensors.items() if desc.kind != "weight"]
        for name in self._in_arena:
            desc = plan.tensors[name]
            if desc.offset < 0:
                raise PlanError(f"tensor {name!r} has no arena offset", where=f"tensor {name!r}",
                                hint="the plan's memory plan is incomplete; rebuild it")
            placed = plan.memory.placements.get(name)  # its producer writes rows into its Concat's output
            self.tensors[name] = DeviceTensor(0, tuple(desc.shape), desc.np_dtype, placed.stride if placed else 0)
        self._staged = StagedValues(*value_layout(plan.tensors, plan.memory.aliases), allocator=alloc)
        staged = set()
        for name, desc in plan.tensors.items():  # shape-tensor values and their views read the value region
            root = placed_root(name, plan.memory.aliases, self._staged.layout) if desc.kind != "weight" else None
            if root is not None:
                self.tensors[name] = DeviceTensor(self._staged.pointer(root), tuple(desc.shape), desc.np_dtype)
                staged.add(name)
        self._in_arena = [name for name in self._in_arena if name not in staged]
        self._counts = CountWords(plan, self.tensors, alloc)
        self._sized = SizedRegions(plan, buffer("run-time-sized tensors"))  # device memory per size set
        self._outputs = LayerOutputs(plan, buffer("outputs a layer sizes"))  # a Loop's scan outputs
        #: tensors computed from those outputs: device memory per set of their sizes, once decided
        self._data_sized = [SizedRegions(plan, buffer("run-time-sized tensors"), members=m)
                            for m in data_sized_groups(plan, self._outputs.axes)]
        #: tensors living outside the arena (staged values, run-time-sized): never bound in place
        self._elsewhere = staged | set(self._sized.members) | set(self._outputs.members) \
            | {n for regions in self._data_sized for n in regions.members}
        self._moved: dict[str, int] = {}  # tensors bound at caller addresses: their own pointer
        self._view_groups = view_groups(plan.memory.aliases)
        self._placed_key: tuple = ()  # the (name, address) pairs placed now, and the names copied instead
        self._placed_copies: frozenset[str] = frozenset()
        self._borrowed: tuple[Any, Stream] | None = None  # (the caller's last stream object, its Stream)
        self._bound = BoundShapes(self.tensors)  # the shape set the tensors carry (bound_shapes)
        self._steps = engine.steps
        self._streamer = engine.streamed.streamer() if engine.streamed is not None else None
        if device_memory == "owned":
            self._use(Arena(plan.memory.arena_bytes, planned_workspace(plan), allocator=alloc))
        elif device_memory is not None:
            raise PolykitError(f"device_memory must be 'owned' or None, not {device_memory!r}")

    # ---- memory (the caller's scratch, buffers bound in place) -----------------------------
    @property
    def has_memory(self) -> bool:
        return self.arena is not None

    def set_device_memory(self, ptr: int, nbytes: int) -> None:
        check_scratch(ptr, nbytes, self.engine.memory_size, ALIGN)
        plan = self.engine.plan
        self._use(Arena(plan.memory.arena_bytes, planned_workspace(plan), region=Region(ptr, nbytes)))

    def _use(self, arena: Arena) -> None:
        """Place the arena tensors (and the first workspace chunk) in `arena`'s memory."""
        if self.arena is not None:
            driver.call("cuCtxSynchronize", what="finish the work on the context's old memory")
            self.arena.free()
        self.arena = arena
        if arena.workspace_size:
            self._workspace.lend(arena.workspace())
        for name in self._in_arena:
            t = self.tensors[name]
            ptr = arena.at(self.engine.plan.tensors[name].offset)
            if name in self._moved:
                self._moved[name] = ptr
            else:
                self.tensors[name] = DeviceTensor(ptr, t.shape, t.dtype, t.row_stride)

    def io_pointer(self, binding: Any, name: str, shape: tuple[int, ...], dtype: np.dtype) -> int:
        return device_pointer(binding, name, shape, dtype)

    def bind_addresses(self, addresses: dict[str, int]) -> set[str]:
        """Move each bound tensor, with the views sharing its memory, to its address; an output
        that is a view of an input or of another bound tensor, or lives outside the arena, is
        left where it is and returned (the engine copies it). The addresses bound last time are
        bound still: nothing to do (a serving loop binds the same buffers run after run)."""
        key = tuple(addresses.items())
        if key == self._placed_key:
            return set(self._placed_copies)
        for name, ptr in self._moved.items():
            t = self.tensors[name]
            self.tensors[name] = DeviceTensor(ptr, t.shape, t.dtype)
        self._moved = {}
        placed, copies = place_in_caller_memory(self.engine.plan, addresses, self._elsewhere, self._view_groups)
        for name, group in placed.items():
            for member in group:
                t = self.tensors[member]
                self._moved[member] = t.ptr
                self.tensors[member] = DeviceTensor(addresses[name], t.shape, t.dtype)
        self._placed_key, self._placed_copies = key, frozenset(copies)
        return copies

    def signal(self, event: Any, stream: Stream) -> None:
        """Record the caller's event after the layers launched so far. Inside a graph capture a
        plain record would bind the event to the capture (a wait on it from another stream is then
        CUDA_ERROR_INVALID_VALUE); recorded EXTERNAL it becomes an event node each replay records."""
        d = driver.drv()
        capturing = driver.call("cuStreamIsCapturing", stream.handle, what="query stream capture")
        if int(capturing) == int(d.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE):
            driver.call("cuEventRecordWithFlags", event_handle(event), stream.handle,
                        d.CUevent_record_flags.CU_EVENT_RECORD_EXTERNAL, what="record the input-consumed event")
        else:
            driver.call("cuEventRecord", event_handle(event), stream.handle, what="record the input-consumed event")

    # ---- the protocol (polykit.runtime.target.TargetContext) ---------------------------------
    def begin(self) -> None:
        driver.current_device(self.engine.info.ordinal)

    def bind_shapes(self, shapes: Any) -> None:
        """Dynamic tensors take this run's shapes at their arena offsets (sized for the
        profiles' largest); kernels of tactics with dynamic_sizes read them at launch. The
        layers launch with the tactics of the shapes' profile (the key starts with its index)."""
        self._steps = self.engine.profile_steps[shapes.key[0]]
        self._bound.bind(shapes)  # nothing to do when the tensors already carry this shape set
        # run-time-sized tensors move to their size set's region (polykit.runtime.cuda.sized), outputs a
        # layer sized to the buffer it wrote (polykit.runtime.cuda.layer_outputs)
        placed = {n: p for regions in (self._sized, *self._data_sized) if regions
                  for n, p in regions.bind(shapes.dims).items()}
        placed.update(self._outputs.pointers())
        for name, ptr in placed.items():
            t = self.tensors[name]
            self.tensors[name] = DeviceTensor(ptr, t.shape, t.dtype)

    def data_sizes(self, outputs: Any, stream: Stream) -> dict[str, int]:
        """{symbol: size} of the data-dependent dims a layer just decided: its count word, read
        back (one synchronization of `stream`), or the sizes a host-driven layer gave its outputs."""
        mine = [o for o in outputs if self._outputs.sizes(o.tensor)]
        counted = [o for o in outputs if not self._outputs.sizes(o.tensor)]
        return {**self._outputs.read(mine), **(self._counts.read(counted, stream) if counted else {})}

    def copy_in(self, name: str, array: np.ndarray, stream: Stream) -> None:
        upload(self.tensors[name].ptr, np.ascontiguousarray(array), stream.handle)

    def copy_values(self, shapes: Any, stream: Stream) -> None:
        """One asynchronous copy into the value region (polykit.runtime.cuda.staging)."""
        if shapes.values:
            self._staged.copy(shapes.key, shapes.values, stream.handle)

    def copy_out(self, name: str, stream: Stream) -> np.ndarray:
        self._settle(stream)
        t = self.tensors[name]
        return download(t.ptr, t.shape, t.dtype, stream.handle)

    def launch(self, index: int, stream: Stream) -> bool:
        layer, tactic = self._steps[index]
        if self._streamer is not None:  # this layer's streamed weights copied in (weight_streaming)
            self._streamer.before(index, stream, self.tensors)
        idle = tactic.idle(layer, self.tensors)  # a view of its input's bytes: nothing to enqueue
        if not idle:
            self._enqueue(index, layer, tactic, stream)
        if self._streamer is not None:
            self._streamer.after(index, stream)
        return not idle

    def _enqueue(self, index: int, layer: Any, tactic: CudaTactic, stream: Stream) -> None:
        self._workspace.reset()
        launcher = CudaLauncher(self.engine.modules, stream.handle, self._workspace.take, layer.name,
                                sm_count=self.engine.info.sm_count)
        if tactic.host_driven:
            launcher.bodies = BodyDriver(self._bodies, stream.handle)
            launcher.outputs = self._outputs
        launcher.communicator = self.communicator
        self._counts.clear(index, stream)
        try:
            tactic.enqueue(layer, launcher, self.tensors)
        except PolykitError:  # a DeviceError, or a RuntimeInputError (CheckRange's value, a body's shape)
            raise
        except Exception as exc:
            raise DeviceError(f"tactic {tactic.name!r} failed to enqueue: {type(exc).__name__}: {exc}",
                              where=f"layer {layer.name!r} ({layer.kind})",
                              hint="rebuild with this layer's tactic excluded, or run it on --target cpu") from exc

    def synchronize(self, stream: Stream) -> None:
        self._settle(stream)
        stream.synchronize()

    def _settle(self, stream: Stream) -> None:
        """With a communicator, wait for `stream` with its deadline first (a peer that never
        arrives is a RankError, not a hang)."""
        if self.communicator is not None:
            self.communicator.wait(stream)

    def timer(self) -> "CudaTimer":
        return self._timer

    def capture(self, record: Callable[[Stream], None]) -> CudaGraph | HeldReplay | None:
        """`record`'s launches as a CUDA graph (the workspace may not grow while capturing), which
        holds the run-time-sized region it points into; None when a layer is driven from the host
        (control flow reads values back while it runs)."""
        if any(tactic.host_driven for _, tactic in self._steps):
            return None
        self._workspace.frozen = True
        try:
            graph = CudaGraph(self.stream, record)
        finally:
            self._workspace.frozen = False
        return HeldReplay(graph, self._sized.hold()) if self._sized else graph

    # ---- device buffers (ExecutionContext.enqueue) ------------------------------------------
    def borrow_stream(self, stream: Any) -> Stream:
        """The caller's stream as a borrowed Stream; the one of the last call again when the caller
        passes the same object (held here, so it cannot be another object at the same id)."""
        last = self._borrowed
        if last is not None and last[0] is stream and stream is not None:
            return last[1]
        borrowed = Stream(stream_handle(stream))
        self._borrowed = (stream, borrowed)
        return borrowed

    def copy_in_device(self, name: str, binding: Any, stream: Stream) -> None:
        t = self.tensors[name]
        copy_device(t.ptr, device_pointer(binding, name, t.shape), t.size * t.dtype.itemsize, stream.handle)

    def copy_out_device(self, name: str, binding: Any, stream: Stream) -> None:
        t = self.tensors[name]
        copy_device(device_pointer(binding, name, t.shape), t.ptr, t.size * t.dtype.itemsize, stream.handle)

    def close(self) -> None:
        if self.stream.handle is not None:
            try:
                self._settle(self.stream)
            except RankError:  # the communicator is aborted: its kernels end, the stream drains
                pass
            self.stream.synchronize()
        if self._streamer is not None:
            self._streamer.free()
        self._bodies.close()
        self._staged.free()
        self._sized.free()
        for regions in self._data_sized:
            regions.free()
        self._outputs.free()
        self._counts.free()
        self._workspace.free()
        if self.arena is not None:
            self.arena.free()
            self.arena = None
        self.stream.close()


def planned_workspace(plan: Any) -> int:
    """The largest per-layer workspace the plan records (0 for plans that record none)."""
    layers = (plan.metadata.get("workspace") or {}).get("layers") or {}
    return max((int(v) for v in layers.values()), default=0)


class CudaTimer:
    """CUDA events around launches, behind a stream hold sized from the last pass's host time."""

    def __init__(self, modules: KernelModules, workspace: WorkspacePool):
        self._modules = modules
        self._workspace = workspace
        self._hold_ns = 0  # 0: not measured yet
        self._planned_ns = 0
        self._t0 = 0
        self._last: Event | None = None
        self._loaded = False

    def begin(self, stream: Stream, launches: int) -> None:
        if not self._loaded:
            self._modules.load([HOLD])
            self._loaded = True
        # first guess: 50 us of host time per launch; afterwards what the last pass measured
        self._planned_ns = self._hold_ns or 50_000 * launches + 1_000_000
        CudaLauncher(self._modules, stream.handle, self._workspace.take, "timer hold").launch(
            HOLD, (1,), (1,), [self._planned_ns])
        self._t0 = time.perf_counter_ns()
        self._last = None

    def mark(self, stream: Stream) -> Event:
        event = Event()
        event.record(stream)
        self._last = event
        return event

    def end(self, stream: Stream) -> bool:
        enqueue_ns = time.perf_counter_ns() - self._t0
        if self._last is not None:
            self._last.synchronize()
        else:
            stream.synchronize()
        self._hold_ns = int(enqueue_ns * 1.5) + 1_000_000
        return enqueue_ns < self._planned_ns

    def elapsed_ms(self, start: Event, end: Event) -> float:
        return end.elapsed_ms(start)

    def release(self, marks: list[Event]) -> None:
        for event in marks:
            event.close()
        self._last = None

"""Runtime, Engine, ExecutionContext: load a plan and run it on its target.

    runtime = Runtime()                      # or Runtime("cpu") to insist on a target
    engine = runtime.load_engine("model.plan")
    with engine.create_execution_context() as ctx:
        outputs = ctx.execute({"x": x})

A plan built for optimization profiles takes any input shape inside the context's profile
(`set_optimization_profile`); `execute` takes the shapes from the feeds, `enqueue` from
`set_input_shape`, and every tensor's shape is evaluated on the host before the launches
(polykit.runtime.shapes). A context runs on memory it owns or on scratch the caller gives it
(`create_execution_context(device_memory=None)`, then `set_device_memory`), and reads and
writes I/O tensors bound with `set_tensor_address` in place (polykit.runtime.io_binding);
every allocation goes through the Runtime's or Engine's allocator when one is given. The engine checks feeds (names, shapes, exact dtypes) and talks to the target only through
polykit.runtime.target: get_target(name).load(plan) -> create_context() -> copy_in /
launch / copy_out. It owns the one layer loop (`run_layers`), its error wrapping, replay of
a captured loop (CUDA graphs) and the profiler (`timed_pass`, which the builder's tuner uses
too). An engine may have several contexts; each may run on its own thread at the same time.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from polykit.compiler.ops.control.bodies import BodyFn, register_body_runner
from polykit.compiler.plan.file import Plan
from polykit.compiler.plan.records import LayerDesc, TensorDesc
from polykit.kernels.profile_tactics import profile_layers
from polykit.errors import PlanError, PolykitError, RuntimeInputError, UsageError
from polykit.runtime.collectives import check_communicator, needs_communicator
from polykit.runtime.compatibility import check_versioned_tactics
from polykit.runtime.io_binding import IoAddresses, check_feeds, input_consumed_at, scratch_of
from polykit.runtime.nvtx import VERBOSITIES, Nvtx, check_verbosity, layer_labels, load_nvtx
from polykit.runtime.output_alloc import OutputSizes
from polykit.runtime.sequences import flatten_feeds, layouts, pack_outputs
from polykit.runtime.shapes import ShapeBinder, ShapeSet
from polykit.runtime.tactic_check import check_tactics
from polykit.runtime.target import Allocator, Target, TargetContext, get_target
from polykit.runtime.weight_streaming import WeightStreaming

#: captured replays (CUDA graphs) a context keeps, one per distinct set of input shapes
MAX_REPLAYS = 8
#: sets of caller addresses a context runs in place under captured replays (each its own replays)
MAX_IN_PLACE_SETS = 8


#: (layer index, callback(stream)): called right after that layer is launched (the input-consumed signal)
After = tuple[int, Callable[[Any], None]]
#: (NVTX library, each layer's range label): a range around each launch (polykit.runtime.nvtx)
Ranges = tuple[Nvtx, Sequence[bytes]]


def run_layers(ctx: TargetContext, layers: Sequence[LayerDesc], stream: Any,
               marks: Callable[[Any], Any] | None = None, out: list | None = None,
               indices: Sequence[int] | None = None, after: After | None = None,
               ranges: Ranges | None = None) -> None:
    """Launch `layers` (plan indices `indices`, default all in order) on `stream`; with
    `marks`, append (layer name, mark before, mark after) to `out` for each launch (the mark
    before twice where the target launched nothing: a view of its input's bytes takes no time);
    with `after` (index, callback), call callback(stream) once that layer is launched; with
    `ranges`, an NVTX range around each launch. A failure that is not a PolykitError is
    reported with the layer and its tactic."""
    for index in range(len(layers)) if indices is None else indices:
        layer = layers[index]
        before = marks(stream) if marks else None
        if ranges:
            ranges[0].push(ranges[1][index])
        try:
            launched = ctx.launch(index, stream)
        except PolykitError:
            raise
        except Exception as exc:
            raise PolykitError(f"tactic {layer.tactic!r} failed: {type(exc).__name__}: {exc}",
                               where=f"layer {layer.name!r} ({layer.kind})",
                               hint="the inputs may be out of the op's domain (check the feeds); else rebuild "
                                    "with another tactic for this layer or run it on --target cpu") from exc
        finally:
            if ranges:
                ranges[0].pop()
        if marks:
            out.append((layer.name, before, before if launched is False else marks(stream)))
        if after is not None and index == after[0]:
            after[1](stream)


def timed_pass(ctx: TargetContext, layers: Sequence[LayerDesc], stream: Any,
               indices: Sequence[int] | None = None, after: After | None = None,
               ranges: Ranges | None = None) -> list[tuple[str, float]]:
    """(layer name, milliseconds) of each launch of one pass over `indices` (default all
    layers), timed with the context's timer (0 for a layer the target launched nothing for);
    a pass whose timer says the host fell behind is repeated once (the timer has learned the
    enqueue time by then)."""
    timer = ctx.timer()
    count = len(layers) if indices is None else len(indices)
    times: list[tuple[str, float]] = []
    for _ in range(2):
        marked: list[tuple[str, Any, Any]] = []
        timer.begin(stream, count)
        try:
            run_layers(ctx, layers, stream, timer.mark, marked, indices, after, ranges)
        finally:
            valid = timer.end(stream)
            times = [(name, timer.elapsed_ms(a, b) if b is not a else 0.0) for name, a, b in marked]
            timer.release([m for _, a, b in marked for m in ((a,) if b is a else (a, b))])
        if valid:
            break
    return times


def plan_pdl(plan: Plan) -> bool:
    """The launch mode a plan's BuilderConfig.pdl asks for (False when it records none)."""
    value = (plan.metadata.get("builder_config") or {}).get("pdl", False)
    if not isinstance(value, bool):
        raise PlanError(f"the plan's pdl setting {value!r} is not true or false", where="plan metadata builder_config",
                        hint="rebuild the plan")
    return value


class Runtime:
    """Loads plans into Engines. `target` None: the plan's own target; else the plan must match.
    `allocator` (polykit.runtime.target.Allocator: alloc(size, alignment) -> address, free(address)):
    where the engines take every device allocation (host memory on the cpu target)."""

    def __init__(self, target: str | None = None, allocator: Allocator | None = None, device: int | None = None,
                 pdl: bool | None = None):
        """`device`: the GPU the engines load on (cuda; default 0); `pdl`: Engine's."""
        self.target = target
        self.allocator = allocator
        self.device = device
        self.pdl = pdl

    def _engine(self, plan: Plan, where: str = "plan") -> "Engine":
        target = get_target(plan.target, self.device) if self.device is not None else None
        return Engine(plan, target, where=where, allocator=self.allocator, pdl=self.pdl)

    def deserialize_engine(self, data: bytes | Plan) -> "Engine":
        plan = data if isinstance(data, Plan) else Plan.deserialize(data, expect_target=self.target)
        if self.target is not None and plan.target != self.target:
            raise PlanError(f"the plan was built for target {plan.target!r}, not {self.target!r}",
                            hint=f"rebuild the plan with --target {self.target}")
        return self._engine(plan)

    def load_engine(self, path: str | os.PathLike) -> "Engine":
        return self._engine(Plan.load(path, expect_target=self.target), where=str(path))


class Engine:
    """A plan loaded on its target: I/O metadata and a factory of execution contexts."""

    def __init__(self, plan: Plan, target: Target | None = None, *, where: str = "plan",
                 allocator: Allocator | None = None, pdl: bool | None = None):
        """`target`: the Target instance to load on (a CudaTarget(device=d) for a rank's GPU);
        default: a new one of the plan's target. `allocator`: where every device allocation
        of the engine and its contexts comes from (default: the target's own). The plan's tactics
        and kernel files are checked against this polykit's first (polykit.runtime.compatibility
        for a plan from another version, polykit.runtime.tactic_check: PlanError naming the
        field; `where` names the plan, e.g. its file). `pdl`: the cuda target launches the kernels as
        programmatic dependents on sm_90+ GPUs (polykit.kernels.cuda.pdl); None: as the plan's
        BuilderConfig.pdl says (off for plans built without it)."""
        if target is not None and target.name != plan.target:
            raise PlanError(f"the plan was built for target {plan.target!r}, not {target.name!r}",
                            hint=f"rebuild the plan with --target {target.name}")
        check_versioned_tactics(plan, where)
        check_tactics(plan, where)
        self.plan = plan
        self.sequence_io = layouts(plan)  # sequence/optional I/O flattened at build time
        #: the layers each optimization profile runs (their tactics may differ: profile_tactics)
        self.profile_layers = [profile_layers(plan, p) for p in range(self.num_optimization_profiles)]
        #: the last layer reading an input: the input-consumed event is signalled after it
        self.input_consumed_layer = input_consumed_at(plan)
        self._streaming = WeightStreaming(plan, where)
        self._streaming_applied = False
        self._contexts: weakref.WeakSet[ExecutionContext] = weakref.WeakSet()
        #: whether the kernels launch as programmatic dependents (where the target and device can)
        self.pdl = plan_pdl(plan) if pdl is None else bool(pdl)
        self._target_engine = (target or get_target(plan.target)).load(plan, allocator, pdl=self.pdl)
        self._closed = False
        self._lock = threading.Lock()

    # ---- metadata ---------------------------------------------------------------------
    @property
    def target(self) -> str:
        return self.plan.target

    @property
    def io_tensors(self) -> list[str]:
        """Input names then output names, in plan order (a name both input and output once)."""
        return list(dict.fromkeys(list(self.plan.inputs) + list(self.plan.outputs)))

    @property
    def input_metadata(self) -> dict[str, TensorDesc]:
        return {name: self.plan.tensors[name] for name in self.plan.inputs}

    @property
    def output_metadata(self) -> dict[str, TensorDesc]:
        return {name: self.plan.tensors[name] for name in self.plan.outputs}

    @property
    def num_layers(self) -> int:
        return len(self.plan.layers)

    def _desc(self, name: str) -> TensorDesc:
        if name not in self.plan.inputs and name not in self.plan.outputs:
            raise UsageError(f"the engine has no input or output {name!r}",
                             hint=f"I/O tensors are: {', '.join(self.io_tensors)}")
        return self.plan.tensors[name]

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        """The tensor's shape (at the first profile's opt where it is dynamic)."""
        return tuple(self._desc(name).shape)

    def get_tensor_dims(self, name: str) -> tuple[str, ...]:
        """Each dim of an I/O tensor as text: a number, or its expression of the input dims."""
        desc = self._desc(name)
        return tuple(str(d) for d in desc.dims) if desc.dims else tuple(str(d) for d in desc.shape)

    @property
    def profiling_verbosity(self) -> str:
        """How much the plan lets NVTX ranges say (polykit.runtime.nvtx): none, layer_names_only, detailed."""
        config = self.plan.metadata.get("builder_config") or {}
        value = config.get("profiling_verbosity", "layer_names_only")
        if value not in VERBOSITIES:
            raise PlanError(f"the plan's profiling verbosity {value!r} is not one of {', '.join(VERBOSITIES)}",
                            where="plan metadata builder_config", hint="rebuild the plan")
        return str(value)

    @property
    def num_optimization_profiles(self) -> int:
        return len(self.plan.profiles.ranges) if self.plan.profiles is not None else 1

    def get_profile_shape(self, profile: int, name: str) -> tuple[tuple[int, ...], ...]:
        """(min, opt, max) shapes of input `name` in optimization profile `profile`."""
        ShapeBinder(self.plan).check_profile(profile)
        if self.get_tensor_mode(name) != "input":
            raise UsageError(f"{name!r} is an output; profiles give shapes of inputs",
                             hint=f"inputs are: {', '.join(self.plan.inputs)}")
        shape = self.plan.tensors[name].shape
        if self.plan.profiles is None:
            return (tuple(shape),) * 3
        return self.plan.profiles.input_shapes(profile, name, shape)

    def get_tensor_dtype(self, name: str) -> np.dtype:
        return self._desc(name).np_dtype

    def get_tensor_mode(self, name: str) -> str:
        """"input" or "output" (a graph input that is also an output reads as "input")."""
        self._desc(name)
        return "input" if name in self.plan.inputs else "output"

    # ---- weights ----------------------------------------------------------------------
    def refit_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        """Replace weights of the plan in place, between inferences (a Refitter derives them from
        new initializers: polykit.compiler.builder.refit). Each must be a weight of the plan with
        its dtype and shape (UsageError naming it otherwise, and nothing changes); the target's
        copies take the new values (device memory on cuda, after the device's work in flight),
        so every context of the engine computes with them from its next run."""
        new: dict[str, np.ndarray] = {}
        for name, array in weights.items():
            desc = self.plan.tensors.get(name)
            if desc is None or desc.kind != "weight":
                raise UsageError(f"the plan has no weight {name!r}", where="refit",
                                 hint="refit the weights the plan's tensors list as kind 'weight'")
            arr = np.asarray(array)
            if arr.dtype != desc.np_dtype or tuple(arr.shape) != tuple(desc.shape):
                raise UsageError(f"weight {name!r} is {arr.dtype.name}{list(arr.shape)}, the plan holds "
                                 f"{desc.dtype}{list(desc.shape)}", where="refit",
                                 hint="give the weight the plan's dtype and shape")
            new[name] = np.ascontiguousarray(arr)
        with self._lock:
            if self._closed:
                raise UsageError("the engine is closed", hint="load the plan again")
            self._target_engine.update_weights(new)
            self.plan.weights.update(new)

    # ---- weight streaming (polykit.runtime.weight_streaming, docs/WEIGHT_STREAMING.md) --------
    @property
    def streamable_weights_size(self) -> int:
        """Bytes of weights that may stream (0 for a plan built without --weight-streaming)."""
        return self._streaming.streamable_bytes

    def set_weight_streaming_budget(self, nbytes: int) -> None:
        """Keep at most `nbytes` of the streamable weights resident; the rest are copied in ahead of
        the layers that read them. 0 streams them all, >= streamable_weights_size keeps them all
        (the default). Set it before creating contexts (TensorRT's rule): UsageError while a
        context of the engine is open, for a negative budget, or for one below the weights of a
        plan built without --weight-streaming."""
        with self._lock:
            if self._closed:
                raise UsageError("the engine is closed", hint="load the plan again")
            if any(not c._closed for c in self._contexts):
                raise UsageError("the weight streaming budget is set before creating execution contexts",
                                 where="set_weight_streaming_budget", hint="close the engine's contexts first")
            self._streaming.set_budget(nbytes)
            self._apply_streaming()

    def get_weight_streaming_budget(self) -> int:
        return self._streaming.budget

    @property
    def weight_streaming_budget_v2(self) -> int:
        """TensorRT's name of the budget (get_/set_weight_streaming_budget)."""
        return self._streaming.budget

    @weight_streaming_budget_v2.setter
    def weight_streaming_budget_v2(self, nbytes: int) -> None:
        self.set_weight_streaming_budget(nbytes)

    @property
    def weight_streaming_scratch_memory_size(self) -> int:
        """Bytes of scratch each context allocates for streamed weights at the current budget."""
        return self._streaming.scratch_bytes()

    @property
    def weight_streaming_automatic_budget(self) -> int:
        """A budget that leaves room for one context: the free device memory the target reports
        less the context's arena, workspace and scratch at budget 0, at most the streamable size
        (all of it on a target without device memory)."""
        return self._streaming.automatic_budget(self._target_engine.free_memory(), self.plan)

    def _apply_streaming(self) -> None:
        """Give the target the schedule at the current budget (its weights move where they live)."""
        if self._streaming.enabled:
            self._target_engine.set_weight_streaming(self._streaming.schedule())
        self._streaming_applied = True

    # ---- memory -----------------------------------------------------------------------
    @property
    def device_memory_size(self) -> int:
        """Bytes of scratch a context created with device_memory=None must be given
        (set_device_memory): its activation arena and layer workspace."""
        return int(self._target_engine.memory_size)

    def get_device_memory_size_for_profile(self, profile: int) -> int:
        """The scratch a context serving optimization profile `profile` needs. The memory plan
        places every tensor once, at its largest size over all profiles, so each profile
        needs the whole arena: the same as device_memory_size."""
        ShapeBinder(self.plan).check_profile(profile)
        return self.device_memory_size

    # ---- contexts ---------------------------------------------------------------------
    def create_execution_context(self, *, profile: bool | None = None, cuda_graph: bool = True,
                                 communicator: Any = None, device_memory: str | None = "owned",
                                 **options: Any) -> "ExecutionContext":
        """A context. `device_memory`: "owned" (its own working memory) or None (none until
        `set_device_memory` gives it scratch of device_memory_size bytes, which several
        contexts that never run at the same time may share). `profile`: time every layer of each run
        (default: the plan's BuilderConfig.profile); `cuda_graph`: replay the layer loop as a
        captured graph after the first run where the target can; `communicator`: this rank's
        end of its group (polykit.runtime.collectives), which a plan with collective layers over
        several ranks needs. Other options go to the target."""
        with self._lock:
            if self._closed:
                raise UsageError("the engine is closed", hint="load the plan again")
            if profile is None:
                profile = bool(self.plan.metadata.get("builder_config", {}).get("profile", False))
            if communicator is not None or needs_communicator(self.plan):
                check_communicator(self.plan, communicator)
                options["communicator"] = communicator
            if device_memory not in ("owned", None):
                raise UsageError(f"device_memory must be 'owned' or None, not {device_memory!r}",
                                 hint="None creates a context without memory: give it some with set_device_memory")
            if not self._streaming_applied:
                self._apply_streaming()
            context = ExecutionContext(self, self._target_engine.create_context(device_memory=device_memory,
                                                                                **options),
                                       profile=profile, replay=cuda_graph and not profile)
            self._contexts.add(context)
            return context

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._target_engine.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Engine(target={self.target!r}, {self.num_layers} layers, io={self.io_tensors})"


class ExecutionContext:
    """Runs the engine: execute(feeds) -> outputs on host arrays, enqueue(bindings, stream) on
    device buffers (copied in and out), or enqueue(stream=...) on buffers bound in place with
    set_tensor_address. One call at a time per context."""

    def __init__(self, engine: Engine, target_context: TargetContext, *, profile: bool = False, replay: bool = True):
        self.engine = engine
        self._ctx = target_context
        self._closed = False
        self._profile = profile
        self._replays: OrderedDict[tuple, Any] = OrderedDict()
        self._runs: dict[tuple, int] = {}
        self._binder = ShapeBinder(engine.plan)
        self._sizes = OutputSizes(engine.plan)
        # launches that follow a read-back are not captured
        self._replay_wanted = replay and not self._sizes and target_context.can_capture
        self._profile_index = 0
        self._input_shapes = {n: tuple(engine.plan.tensors[n].shape) for n in engine.plan.inputs}
        self._input_values: dict[str, np.ndarray] = {}
        self._shapes: ShapeSet | None = None
        self._ran: Mapping[str, tuple[int, ...]] = {}  # the shapes of the last run with data-dependent sizes
        self._last_profile: list[tuple[str, float]] = []
        self._addresses = IoAddresses(engine.plan)
        self._consumed_event: Any = None
        self._io_key: tuple = ((), 0)  # the bound addresses and the event a captured replay holds
        self._in_place_sets: set[tuple] = set()  # (shapes, addresses) run in place (captured: replay_in_place)
        self._nvtx_verbosity = engine.profiling_verbosity
        self._labels: dict[tuple[int, str], Any] = {}

    @property
    def profile(self) -> list[tuple[str, float]]:
        """(layer, milliseconds) of the last run, when created with profile=True."""
        return list(self._last_profile)

    # ---- memory and bindings ----------------------------------------------------------
    def set_device_memory(self, memory: Any, size: int | None = None) -> None:
        """Run on the caller's scratch from now on: an int address and its `size` in bytes, or a
        buffer object (its address and size read from its array interface). It must hold
        engine.device_memory_size bytes, aligned to 256, and stay valid while the context runs;
        contexts sharing it must not run at the same time."""
        self._check_open()
        ptr, size = scratch_of(memory, size)
        self._ctx.begin()
        self._drop_replays()  # they point into the old memory
        self._runs.clear()
        self._in_place_sets.clear()
        self._ctx.set_device_memory(ptr, size)

    def set_tensor_address(self, name: str, binding: Any) -> None:
        """Bind I/O tensor `name` to the caller's buffer (an address, or an object with
        __cuda_array_interface__ / DLPack on cuda, __array_interface__ on cpu): the following
        enqueues read that input or write that output in place, with no copy. None unbinds it.
        The buffer is checked (size, dtype, alignment) against the run's shape at the first enqueue
        of each shape, when an object's address is read: bind it again if it gets new memory."""
        self._addresses.set(name, binding)

    def get_tensor_address(self, name: str) -> Any:
        """What `name` is bound to (None: unbound)."""
        self.engine._desc(name)
        return self._addresses.get(name)

    def set_input_consumed_event(self, event: Any) -> None:
        """Signal `event` in each enqueue as soon as the last layer reading an input has run, after
        which the caller may refill its input buffers: on cuda a CUDA event recorded on the
        stream (a CUevent, handle or object with .handle), on cpu an object whose set() is called
        (a threading.Event). None: no signal."""
        self._consumed_event = event

    def get_input_consumed_event(self) -> Any:
        return self._consumed_event

    @property
    def nvtx_verbosity(self) -> str:
        """What the NVTX range around each layer launch says (polykit.runtime.nvtx): at most the
        plan's profiling verbosity; "none" emits no ranges."""
        return self._nvtx_verbosity

    @nvtx_verbosity.setter
    def nvtx_verbosity(self, value: str) -> None:
        check_verbosity(value, "NVTX verbosity")
        most = self.engine.profiling_verbosity
        if VERBOSITIES.index(value) > VERBOSITIES.index(most):
            raise UsageError(f"NVTX verbosity {value!r} says more than the plan's profiling verbosity {most!r}",
                             hint=f"rebuild with --profiling-verbosity {value}")
        self._nvtx_verbosity = value

    def _ranges(self) -> Any:
        """(NVTX library, labels of the profile's layers), or None (verbosity none, no library)."""
        if self._nvtx_verbosity == "none":
            return None
        nvtx = load_nvtx()
        if nvtx is None:
            return None
        key = (self._profile_index, self._nvtx_verbosity)
        if key not in self._labels:
            self._labels[key] = layer_labels(self.engine.profile_layers[self._profile_index], self._nvtx_verbosity)
        return nvtx, self._labels[key]

    def _drop_replays(self) -> None:
        if self._replays:
            self._ctx.synchronize(self._ctx.stream)
            for replay in self._replays.values():
                replay.close()
            self._replays.clear()

    def _check_memory(self) -> None:
        if not self._ctx.has_memory:
            raise RuntimeInputError("the execution context was created without device memory and has none",
                                    hint=f"call set_device_memory with {self.engine.device_memory_size} bytes first")

    def _replay_in_place(self, addresses: tuple[tuple[str, int], ...]) -> bool:
        """Whether this run reads and writes `addresses` in place. Without captured replays,
        always. With them, a set of addresses runs in place from its second run on (captured
        then, replayed after), for at most MAX_IN_PLACE_SETS sets per context; a set's first run, and
        every run of a set past that cap, copies through the arena's own replay. So addresses
        that change on every run (a fresh output tensor per request) cost what copies cost,
        never an eager run or a capture each time, and a few stable buffers run in place."""
        if not self._replay_wanted:
            return True
        key = (self._shapes.key if self._shapes is not None else ()) + (addresses,)
        if key in self._in_place_sets:
            return True
        if len(self._in_place_sets) < MAX_IN_PLACE_SETS:
            self._in_place_sets.add(key)
        return False

    def _signal_after(self) -> Any:
        """(layer index, callback) signalling the input-consumed event after that layer; None
        without an event, or when it is signalled before the launches (no layer reads an input)
        or after the outputs' copies (an input is an output: `_signal_at_end`)."""
        event, index = self._consumed_event, self.engine.input_consumed_layer
        if event is None or not 0 <= index < self.engine.num_layers:
            return None
        return index, lambda stream: self._ctx.signal(event, stream)

    def _signal_at_end(self, stream: Any) -> None:
        if self._consumed_event is not None and self.engine.input_consumed_layer >= self.engine.num_layers:
            self._ctx.signal(self._consumed_event, stream)

    # ---- shapes -----------------------------------------------------------------------
    @property
    def optimization_profile(self) -> int:
        return self._profile_index

    def set_optimization_profile(self, index: int) -> None:
        """Serve the shapes of optimization profile `index` (one profile per context)."""
        self._profile_index = self._binder.check_profile(index)

    def set_input_shape(self, name: str, shape: Sequence[int]) -> None:
        """The shape input `name` has in the next enqueue (execute takes it from the feeds);
        checked against the context's profile when the shapes are bound."""
        if name not in self.engine.plan.inputs:
            raise UsageError(f"{name!r} is not an input of the engine", hint=f"inputs are: "
                                                                            f"{', '.join(self.engine.plan.inputs)}")
        try:
            self._input_shapes[name] = tuple(int(d) for d in shape)
        except (TypeError, ValueError):
            raise UsageError(f"the shape of input {name!r} must be a sequence of ints, not {shape!r}") from None

    def set_input_values(self, name: str, values: Any) -> None:
        """The host values shape-tensor input `name` has in the next enqueue (execute takes
        them from the feeds): they set shapes, so the host needs them before the launches."""
        if name not in self._binder.value_inputs:
            raise UsageError(f"{name!r} is not a shape-tensor input of the engine",
                             hint=f"shape-tensor inputs are: {', '.join(self._binder.value_inputs) or 'none'}")
        self._input_values[name] = np.array(values)

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        """The shape tensor `name` has in this context's current shapes."""
        desc = self.engine._desc(name)
        shapes = self._bind().shapes
        return tuple(shapes.get(name, self._ran.get(name, desc.shape)))  # a data-dependent size: the last run's

    def _bind(self) -> ShapeSet:
        self._shapes = self._binder.bind(self._input_shapes, self._profile_index, self._input_values)
        if self.engine.plan.profiles is not None:
            self._ctx.bind_shapes(self._shapes)
        return self._shapes

    def _run(self, stream: Any) -> None:
        """The layers on `stream`: timed when profiling; else eager the first time for a set
        of shapes and then a replay captured for that set (a bounded cache) where the target
        offers one."""
        layers = self.engine.profile_layers[self._profile_index]
        key = (self._shapes.key if self._shapes is not None else ()) + self._io_key
        runs = self._runs.get(key, 0)
        after, ranges = self._signal_after(), self._ranges()
        if self._consumed_event is not None and self.engine.input_consumed_layer < 0:
            self._ctx.signal(self._consumed_event, stream)  # no layer reads an input
        if self._sizes:
            self._run_segments(stream, after, ranges)
        elif self._profile:
            self._last_profile = timed_pass(self._ctx, layers, stream, after=after, ranges=ranges)
        elif self._replay_wanted and runs > 0:
            replay = self._replays.get(key)
            if replay is None:
                replay = self._ctx.capture(lambda s: run_layers(self._ctx, layers, s, after=after, ranges=ranges))
                self._replay_wanted = replay is not None
                if replay is not None:
                    self._keep_replay(key, replay)
            else:
                self._replays.move_to_end(key)
            if len(self._runs) > 4 * MAX_REPLAYS:  # many address sets seen: forget the counts of old ones
                self._runs = {k: n for k, n in self._runs.items() if k in self._replays}
            if replay is not None:
                replay.launch(stream)
            else:
                run_layers(self._ctx, layers, stream, after=after, ranges=ranges)
        else:
            run_layers(self._ctx, layers, stream, after=after, ranges=ranges)
        self._runs[key] = runs + 1

    def _run_segments(self, stream: Any, after: Any, ranges: Any) -> None:
        """The layers of a plan with data-dependent sizes: bound after each layer that decides one."""
        layers, times = self.engine.profile_layers[self._profile_index], []

        def segment(indices: Sequence[int]) -> None:
            if self._profile:
                times.extend(timed_pass(self._ctx, layers, stream, indices, after, ranges))
            else:
                run_layers(self._ctx, layers, stream, indices=indices, after=after, ranges=ranges)

        self._shapes = self._sizes.run(self._ctx, self._binder, self._shapes, stream, segment)
        self._ran = self._shapes.shapes
        if self._profile:
            self._last_profile = times

    def _keep_replay(self, key: tuple, replay: Any) -> None:
        """Cache `replay`; the least recently used one of its kind goes past the bound: MAX_REPLAYS
        on the context's own memory, MAX_IN_PLACE_SETS on caller addresses (key[-2], the
        addresses, non-empty), so neither kind pushes the other out."""
        self._replays[key] = replay
        same = [k for k in self._replays if bool(k[-2]) == bool(key[-2])]  # oldest first
        if len(same) > (MAX_IN_PLACE_SETS if key[-2] else MAX_REPLAYS):
            old = self._replays.pop(same[0])
            self._ctx.synchronize(self._ctx.stream)
            old.close()

    def _check_open(self) -> None:
        if self._closed:
            raise UsageError("the execution context is closed", hint="create a new one from the engine")

    def execute(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        """Host arrays in, host arrays out (the outputs are ready on return); a sequence input
        or output is a list of arrays, an optional one None or its value."""
        self._check_open()
        plan = self.engine.plan
        checked = check_feeds(plan, flatten_feeds(self.engine.sequence_io, feeds))
        ctx = self._ctx
        ctx.begin()
        self._check_memory()
        for name in plan.inputs:
            self._input_shapes[name] = tuple(checked[name].shape)
        self._input_values.update({name: checked[name] for name in self._binder.value_inputs})
        self._bind()
        ctx.bind_addresses({})
        self._io_key = ((), id(self._consumed_event))  # the context's own memory
        for name in plan.inputs:
            ctx.copy_in(name, checked[name], ctx.stream)
        ctx.copy_values(self._shapes, ctx.stream)
        self._run(ctx.stream)
        out = {name: ctx.copy_out(name, ctx.stream) for name in plan.outputs}
        self._signal_at_end(ctx.stream)
        ctx.synchronize(ctx.stream)
        return pack_outputs(self.engine.sequence_io, out)

    def enqueue(self, bindings: Mapping[str, Any] | None = None, stream: Any = None) -> None:
        """Run on the caller's buffers on `stream` (a handle or stream object; None = the
        default stream) without synchronizing: each I/O tensor in `bindings` (DLPack /
        __cuda_array_interface__ objects or raw pointers on cuda, numpy arrays or addresses on
        cpu) is copied in or out; every other one must be bound with set_tensor_address and is
        read or written in place."""
        self._check_open()
        ctx = self._ctx
        plan = self.engine.plan
        bindings = dict(bindings or {})
        missing = [n for n in self.engine.io_tensors if n not in bindings and n not in self._addresses]
        if missing:
            raise RuntimeInputError(f"enqueue needs a buffer for every input and output; missing {missing}",
                                    hint="pass {name: buffer} for each, or bind it with set_tensor_address")
        ctx.begin()
        self._check_memory()
        self._bind()
        inplace = {}
        if self._addresses:
            inplace = {n: p for n, p in self._addresses.resolve(ctx, self._shapes.shapes).items() if n not in bindings}
        pairs = tuple(sorted(inplace.items()))
        if inplace and not self._replay_in_place(pairs):
            bindings.update(inplace)  # copied this time (module docstring of polykit.runtime.io_binding)
            inplace, pairs = {}, ()
        copied = ctx.bind_addresses(inplace)
        if copied:  # tensors the target cannot place: copied from/to the address
            for name in copied:
                bindings[name] = inplace.pop(name)
            pairs = tuple(sorted(inplace.items()))
        self._io_key = (pairs, id(self._consumed_event))
        user = ctx.borrow_stream(stream)
        for name in plan.inputs:
            if name not in inplace:
                ctx.copy_in_device(name, bindings[name], user)
        ctx.copy_values(self._shapes, user)
        self._run(user)
        for name in plan.outputs:
            if name not in inplace:
                ctx.copy_out_device(name, bindings[name], user)
        self._signal_at_end(user)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._drop_replays()
            self._ctx.close()

    def __enter__(self) -> "ExecutionContext":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@contextmanager
def run_body(body: Plan) -> Iterator[BodyFn]:
    """A built control-flow body as a function of its inputs (positional) returning its outputs
    (positional), run by an execution context of the plan's target: the Plan bodies' runner
    (polykit.compiler.ops.control.bodies.body_runner; the cpu target runs If/Loop/Scan layers so)."""
    names = list(body.metadata["body_outputs"])
    with Engine(body) as engine, engine.create_execution_context() as ctx:
        def run(values: Sequence[np.ndarray]) -> list[np.ndarray]:
            out = ctx.execute({name: np.asarray(v) for name, v in zip(body.inputs, values)})
            return [out[name] for name in names]

        yield run


register_body_runner(Plan, run_body)

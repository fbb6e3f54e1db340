"""Runtime, Engine, ExecutionContext: load a plan and run it on its target.

    runtime = Runtime()                      # or Runtime("cpu") to insist on a target
    engine = runtime.load_engine("model.plan")
    with engine.create_execution_context() as ctx:
        outputs = ctx.execute({"x": x})

A plan built for optimization profiles takes any input shape inside the context's profile
(`set_optimization_profile`); `execute` takes the shapes from the feeds, `enqueue` from
`set_input_shape`, and every tensor's shape is evaluated on the host before the launches
(polykit.runtime.shapes). The engine checks feeds (names, shapes, exact dtypes) and talks to the target only through
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
from polykit.runtime.output_alloc import OutputSizes
from polykit.runtime.sequences import flatten_feeds, layouts, pack_outputs
from polykit.runtime.shapes import ShapeBinder, ShapeSet
from polykit.runtime.tactic_check import check_tactics
from polykit.runtime.target import Target, TargetContext, get_target
from polykit.runtime.weight_streaming import WeightStreaming

#: captured replays (CUDA graphs) a context keeps, one per distinct set of input shapes
MAX_REPLAYS = 8


def run_layers(ctx: TargetContext, layers: Sequence[LayerDesc], stream: Any,
               marks: Callable[[Any], Any] | None = None, out: list | None = None,
               indices: Sequence[int] | None = None) -> None:
    """Launch `layers` (plan indices `indices`, default all in order) on `stream`; with
    `marks`, append (layer name, mark before, mark after) to `out` for each launch. A
    failure that is not a PolykitError is reported with the layer and its tactic."""
    for index in range(len(layers)) if indices is None else indices:
        layer = layers[index]
        before = marks(stream) if marks else None
        try:
            ctx.launch(index, stream)
        except PolykitError:
            raise
        except Exception as exc:
            raise PolykitError(f"tactic {layer.tactic!r} failed: {type(exc).__name__}: {exc}",
                               where=f"layer {layer.name!r} ({layer.kind})",
                               hint="the inputs may be out of the op's domain (check the feeds); else rebuild "
                                    "with another tactic for this layer or run it on --target cpu") from exc
        if marks:
            out.append((layer.name, before, marks(stream)))


def timed_pass(ctx: TargetContext, layers: Sequence[LayerDesc], stream: Any,
               indices: Sequence[int] | None = None) -> list[tuple[str, float]]:
    """(layer name, milliseconds) of each launch of one pass over `indices` (default all
    layers), timed with the context's timer; a pass whose timer says the host fell behind
    is repeated once (the timer has learned the enqueue time by then)."""
    timer = ctx.timer()
    count = len(layers) if indices is None else len(indices)
    times: list[tuple[str, float]] = []
    for _ in range(2):
        marked: list[tuple[str, Any, Any]] = []
        timer.begin(stream, count)
        try:
            run_layers(ctx, layers, stream, timer.mark, marked, indices)
        finally:
            valid = timer.end(stream)
            times = [(name, timer.elapsed_ms(a, b)) for name, a, b in marked]
            timer.release([m for _, a, b in marked for m in (a, b)])
        if valid:
            break
    return times


class Runtime:
    """Loads plans into Engines. `target` None: the plan's own target; else the plan must match."""

    def __init__(self, target: str | None = None):
        self.target = target

    def deserialize_engine(self, data: bytes | Plan) -> "Engine":
        plan = data if isinstance(data, Plan) else Plan.deserialize(data, expect_target=self.target)
        if self.target is not None and plan.target != self.target:
            raise PlanError(f"the plan was built for target {plan.target!r}, not {self.target!r}",
                            hint=f"rebuild the plan with --target {self.target}")
        return Engine(plan)

    def load_engine(self, path: str | os.PathLike) -> "Engine":
        return Engine(Plan.load(path, expect_target=self.target), where=str(path))


class Engine:
    """A plan loaded on its target: I/O metadata and a factory of execution contexts."""

    def __init__(self, plan: Plan, target: Target | None = None, *, where: str = "plan"):
        """`target`: the Target instance to load on (a CudaTarget(device=d) for a rank's GPU);
        default: a new one of the plan's target. The plan's tactics and kernel files are
        checked against this polykit's first (polykit.runtime.compatibility for a plan from
        another version, polykit.runtime.tactic_check: PlanError naming the field; `where`
        names the plan, e.g. its file)."""
        if target is not None and target.name != plan.target:
            raise PlanError(f"the plan was built for target {plan.target!r}, not {target.name!r}",
                            hint=f"rebuild the plan with --target {target.name}")
        check_versioned_tactics(plan, where)
        check_tactics(plan, where)
        self.plan = plan
        self.sequence_io = layouts(plan)  # sequence/optional I/O flattened at build time
        #: the layers each optimization profile runs (their tactics may differ: profile_tactics)
        self.profile_layers = [profile_layers(plan, p) for p in range(self.num_optimization_profiles)]
        self._streaming = WeightStreaming(plan, where)
        self._streaming_applied = False
        self._contexts: weakref.WeakSet[ExecutionContext] = weakref.WeakSet()
        self._target_engine = (target or get_target(plan.target)).load(plan)
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

    # ---- contexts ---------------------------------------------------------------------
    def create_execution_context(self, *, profile: bool | None = None, cuda_graph: bool = True,
                                 communicator: Any = None, **options: Any) -> "ExecutionContext":
        """A context with its own working memory. `profile`: time every layer of each run
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
            if not self._streaming_applied:
                self._apply_streaming()
            context = ExecutionContext(self, self._target_engine.create_context(**options), profile=profile,
                                       replay=cuda_graph and not profile)
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
    device buffers. One call at a time per context."""

    def __init__(self, engine: Engine, target_context: TargetContext, *, profile: bool = False, replay: bool = True):
        self.engine = engine
        self._ctx = target_context
        self._closed = False
        self._profile = profile
        self._replays: OrderedDict[tuple, Any] = OrderedDict()
        self._runs: dict[tuple, int] = {}
        self._binder = ShapeBinder(engine.plan)
        self._sizes = OutputSizes(engine.plan)
        self._replay_wanted = replay and not self._sizes  # launches that follow a read-back are not captured
        self._profile_index = 0
        self._input_shapes = {n: tuple(engine.plan.tensors[n].shape) for n in engine.plan.inputs}
        self._input_values: dict[str, np.ndarray] = {}
        self._shapes: ShapeSet | None = None
        self._ran: Mapping[str, tuple[int, ...]] = {}  # the shapes of the last run with data-dependent sizes
        self._last_profile: list[tuple[str, float]] = []

    @property
    def profile(self) -> list[tuple[str, float]]:
        """(layer, milliseconds) of the last run, when created with profile=True."""
        return list(self._last_profile)

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
        key = self._shapes.key if self._shapes is not None else ()
        runs = self._runs.get(key, 0)
        if self._sizes:
            self._run_segments(stream)
        elif self._profile:
            self._last_profile = timed_pass(self._ctx, layers, stream)
        elif self._replay_wanted and runs > 0:
            replay = self._replays.get(key)
            if replay is None:
                replay = self._ctx.capture(lambda s: run_layers(self._ctx, layers, s))
                self._replay_wanted = replay is not None
                if replay is not None:
                    self._keep_replay(key, replay)
            else:
                self._replays.move_to_end(key)
            if replay is not None:
                replay.launch(stream)
            else:
                run_layers(self._ctx, layers, stream)
        else:
            run_layers(self._ctx, layers, stream)
        self._runs[key] = runs + 1

    def _run_segments(self, stream: Any) -> None:
        """The layers of a plan with data-dependent sizes: bound after each layer that decides one."""
        layers, times = self.engine.profile_layers[self._profile_index], []

        def segment(indices: Sequence[int]) -> None:
            if self._profile:
                times.extend(timed_pass(self._ctx, layers, stream, indices))
            else:
                run_layers(self._ctx, layers, stream, indices=indices)

        self._shapes = self._sizes.run(self._ctx, self._binder, self._shapes, stream, segment)
        self._ran = self._shapes.shapes
        if self._profile:
            self._last_profile = times

    def _keep_replay(self, key: tuple, replay: Any) -> None:
        self._replays[key] = replay
        if len(self._replays) > MAX_REPLAYS:
            _, old = self._replays.popitem(last=False)
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
        for name in plan.inputs:
            self._input_shapes[name] = tuple(checked[name].shape)
        self._input_values.update({name: checked[name] for name in self._binder.value_inputs})
        self._bind()
        for name in plan.inputs:
            ctx.copy_in(name, checked[name], ctx.stream)
        ctx.copy_values(self._shapes, ctx.stream)
        self._run(ctx.stream)
        out = {name: ctx.copy_out(name, ctx.stream) for name in plan.outputs}
        ctx.synchronize(ctx.stream)
        return pack_outputs(self.engine.sequence_io, out)

    def enqueue(self, bindings: Mapping[str, Any], stream: Any = None) -> None:
        """Run on device buffers (DLPack / __cuda_array_interface__ objects or raw pointers),
        one per engine I/O tensor, on `stream` (a handle or stream object; None = the
        context's own), without synchronizing. Only targets with device memory have it."""
        self._check_open()
        ctx = self._ctx
        if not hasattr(ctx, "copy_in_device"):
            raise UsageError(f"the {self.engine.target} target has no device buffers to enqueue on",
                             hint="use execute(feeds) with numpy arrays, or build for --target cuda")
        plan = self.engine.plan
        missing = [n for n in list(plan.inputs) + list(plan.outputs) if n not in bindings]
        if missing:
            raise RuntimeInputError(f"enqueue needs a binding for every input and output; missing {missing}",
                                    hint="pass {name: device buffer} for each engine I/O tensor")
        ctx.begin()
        self._bind()
        user = ctx.borrow_stream(stream)
        for name in plan.inputs:
            ctx.copy_in_device(name, bindings[name], user)
        ctx.copy_values(self._shapes, user)
        self._run(user)
        for name in plan.outputs:
            ctx.copy_out_device(name, bindings[name], user)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._replays:
                self._ctx.synchronize(self._ctx.stream)
                for replay in self._replays.values():
                    replay.close()
                self._replays.clear()
            self._ctx.close()

    def __enter__(self) -> "ExecutionContext":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def check_feeds(plan: Plan, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Feeds as contiguous arrays, after checking names, shapes and exact dtypes."""
    if not isinstance(feeds, Mapping):
        raise RuntimeInputError(f"feeds must be a dict name -> array, got {type(feeds).__name__}")
    unknown = [n for n in feeds if n not in plan.inputs]
    if unknown:
        raise RuntimeInputError(f"feed {unknown[0]!r} is not an input of the engine",
                                where=f"tensor {unknown[0]!r}", hint=f"inputs are: {', '.join(plan.inputs)}")
    out: dict[str, np.ndarray] = {}
    for name in plan.inputs:
        desc = plan.tensors[name]
        if name not in feeds:
            raise RuntimeInputError(f"input {name!r} is missing from the feeds", where=f"tensor {name!r}",
                                    hint=f"feed a {desc.dtype} array of shape {tuple(desc.shape)}")
        value = feeds[name]
        if not isinstance(value, np.ndarray):
            if isinstance(value, (np.generic, int, float, bool, list, tuple)):
                value = np.asarray(value)
            else:
                raise RuntimeInputError(f"input {name!r} must be a numpy array, got {type(value).__name__}",
                                        where=f"tensor {name!r}")
        if value.dtype.name != desc.dtype:
            raise RuntimeInputError(f"input {name!r} has dtype {value.dtype.name}, the engine expects {desc.dtype}",
                                    where=f"tensor {name!r}", hint=f"convert it with .astype(np.{desc.dtype})")
        if not desc.dims and tuple(value.shape) != tuple(desc.shape):  # dynamic: ShapeBinder checks
            raise RuntimeInputError(
                f"input {name!r} has shape {tuple(value.shape)}, the engine expects {tuple(desc.shape)}",
                where=f"tensor {name!r}", hint="rebuild the plan with --input-shapes for other shapes")
        out[name] = np.asarray(value, order="C")
    for name, bound in (plan.metadata.get("input_values") or {}).items():
        value = out.get(name)
        if value is not None and not np.array_equal(value.ravel(), np.asarray(bound["values"], dtype=value.dtype),
                                                    equal_nan=value.dtype.kind == "f"):
            raise RuntimeInputError(
                f"input {name!r} differs from the value the plan was built for (BuilderConfig.input_values)",
                where=f"tensor {name!r}", hint="rebuild the plan with this input's value")
    return out


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

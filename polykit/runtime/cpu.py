"""The cpu target: runs a plan's layers with numpy cpu tactics (polykit.kernels.cpu).

It is what CI (no GPU) runs end to end and a fallback without a GPU. Each layer runs its
tactic's numpy function (`cpu.reference`, the op's reference kernel, or an alternative the
builder timed). An fp16/bf16 build stores its activations and weights in float16/bfloat16,
so the kernels run on those arrays here too. Activations are dropped after their last
reader, following the memory plan's lifetimes. There are no streams: `launch` runs the layer.
"""

from __future__ import annotations

import os
import platform
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from polykit.compiler.ops.data_dims import sized_tensors
from polykit.compiler.plan.records import layer_as_node
from polykit.kernels.profile_tactics import profile_layers
from polykit.errors import PlanError, PolykitError
from polykit.runtime.weight_streaming import HostStreamer, StreamSchedule


@dataclass(frozen=True)
class CpuDevice:
    """The host as a timing device: its processor name and architecture (timing-cache key)."""

    name: str
    arch: str
    sm_count: int


class CpuTarget:
    """The target named "cpu"."""

    name = "cpu"

    def available(self) -> bool:
        return True

    def device(self) -> CpuDevice:
        return CpuDevice(_processor_name(), platform.machine(), os.cpu_count() or 1)

    def load(self, plan: Any) -> "CpuEngine":
        return CpuEngine(plan)


def _processor_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


class CpuEngine:
    """A plan prepared for the cpu target: tactics resolved (per optimization profile where the
    plan chose them per profile), nodes built once, free lists precomputed."""

    def __init__(self, plan: Any):
        self.plan = plan
        #: outputs whose size only the run decides, past any reserved bytes (compiler.data_dims.sized_dim)
        self.sized = sized_tensors(plan)
        count = len(plan.profiles.ranges) if plan.profiles is not None else 1
        #: each profile's (layer, node, tactic) per layer; a context runs those of its shapes' profile
        if any(layer.profile_tactics for layer in plan.layers):
            self.profile_steps = [_steps(profile_layers(plan, p)) for p in range(count)]
        else:  # numpy kernels read no stamped shape: one list serves every profile
            self.profile_steps = [_steps(plan.layers)] * count
        self.steps = self.profile_steps[0]
        #: the live contexts (a weight refit reaches their tensors: update_weights)
        self.contexts: weakref.WeakSet[CpuContext] = weakref.WeakSet()
        keep = set(plan.outputs) | set(plan.inputs)  # the caller holds the inputs anyway; timing relaunches layers
        self.free_after: list[list[str]] = [[] for _ in plan.layers]
        for name, (_, last) in plan.memory.lifetimes.items():
            if name not in keep and 0 <= last < len(plan.layers):
                self.free_after[last].append(name)
        for names in self.free_after:
            names.sort()
        #: weight streaming (polykit.runtime.weight_streaming): the copies each context runs, None: all resident
        self.streaming: StreamSchedule | None = None

    def set_weight_streaming(self, schedule: StreamSchedule | None) -> None:
        """The weight-streaming schedule of the contexts created from now on (None: all resident)."""
        self.streaming = schedule

    def free_memory(self) -> None:
        """No device memory to run out of: the host's is not budgeted."""
        return None

    def create_context(self, communicator: Any = None, **options: Any) -> "CpuContext":
        context = CpuContext(self, communicator)
        self.contexts.add(context)
        return context

    def update_weights(self, weights: dict[str, np.ndarray]) -> None:
        """New weight values for the live contexts (each holds the weights in its tensors);
        new contexts take them from the plan, which the engine updates."""
        for context in list(self.contexts):
            context.env.update(weights)

    def close(self) -> None:
        self.steps = []
        self.profile_steps = []


def _steps(layers: Any) -> list[tuple[Any, Any, Any]]:
    """(layer, node, cpu tactic) per layer; PlanError for a tactic the cpu lacks or that refuses its layer."""
    from polykit.kernels.cpu.base import CpuTactic
    from polykit.kernels.tactics import find_tactic

    steps = []
    for layer in layers:
        tactic = find_tactic("cpu", layer.kind, layer.tactic)
        if not isinstance(tactic, CpuTactic):
            raise PlanError(f"layer uses tactic {layer.tactic!r}, which the cpu target does not have",
                            where=f"layer {layer.name!r}", hint="rebuild the plan with --target cpu")
        if not tactic.supports(layer):
            raise PlanError(f"tactic {layer.tactic!r} cannot run this {layer.kind} layer",
                            where=f"layer {layer.name!r}", hint="rebuild the plan with this polykit version")
        steps.append((layer, layer_as_node(layer), tactic))
    return steps


class PerfTimer:
    """perf_counter marks: on the cpu a launch is done when it returns."""

    def begin(self, stream: Any, launches: int) -> None:
        pass

    def mark(self, stream: Any) -> float:
        return time.perf_counter()

    def end(self, stream: Any) -> bool:
        return True

    def elapsed_ms(self, start: float, end: float) -> float:
        return (end - start) * 1e3

    def release(self, marks: list[Any]) -> None:
        pass


class CpuContext:
    """The tensors of one run (weights, then each layer's outputs until their last reader)."""

    stream = None

    def __init__(self, engine: CpuEngine, communicator: Any = None):
        self.engine = engine
        self.communicator = communicator  # collective layers exchange through it (runtime.collectives)
        self.env: dict[str, np.ndarray] = dict(engine.plan.weights)
        self._timer = PerfTimer()
        self._shapes: Any = {}
        self._steps = engine.steps
        #: the emulated device scratch the streamed weights are copied into before their readers
        self.streamer = (HostStreamer(engine.streaming, engine.plan.tensors, engine.plan.weights)
                         if engine.streaming is not None else None)

    def bind_shapes(self, shapes: Any) -> None:
        self._shapes = shapes.shapes
        self._steps = self.engine.profile_steps[shapes.key[0]]  # the key starts with the profile index

    def data_sizes(self, outputs: Any, stream: Any) -> dict[str, int]:
        """{symbol: size} of the data-dependent dims a layer just wrote (runtime.output_alloc.DataOutput)."""
        return {o.symbol: int(self.env[o.tensor].shape[o.axis]) for o in outputs}

    def begin(self) -> None:
        pass

    def copy_in(self, name: str, array: np.ndarray, stream: Any) -> None:
        self.env[name] = array

    def copy_values(self, shapes: Any, stream: Any) -> None:
        self.env.update(shapes.values)

    def copy_out(self, name: str, stream: Any) -> np.ndarray:
        return np.array(self.env[name], copy=True)

    def launch(self, index: int, stream: Any) -> None:
        layer, node, tactic = self._steps[index]
        env = self.env
        if self.streamer is not None:
            self.streamer.before(index, env)
        with np.errstate(all="ignore"):  # IEEE semantics: inf and NaN propagate as on the GPU, without warnings
            results = tactic.run(node, [env[name] if name else None for name in layer.inputs], self.communicator)
        for name, value in zip(layer.outputs, results):
            if name:
                env[name] = _conform(np.asarray(value), self.engine.plan.tensors.get(name), layer.name,
                                     self._shapes.get(name), name in self.engine.sized)
        if self.streamer is not None:
            self.streamer.after(layer.outputs, env)
        for name in self.engine.free_after[index]:
            env.pop(name, None)

    def synchronize(self, stream: Any) -> None:
        pass

    def timer(self) -> PerfTimer:
        return self._timer

    def capture(self, record: Callable[[Any], None]) -> None:
        return None

    def close(self) -> None:
        self.env = {}


def _conform(value: np.ndarray, desc: Any, layer: str, shape: Any = None, sized: bool = False) -> np.ndarray:
    """Check a layer output against the plan's TensorDesc and, for a dynamic tensor, the
    shape its expression gives for this run (a kernel or shape-rule bug otherwise); a `sized`
    one is held to no reserved bytes."""
    if desc is None:
        return value
    if shape is None and desc.dims:  # a data-dependent size, bound after the layer (runtime.output_alloc)
        return _conform_rank(value, desc, layer, sized)
    want = tuple(desc.shape) if shape is None else tuple(shape)
    if value.dtype.name != desc.dtype or tuple(value.shape) != want:
        raise PolykitError(
            f"layer produced {desc.name!r} as {value.dtype.name}{list(value.shape)}, the plan says "
            f"{desc.dtype}{list(want)}",
            where=f"layer {layer!r}",
            hint="the op's shape rule and reference kernel disagree; please report this",
        )
    return value


def _conform_rank(value: np.ndarray, desc: Any, layer: str, sized: bool) -> np.ndarray:
    """Check a data-dependent output's dtype, rank and reserved bytes (its sizes are bound from it)."""
    if value.dtype.name != desc.dtype or value.ndim != len(desc.shape) or value.nbytes > desc.nbytes and not sized:
        raise PolykitError(f"layer produced {desc.name!r} as {value.dtype.name}{list(value.shape)}, the plan "
                           f"reserves {desc.dtype} of rank {len(desc.shape)} in {desc.nbytes} bytes",
                           where=f"layer {layer!r}", hint="the op's shape rule and reference kernel disagree; "
                                                          "please report this")
    return value

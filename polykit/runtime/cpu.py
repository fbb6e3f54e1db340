"""The cpu target: runs a plan's layers with numpy cpu tactics (polykit.kernels.cpu).

It is what CI (no GPU) runs end to end and a fallback without a GPU. Each layer runs its
tactic's numpy function (`cpu.reference`, the op's reference kernel, or an alternative the
builder timed). An fp16/bf16 build stores its activations and weights in float16/bfloat16,
so the kernels run on those arrays here too. Activations are dropped after their last
reader, following the memory plan's lifetimes. There are no streams: `launch` runs the layer.

Memory follows the cuda target's contract with host memory standing in for device memory
(polykit.runtime.host_memory): each layer's outputs are written into the context's
activation arena at the memory plan's offsets (so the plan's slot reuse runs here too),
an arena the context owns or the caller gives (`set_device_memory`); every allocation goes
through the engine's allocator (with a caller's allocator the weights are copied into its
memory too); I/O tensors bound at caller addresses are read and written there in place.
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
from polykit.compiler.plan.memory import Placement, concat_rows
from polykit.compiler.plan.records import layer_as_node
from polykit.kernels.profile_tactics import profile_layers
from polykit.errors import PlanError, PolykitError, UsageError
from polykit.runtime.memory import HostBuffer, NumpyAllocator, check_scratch, host_binding, host_bytes
from polykit.runtime.weight_streaming import HostStreamer, StreamSchedule

#: alignment of the arena and of every allocation the cpu target asks for (as the cuda target's)
ALIGN = 256


@dataclass(frozen=True)
class CpuDevice:
    """The host as a timing device: its processor name and architecture (timing-cache key)."""

    name: str
    arch: str
    sm_count: int


class CpuTarget:
    """The target named "cpu". It has no devices to pick: a `device` is a UsageError (a GPU
    ordinal given to a host target is a mistake to report, not to ignore)."""

    name = "cpu"

    def __init__(self, device: int | None = None):
        if device is not None:
            raise UsageError(f"device {device} was asked for, but the cpu target runs on the host and has no devices",
                             hint="drop --device, or build and run for --target cuda")

    def available(self) -> bool:
        return True

    def device(self) -> CpuDevice:
        return CpuDevice(_processor_name(), platform.machine(), os.cpu_count() or 1)

    def load(self, plan: Any, allocator: Any = None, pdl: bool = False) -> "CpuEngine":
        """`pdl` is the cuda target's launch mode: nothing to overlap here."""
        return CpuEngine(plan, allocator)


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

    def __init__(self, plan: Any, allocator: Any = None):
        self.plan = plan
        self.allocator = allocator or NumpyAllocator()
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
        #: the arena a context needs: every planned slot, aligned
        self.memory_size = -(-int(plan.memory.arena_bytes) // ALIGN) * ALIGN
        #: layer outputs written into the arena: (offset, reserved bytes) of each tensor with a slot
        self.slots = {name: (desc.offset, desc.nbytes) for name, desc in plan.tensors.items()
                      if desc.kind != "weight" and desc.offset >= 0 and desc.nbytes > 0 and name not in self.sized
                      and name not in plan.inputs and not desc.np_dtype.hasobject}
        #: concat by placement (plan.memory.placements): each placed tensor's rows in its root's slot,
        #: and per Concat layer writing a root, its inputs' rows (the ones it copies: those not placed)
        self.placements = dict(plan.memory.placements)
        self.concat_rows: dict[int, list[tuple[str, Placement]]] = {}
        roots = {p.root for p in self.placements.values()}
        for i, layer in enumerate(plan.layers):
            if layer.kind == "Concat" and not layer.domain and layer.outputs and layer.outputs[0] in roots:
                self.concat_rows[i] = _input_rows(layer, plan.tensors)
        #: each layer's producer index (an output bound in place is written by its producer)
        self.producer = {name: i for i, layer in enumerate(plan.layers) for name in layer.outputs if name}
        self.weights = dict(plan.weights)
        self._weight_buffer = None
        if allocator is not None:  # the caller's allocator sees the weights' memory too
            self._weight_buffer = _copy_weights(plan, self.allocator, self.weights)
        #: weight streaming (polykit.runtime.weight_streaming): the copies each context runs, None: all resident
        self.streaming: StreamSchedule | None = None

    def set_weight_streaming(self, schedule: StreamSchedule | None) -> None:
        """The weight-streaming schedule of the contexts created from now on (None: all resident)."""
        self.streaming = schedule

    def free_memory(self) -> None:
        """No device memory to run out of: the host's is not budgeted."""
        return None

    def create_context(self, communicator: Any = None, device_memory: str | None = "owned",
                       **options: Any) -> "CpuContext":
        context = CpuContext(self, communicator, device_memory)
        self.contexts.add(context)
        return context

    def update_weights(self, weights: dict[str, np.ndarray]) -> None:
        """New weight values for the engine (in the caller's memory when an allocator holds the
        weights) and for the live contexts (each holds the weights in its tensors)."""
        for name, arr in weights.items():
            if self._weight_buffer is not None:
                np.copyto(self.weights[name], arr)
            else:
                self.weights[name] = arr
        for context in list(self.contexts):
            context.env.update({name: self.weights[name] for name in weights})

    def close(self) -> None:
        self.steps = []
        self.profile_steps = []
        self.weights = {}
        if self._weight_buffer is not None:
            self._weight_buffer.free()
            self._weight_buffer = None


def _copy_weights(plan: Any, allocator: Any, weights: dict[str, np.ndarray]) -> HostBuffer:
    """One buffer from `allocator` holding every weight (packed in plan order); `weights`
    then maps each name to its view there."""
    place, size = {}, 0
    for name, array in plan.weights.items():
        nbytes = np.asarray(array).nbytes
        place[name] = size
        size += -(-max(nbytes, 1) // ALIGN) * ALIGN
    buffer = HostBuffer(allocator, size, ALIGN, what="engine weights")
    for name, array in plan.weights.items():
        array = np.ascontiguousarray(array)
        if array.dtype.hasobject:  # strings stay on the Python heap
            continue
        view = buffer.view[place[name]:place[name] + array.nbytes].view(array.dtype).reshape(array.shape)
        view[...] = array
        weights[name] = view
    return buffer


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
    """The tensors of one run (weights, then each layer's outputs until their last reader),
    layer outputs kept in the activation arena (module docstring)."""

    stream = None
    io_alignment = 1  # numpy kernels need only the itemsize (io_binding checks at least that)
    can_capture = False

    def __init__(self, engine: CpuEngine, communicator: Any = None, device_memory: str | None = "owned"):
        self.engine = engine
        self.communicator = communicator  # collective layers exchange through it (runtime.collectives)
        self.env: dict[str, np.ndarray] = dict(engine.weights)
        self._timer = PerfTimer()
        self._shapes: Any = {}
        self._steps = engine.steps
        self._bound: dict[str, int] = {}  # I/O tensors at caller addresses
        self._owned: HostBuffer | None = None
        self._arena: np.ndarray | None = None
        if device_memory == "owned":
            self._owned = HostBuffer(engine.allocator, engine.memory_size, ALIGN, what="activation arena")
            self._arena = self._owned.view
        elif device_memory is not None:
            raise PolykitError(f"device_memory must be 'owned' or None, not {device_memory!r}")
        #: the emulated device scratch streamed weights are copied into before their readers
        self._scratch: HostBuffer | None = None
        self.streamer: HostStreamer | None = None
        if engine.streaming is not None:
            self._scratch = HostBuffer(engine.allocator, engine.streaming.scratch_bytes, ALIGN,
                                       what="weight streaming scratch")
            self.streamer = HostStreamer(engine.streaming, self._scratch.view, engine.plan.tensors, engine.weights)

    # ---- memory ---------------------------------------------------------------------------
    @property
    def has_memory(self) -> bool:
        return self._arena is not None or self.engine.memory_size == 0

    def set_device_memory(self, ptr: int, nbytes: int) -> None:
        check_scratch(ptr, nbytes, self.engine.memory_size, ALIGN)
        self._arena = host_bytes(ptr, self.engine.memory_size)

    def io_pointer(self, binding: Any, name: str, shape: tuple[int, ...], dtype: np.dtype) -> int:
        return host_binding(binding, name, shape, dtype)

    def bind_addresses(self, addresses: dict[str, int]) -> set[str]:
        """Inputs are read at their address; an output a layer produces is written there by it
        (one that is also an input, or a weight, is copied)."""
        plan = self.engine.plan
        self._bound = {}
        copies = set()
        for name, ptr in addresses.items():
            if name in plan.inputs:
                self.env[name] = self._view(name, ptr)
                if name in plan.outputs:
                    copies.add(name)
            elif name in self.engine.producer and name not in self.engine.sized:
                self._bound[name] = ptr
            else:
                copies.add(name)
        return copies

    def _view(self, name: str, ptr: int) -> np.ndarray:
        desc = self.engine.plan.tensors[name]
        shape = tuple(self._shapes.get(name, desc.shape))
        nbytes = int(np.prod(shape, dtype=np.int64)) * desc.np_dtype.itemsize
        return host_bytes(ptr, nbytes).view(desc.np_dtype).reshape(shape)

    def _rows(self, p: Placement, dtype: np.dtype) -> np.ndarray:
        """The [rows, p.row] strided view of the rows Placement `p` names in its root's slot."""
        size = dtype.itemsize
        start = self.engine.slots[p.root][0] + p.offset * size
        rows = self.engine.plan.tensors[p.root].nbytes // (p.stride * size)
        raw = np.lib.stride_tricks.as_strided(self._arena[start:], (rows, p.row * size), (p.stride * size, 1),
                                              writeable=True)
        return raw.view(dtype)

    def _concat(self, index: int) -> None:
        """A Concat whose output holds placed inputs: the inputs not placed copied into their rows,
        the placed ones already there (their producers wrote them); the output is the root's slot."""
        layer = self.engine.plan.layers[index]
        root = self.engine.plan.tensors[layer.outputs[0]]
        for name, rows in self.engine.concat_rows[index]:
            if name not in self.engine.placements and rows.row:
                self._rows(rows, root.np_dtype)[...] = np.asarray(self.env[name]).reshape(-1, rows.row)
        offset = self.engine.slots[root.name][0]
        self.env[root.name] = self._arena[offset:offset + root.nbytes].view(root.np_dtype).reshape(root.shape)

    def _place(self, name: str, value: np.ndarray) -> np.ndarray:
        """`value` written where tensor `name` lives: its caller address or arena slot (its rows in
        its root's slot where it is placed); kept on the heap (copied if it is a view) where it
        has neither."""
        placement = self.engine.placements.get(name)
        if placement is not None and self._arena is not None:
            rows = self._rows(placement, value.dtype)
            rows[...] = value.reshape(-1, placement.row)
            # its readers (the Concat, and those reading it strided) read it from the root's slot
            return rows.reshape(value.shape)
        ptr = self._bound.get(name)
        if ptr is not None:
            dst = host_bytes(ptr, value.nbytes).view(value.dtype).reshape(value.shape)
        else:
            slot = self.engine.slots.get(name)
            if slot is None or self._arena is None or value.nbytes > slot[1] or value.nbytes == 0:
                return value if value.base is None else value.copy()
            dst = self._arena[slot[0]:slot[0] + value.nbytes].view(value.dtype).reshape(value.shape)
        np.copyto(dst, value)
        return dst

    # ---- the protocol (polykit.runtime.target.TargetContext) -----------------------------
    def bind_shapes(self, shapes: Any) -> None:
        self._shapes = shapes.shapes
        self._steps = self.engine.profile_steps[shapes.key[0]]  # the key starts with the profile index

    def data_sizes(self, outputs: Any, stream: Any) -> dict[str, int]:
        """{symbol: size} of the data-dependent dims a layer just wrote (runtime.output_alloc.DataOutput)."""
        return {o.symbol: int(self.env[o.tensor].shape[o.axis]) for o in outputs}

    def begin(self) -> None:
        pass

    def borrow_stream(self, stream: Any) -> None:
        return None

    def copy_in(self, name: str, array: np.ndarray, stream: Any) -> None:
        self.env[name] = array

    def copy_in_device(self, name: str, binding: Any, stream: Any) -> None:
        desc = self.engine.plan.tensors[name]
        shape = tuple(self._shapes.get(name, desc.shape))
        self.env[name] = self._view(name, host_binding(binding, name, shape, desc.np_dtype)).copy()

    def copy_values(self, shapes: Any, stream: Any) -> None:
        self.env.update(shapes.values)

    def copy_out(self, name: str, stream: Any) -> np.ndarray:
        return np.array(self.env[name], copy=True)

    def copy_out_device(self, name: str, binding: Any, stream: Any) -> None:
        value = self.env[name]
        dst = host_bytes(host_binding(binding, name, value.shape, value.dtype), value.nbytes)
        dst[...] = np.ascontiguousarray(value).reshape(-1).view(np.uint8)

    def signal(self, event: Any, stream: Any) -> None:
        """`event.set()` (a threading.Event, or any object with set()): the layers so far have run."""
        event.set()

    def launch(self, index: int, stream: Any) -> None:
        layer, node, tactic = self._steps[index]
        env = self.env
        if index in self.engine.concat_rows and self._arena is not None:
            self._concat(index)
            self._free(index)
            return
        if self.streamer is not None:
            self.streamer.before(index, env)
        with np.errstate(all="ignore"):  # IEEE semantics: inf and NaN propagate as on the GPU, without warnings
            results = tactic.run(node, [env[name] if name else None for name in layer.inputs], self.communicator)
        for name, value in zip(layer.outputs, results):
            if name:
                value = _conform(np.asarray(value), self.engine.plan.tensors.get(name), layer.name,
                                 self._shapes.get(name), name in self.engine.sized)
                env[name] = self._place(name, value)
        self._free(index)

    def _free(self, index: int) -> None:
        for name in self.engine.free_after[index]:
            self.env.pop(name, None)

    def synchronize(self, stream: Any) -> None:
        pass

    def timer(self) -> PerfTimer:
        return self._timer

    def capture(self, record: Callable[[Any], None]) -> None:
        return None

    def close(self) -> None:
        self.env = {}
        if self._owned is not None:
            self._owned.free()
            self._owned = None
        self._arena = None
        if self._scratch is not None:
            self._scratch.free()
            self._scratch = None
            self.streamer = None


def _input_rows(layer: Any, tensors: Any) -> list[tuple[str, Placement]]:
    """(input, its rows in the output) of each input of Concat `layer` (concat_rows)."""
    shape = tensors[layer.outputs[0]].shape
    axis = int(layer.attrs.get("axis", 0)) % len(shape)
    out, start = [], 0
    for name in layer.inputs:
        if name:
            extent = int(tensors[name].shape[axis])
            out.append((name, Placement(layer.outputs[0], *concat_rows(shape, axis, start, extent))))
            start += extent
    return out


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

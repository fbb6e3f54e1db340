"""The narrow interface every target implements; nothing above runtime/ knows which target runs.

A target turns a loaded Plan into a TargetEngine (weights uploaded, kernels compiled or
fetched from cache: the "compile" step), which creates TargetContexts: one activation
memory each ("allocate": owned, or the caller's scratch of the engine's `memory_size` given
with `set_device_memory`), with `copy_in`/`copy_out` ("copy"), `launch(i)` of one layer
("launch"), `synchronize` and a `timer`. The engine (polykit.runtime.engine) owns the one
layer loop over them, the profiler and the error wrapping; the builder times single layers
through the same protocol (polykit.compiler.builder.tuner). Targets register in TARGETS by name and
are imported lazily, so `import polykit` never imports cuda-python.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Protocol

import numpy as np

from polykit.errors import DeviceError

#: target name -> "module:attribute" of a Target factory (a class or function with no args); the
#: names a plan may hold are polykit.compiler.plan.records.TARGETS
TARGETS: dict[str, str] = {
    "cpu": "polykit.runtime.cpu:CpuTarget",
    "cuda": "polykit.runtime.cuda:CudaTarget",
}


class Allocator(Protocol):
    """Where the runtime takes every device allocation it makes (weights, activation arena,
    workspace, staging): TensorRT's IGpuAllocator. The cpu target takes host memory from it."""

    def alloc(self, size: int, alignment: int) -> int:
        """The address of `size` bytes aligned to `alignment`; raise when it cannot."""

    def free(self, ptr: int) -> None:
        """Release an address `alloc` returned."""


class Timer(Protocol):
    """Times work enqueued on a stream: marks around launches, read after the pass."""

    def begin(self, stream: Any, launches: int) -> None:
        """Before a timed pass of `launches` launches (cuda: hold the stream so they queue
        back to back and the marks see device time, not the host's launch gaps)."""

    def mark(self, stream: Any) -> Any:
        """A point in the stream's work (a CUDA event; a perf_counter reading on cpu)."""

    def end(self, stream: Any) -> bool:
        """Wait for the pass; False if it must be repeated (the hold ended before the host
        finished enqueueing, so the marks include launch gaps)."""

    def elapsed_ms(self, start: Any, end: Any) -> float: ...

    def release(self, marks: list[Any]) -> None:
        """Free the marks of a pass."""


class Replay(Protocol):
    """Recorded layer launches replayed as one unit (a CUDA graph)."""

    def launch(self, stream: Any) -> None: ...

    def close(self) -> None: ...


class TargetContext(Protocol):
    #: the context's own stream (None where the target has none)
    stream: Any
    #: the alignment in bytes a caller's buffer bound to an I/O tensor must have
    io_alignment: int
    #: whether `capture` can record launches for replay (the engine then decides which runs it captures)
    can_capture: bool

    @property
    def has_memory(self) -> bool:
        """Whether the context has its activation memory (owned, or given by set_device_memory)."""

    def set_device_memory(self, ptr: int, nbytes: int) -> None:
        """Run on the caller's scratch at `ptr` (`nbytes` >= the engine's memory_size) from now on."""

    def io_pointer(self, binding: Any, name: str, shape: tuple[int, ...], dtype: np.dtype) -> int:
        """The address of a caller's buffer for I/O tensor `name` (an int, or an object with the
        target's array interface); RuntimeInputError when it is not `shape` x `dtype` memory."""

    def bind_addresses(self, addresses: dict[str, int]) -> set[str]:
        """I/O tensors the next runs read or write at the caller's `addresses` in place ({}: none);
        returns the names the target cannot place so (the engine copies those instead)."""

    def copy_in_device(self, name: str, binding: Any, stream: Any) -> None:
        """Copy a caller's buffer into the engine input `name` on `stream`."""

    def copy_out_device(self, name: str, binding: Any, stream: Any) -> None:
        """Copy the engine output `name` into a caller's buffer on `stream`."""

    def borrow_stream(self, stream: Any) -> Any:
        """The target's stream for what a caller passed as one (None: the default)."""

    def signal(self, event: Any, stream: Any) -> None:
        """Mark `event` done once the work enqueued on `stream` so far has run (input consumed)."""

    def begin(self) -> None:
        """Make the context usable on the calling thread (before each execute/enqueue)."""

    def copy_in(self, name: str, array: np.ndarray, stream: Any) -> None:
        """Copy a host array into the engine input `name`."""

    def copy_values(self, shapes: Any, stream: Any) -> None:
        """Write the shape-tensor values of ShapeSet `shapes` (host-computed) into their tensors."""

    def copy_out(self, name: str, stream: Any) -> np.ndarray:
        """A host copy of the engine output `name` once the stream's work before it is done."""

    def launch(self, index: int, stream: Any) -> bool | None:
        """Enqueue plan layer `index` on `stream` (run it, on a target without streams); False
        where it launched nothing (a view of its input's bytes), which the profiler then times
        as no work."""

    def bind_shapes(self, shapes: Any) -> None:
        """The tensor shapes of the next launches (a polykit.runtime.shapes.ShapeSet), before
        copy_in, for a plan built for optimization profiles (its shapes change between runs)."""

    def synchronize(self, stream: Any) -> None: ...

    def timer(self) -> Timer:
        """The context's timer (kept across passes: it learns how long the host takes)."""

    def capture(self, record: Callable[[Any], None]) -> Replay | None:
        """`record(stream)`'s launches captured for replay; None where the target cannot."""

    def close(self) -> None: ...


class TargetEngine(Protocol):
    #: bytes of scratch a context created without memory must be given (set_device_memory)
    memory_size: int

    def create_context(self, *, device_memory: str | None = "owned", **options: Any) -> TargetContext:
        """A context; `device_memory` None: one without activation memory (set_device_memory)."""

    def update_weights(self, weights: dict[str, np.ndarray]) -> None:
        """Give weights of the plan new values (same dtypes and shapes, checked by the engine)
        in the engine's copies and those of its live contexts, after the work in flight."""

    def set_weight_streaming(self, schedule: Any) -> None:
        """Weight streaming (a polykit.runtime.weight_streaming.StreamSchedule, None: every weight
        resident) for the contexts created from now on; called before the first context of a plan
        built --weight-streaming and whenever the budget changes (no context is open then)."""

    def free_memory(self) -> int | None:
        """Free device bytes (None on a target without device memory): the automatic budget."""

    def close(self) -> None: ...


class Target(Protocol):
    name: str

    def load(self, plan: Any, allocator: Allocator | None = None, pdl: bool = False) -> TargetEngine:
        """Prepare `plan` (a polykit.compiler.plan.file.Plan) to run on this target, taking its
        memory from `allocator` (default: the target's own); `pdl`: launch kernels as programmatic
        dependents where the device can (Hopper's PDL; a target without it ignores the flag)."""

    def available(self) -> bool: ...

    def device(self) -> "DeviceDescription":
        """The device a build for this target times on (name, arch, SM count)."""


class DeviceDescription(Protocol):
    name: str
    arch: str
    sm_count: int


def get_target(name: str, device: int | None = None) -> Target:
    """Instantiate the target called `name` (on GPU `device`, default the target's own: 0);
    DeviceError if unknown or unusable here."""
    spec = TARGETS.get(name)
    if spec is None:
        raise DeviceError(f"unknown target {name!r}", hint=f"use one of: {', '.join(sorted(TARGETS))}")
    module, attr = spec.split(":")
    try:
        factory = getattr(importlib.import_module(module), attr)
    except ImportError as exc:
        raise DeviceError(
            f"the {name} target cannot be loaded: {exc}",
            hint="install polykit[cuda] for the cuda target, or use --target cpu",
        ) from exc
    return factory() if device is None else factory(device=device)


def default_target() -> str:
    """'cuda' when a GPU is usable, else 'cpu'."""
    try:
        return "cuda" if get_target("cuda").available() else "cpu"
    except Exception:
        return "cpu"


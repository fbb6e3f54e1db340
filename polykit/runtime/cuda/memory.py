"""Device memory: owned buffers, the activation arena, host<->device copies.

Every allocation goes through `DeviceBuffer`, which reports an out-of-memory failure with
the requested and available bytes, and is freed deterministically by `free()` (or when the
owner closes); nothing relies on garbage collection to release device memory. With an
allocator (polykit.runtime.target.Allocator) a DeviceBuffer takes its memory from it and
gives it back to it. A `Region` is memory the runtime uses but the caller owns (a context's
scratch given with set_device_memory).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from polykit.errors import DeviceError
from polykit.runtime.cuda import driver
from polykit.runtime.memory import checked_alloc

#: Alignment of every arena slot and buffer the runtime hands to kernels (16-byte vector loads).
ALIGN = 256


def align_up(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


class WorkspacePool:
    """Layer scratch memory: every `take(n)` of one layer gets its own region, valid until the
    layer's enqueue returns; `reset()` at the next layer reuses the regions (kernels on one
    stream run in order). A context `reserve`s the workspace its plan records up front, so
    layers take from that one chunk; a layer that asks for more (a plan built on a GPU with
    another SM count) adds chunks on the first (eager) run. Chunks are only ever added, never
    reallocated, so a pointer handed out earlier in the same layer stays valid; a CUDA-graph
    capture, which must not allocate, raises through `frozen`."""

    MIN_CHUNK = 1 << 20

    def __init__(self, alloc=None):
        self._alloc = alloc or (lambda n: DeviceBuffer(n, what="layer workspace"))
        self._lent = False  # the first chunk is a Region of the context's scratch
        self.chunks: list = []
        self._chunk = 0
        self._offset = 0
        self.frozen = False

    def reset(self) -> None:
        self._chunk, self._offset = 0, 0

    def reserve(self, nbytes: int) -> None:
        """Allocate `nbytes` now (one chunk), before any layer runs."""
        if nbytes > 0 and not self.chunks:
            self.chunks.append(self._alloc(align_up(int(nbytes))))

    def lend(self, region: "Region") -> None:
        """Take the first chunk from the caller's scratch (`region`, replacing one lent before)
        instead of allocating it."""
        if self._lent:
            self.chunks[0] = region
        else:
            self.chunks.insert(0, region)
            self._lent = True
        self.reset()

    def take(self, nbytes: int) -> int:
        need = align_up(max(int(nbytes), 1))
        while self._chunk < len(self.chunks):
            buf = self.chunks[self._chunk]
            if self._offset + need <= buf.nbytes:
                ptr = buf.ptr + self._offset
                self._offset += need
                return ptr
            self._chunk, self._offset = self._chunk + 1, 0
        if self.frozen:
            raise DeviceError(f"a layer asked for {nbytes} more workspace bytes during CUDA-graph capture",
                              hint="create the context with cuda_graph=False and report this")
        self.chunks.append(self._alloc(max(need, self.MIN_CHUNK)))
        self._offset = need
        return self.chunks[-1].ptr

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.chunks)

    def free(self) -> None:
        for buf in self.chunks:
            buf.free()
        self.chunks.clear()
        self._lent = False
        self.reset()


class DeviceBuffer:
    """`nbytes` of device memory owned by this object; `ptr` is its device address."""

    def __init__(self, nbytes: int, *, what: str = "buffer", allocator: Any = None):
        self.nbytes = int(nbytes)
        self.what = what
        self.allocator = allocator
        self.ptr = 0
        if self.nbytes == 0:
            return
        if allocator is not None:
            self.ptr = checked_alloc(allocator, self.nbytes, ALIGN, what)
            return
        d = driver.drv()
        err, ptr = d.cuMemAlloc(max(self.nbytes, 1))
        if int(err) != 0:
            try:
                free, total = driver.mem_info()
            except DeviceError:
                free, total = -1, -1
            raise DeviceError(
                f"cannot allocate {self.nbytes} bytes of device memory for {what}: "
                f"{driver.error_name(err)} ({free} of {total} bytes free)",
                hint="use a smaller batch or fewer execution contexts, free other GPU work, or use --target cpu",
            )
        self.ptr = int(ptr)

    def free(self) -> None:
        if self.ptr and self.allocator is not None:
            self.allocator.free(self.ptr)
            self.ptr = 0
        elif self.ptr:
            driver.call("cuMemFree", self.ptr, what=f"free {self.what}")
            self.ptr = 0

    def __enter__(self) -> "DeviceBuffer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.free()


def upload(ptr: int, array: np.ndarray, stream: Any = None) -> None:
    """Copy a host array into device memory at `ptr`: on `stream` when given, else finished on
    return (see `_finished`)."""
    a = np.ascontiguousarray(array)
    if a.nbytes == 0:
        return
    driver.call("cuMemcpyHtoDAsync", ptr, a.ctypes.data, a.nbytes, _on(stream), what="host-to-device copy")
    _finished(stream)


def download(ptr: int, shape: tuple[int, ...], dtype: Any, stream: Any = None) -> np.ndarray:
    """Copy device memory at `ptr` into a new host array (waits for `stream` when given)."""
    out = np.empty(shape, dtype=dtype)
    if out.nbytes == 0:
        return out
    if stream is None:
        driver.call("cuMemcpyDtoH", out.ctypes.data, ptr, out.nbytes, what="device-to-host copy")
    else:
        driver.call("cuMemcpyDtoHAsync", out.ctypes.data, ptr, out.nbytes, stream, what="device-to-host copy")
        driver.call("cuStreamSynchronize", stream, what="stream synchronize")
    return out


def fill_bytes(ptr: int, nbytes: int, value: int = 0xFF, stream: Any = None) -> None:
    """Set `nbytes` at `ptr` to the byte `value` (0xFF poisons floats with NaN)."""
    if nbytes == 0:
        return
    driver.call("cuMemsetD8Async", ptr, value, nbytes, _on(stream), what="memset")
    _finished(stream)


def _on(stream: Any) -> Any:
    """`stream`, or the legacy default stream (handle 0) for a copy or memset without one."""
    return driver.drv().CUstream(0) if stream is None else stream


def _finished(stream: Any) -> None:
    """Wait for a copy or memset issued without a stream. cuMemcpyHtoD from pageable memory may
    return before its DMA lands, cuMemsetD8 and cuMemcpyDtoD return at once; the runtime's and users' streams
    are non-blocking, so they do not wait for the legacy stream: a kernel enqueued next could
    read the old bytes (weights, feeds) or have its outputs overwritten by a late poison fill."""
    if stream is None:
        driver.call("cuStreamSynchronize", driver.drv().CUstream(0), what="stream synchronize")


def copy_device(dst: int, src: int, nbytes: int, stream: Any = None) -> None:
    if nbytes == 0 or dst == src:
        return
    driver.call("cuMemcpyDtoDAsync", dst, src, nbytes, _on(stream), what="device-to-device copy")
    _finished(stream)


class Region:
    """`nbytes` of device memory at `ptr` that the caller owns: `free()` leaves it alone."""

    def __init__(self, ptr: int, nbytes: int):
        self.ptr, self.nbytes = int(ptr), int(nbytes)

    def free(self) -> None:
        pass


class Arena:
    """One allocation carved into slots at fixed offsets (the plan's memory plan), plus a
    workspace region at its end (together a context's scratch); `region`: the
    caller's memory to carve instead of allocating (from `allocator` when given)."""

    def __init__(self, nbytes: int, workspace: int = 0, *, what: str = "activation arena",
                 allocator: Any = None, region: Region | None = None):
        self.size = align_up(nbytes)
        self.workspace_size = align_up(workspace)
        self.buffer = region if region is not None else \
            DeviceBuffer(self.size + self.workspace_size, what=what, allocator=allocator)

    @property
    def base(self) -> int:
        return self.buffer.ptr

    def at(self, offset: int) -> int:
        return self.buffer.ptr + offset

    @property
    def workspace_ptr(self) -> int:
        return self.buffer.ptr + self.size

    def workspace(self) -> Region:
        return Region(self.workspace_ptr, self.workspace_size)

    def free(self) -> None:
        self.buffer.free()

"""The memory contract every target keeps, and emulated device memory for the cpu target.

`checked_alloc` takes memory from an Allocator (polykit.runtime.target) and refuses what is
no usable address; `check_scratch` checks the scratch a caller gives a context. The cpu target keeps the same memory contract as cuda (polykit.runtime.target.Allocator,
contexts with or without their own scratch, tensors bound at caller addresses), with host
memory standing in for device memory: an address is an int, and `host_bytes(ptr, n)` is a
numpy byte view of `n` bytes there. `NumpyAllocator`, the default, hands out aligned numpy
buffers and keeps them alive until `free`.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from polykit.errors import DeviceError, RuntimeInputError


def host_bytes(ptr: int, nbytes: int) -> np.ndarray:
    """A writable uint8 view of `nbytes` of host memory at address `ptr` (no copy)."""
    if nbytes == 0:
        return np.empty(0, np.uint8)
    return np.ctypeslib.as_array((ctypes.c_uint8 * int(nbytes)).from_address(int(ptr)))


class NumpyAllocator:
    """Host memory from numpy: `alloc(size, alignment)` -> an aligned address, held until `free(ptr)`."""

    def __init__(self) -> None:
        self._held: dict[int, np.ndarray] = {}

    def alloc(self, size: int, alignment: int) -> int:
        raw = np.empty(int(size) + int(alignment), np.uint8)
        ptr = raw.ctypes.data
        ptr += -ptr % int(alignment)
        self._held[ptr] = raw
        return ptr

    def free(self, ptr: int) -> None:
        self._held.pop(int(ptr), None)


class HostBuffer:
    """`nbytes` of host memory from `allocator` (checked like a device allocation), freed by `free()`."""

    def __init__(self, allocator: Any, nbytes: int, alignment: int, *, what: str):
        self.allocator, self.nbytes, self.what = allocator, int(nbytes), what
        self.ptr = checked_alloc(allocator, self.nbytes, alignment, what) if self.nbytes else 0
        self.view = host_bytes(self.ptr, self.nbytes)

    def free(self) -> None:
        if self.ptr:
            self.allocator.free(self.ptr)
            self.ptr = 0
            self.view = host_bytes(0, 0)


def checked_alloc(allocator: Any, nbytes: int, alignment: int, what: str) -> int:
    """`allocator.alloc(nbytes, alignment)`, refused (DeviceError) when it gives no usable address."""
    try:
        ptr = allocator.alloc(int(nbytes), int(alignment))
    except Exception as exc:
        raise DeviceError(f"the allocator failed to allocate {nbytes} bytes for {what}: {exc}",
                          hint="free memory or give the runtime an allocator that can serve this size") from exc
    if not isinstance(ptr, (int, np.integer)) or int(ptr) <= 0 or int(ptr) % alignment:
        raise DeviceError(f"the allocator returned {ptr!r} for {nbytes} bytes of {what}: not a non-null address "
                          f"aligned to {alignment} bytes", hint="return an int address aligned as asked, or raise")
    return int(ptr)


def host_binding(obj: Any, name: str, shape: tuple[int, ...], dtype: np.dtype) -> int:
    """The host address of a cpu binding: an int, or an object with `__array_interface__`
    (numpy) holding exactly `shape` elements of `dtype`, C-contiguous; RuntimeInputError else."""
    if isinstance(obj, (int, np.integer)) and not isinstance(obj, bool):
        if int(obj) <= 0 and int(np.prod(shape, dtype=np.int64)):
            raise RuntimeInputError(f"binding {name!r} is the address {int(obj)}", where=f"tensor {name!r}",
                                    hint="pass the address of the tensor's host buffer, or a numpy array")
        return int(obj)
    iface = getattr(obj, "__array_interface__", None)
    if iface is None:
        raise RuntimeInputError(f"binding {name!r} is a {type(obj).__name__}, not host memory",
                                where=f"tensor {name!r}",
                                hint="pass an int address or a numpy array (an object with __array_interface__)")
    arr = np.asarray(obj)
    if arr.dtype != dtype:
        raise RuntimeInputError(f"binding {name!r} holds {arr.dtype}, the engine's tensor is {dtype}",
                                where=f"tensor {name!r}", hint=f"bind a {dtype} buffer")
    if not arr.flags.c_contiguous:
        raise RuntimeInputError(f"binding {name!r} is not contiguous", where=f"tensor {name!r}",
                                hint="pass np.ascontiguousarray(...) of it")
    if arr.size != int(np.prod(shape, dtype=np.int64)):
        raise RuntimeInputError(f"binding {name!r} has shape {arr.shape}, the engine's tensor is {tuple(shape)}",
                                where=f"tensor {name!r}", hint="bind a buffer of exactly the tensor's size")
    if not arr.flags.writeable:
        raise RuntimeInputError(f"binding {name!r} is read-only", where=f"tensor {name!r}",
                                hint="bind a writable array")
    return int(iface["data"][0])


def check_scratch(ptr: int, nbytes: int, need: int, alignment: int) -> None:
    """RuntimeInputError unless `ptr`/`nbytes` is scratch a context can run on (set_device_memory)."""
    if not isinstance(ptr, (int, np.integer)) or isinstance(ptr, bool) or (need and int(ptr) <= 0):
        raise RuntimeInputError(f"device memory must be given as an int address, not {ptr!r}",
                                hint="pass the address of a buffer of engine.device_memory_size bytes")
    if int(nbytes) < need:
        raise RuntimeInputError(f"the device memory given has {nbytes} bytes; the context needs {need}",
                                hint="give at least engine.device_memory_size bytes")
    if int(ptr) % alignment:
        raise RuntimeInputError(f"the device memory at {int(ptr):#x} is not aligned to {alignment} bytes",
                                hint=f"give an address that is a multiple of {alignment}")

"""Device pointers and streams from what callers hand to `enqueue`.

Accepted buffers: a raw pointer (int), any object with `__cuda_array_interface__` (torch,
cupy, numba) or with `__dlpack__` on a CUDA device. Accepted streams: None (the legacy
default stream), an int handle, a CUstream, or an object with `cuda_stream` (torch) or
`__cuda_stream__()` (cuda.core, cupy). Accepted events (the input-consumed event): an int
handle, a CUevent, or an object with `handle` (polykit's Event) or `cuda_event` (torch).
Nothing here synchronizes.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from polykit.errors import RuntimeInputError

_KDL_CUDA, _KDL_CUDA_MANAGED = 2, 13


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int), ("dtype", _DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


#: DLPack type codes of numpy dtype kinds (bfloat16 is kDLBfloat, 4)
_DL_CODES = {"i": 0, "u": 1, "f": 2, "b": 6}


def _dl_dtype(dtype: np.dtype) -> tuple[int, int]:
    """(DLPack type code, bits) of a numpy dtype."""
    if dtype.name == "bfloat16":
        return 4, 16
    return _DL_CODES.get(dtype.kind, -1), dtype.itemsize * 8


def _dlpack_pointer(obj: Any, name: str) -> tuple[int, tuple[int, ...], bool, tuple[int, int]]:
    capsule = obj.__dlpack__()
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    addr = get(capsule, b"dltensor")
    t = _DLTensor.from_address(addr)  # DLManagedTensor starts with its DLTensor
    if t.device.device_type not in (_KDL_CUDA, _KDL_CUDA_MANAGED):
        raise RuntimeInputError(f"binding {name!r} is not in CUDA device memory (DLPack device {t.device.device_type})",
                                where=f"tensor {name!r}", hint="pass a GPU tensor, or use execute() with host arrays")
    shape = tuple(t.shape[i] for i in range(t.ndim))
    contiguous = True
    if t.strides:
        expect = 1
        for i in reversed(range(t.ndim)):
            if shape[i] != 1 and t.strides[i] != expect:
                contiguous = False
            expect *= shape[i]
    ptr = int(t.data or 0) + int(t.byte_offset)
    dtype = (int(t.dtype.code), int(t.dtype.bits) * max(int(t.dtype.lanes), 1))
    del capsule  # never consumed: the capsule's destructor releases the producer's tensor
    return ptr, shape, contiguous, dtype


def device_pointer(obj: Any, name: str, shape: tuple[int, ...] | None = None, dtype: Any = None) -> int:
    """The device address of a binding; RuntimeInputError when it is unusable (not contiguous,
    not `shape`'s element count, or, where the object says its type, not `dtype`)."""
    if isinstance(obj, (int, np.integer)) and not isinstance(obj, bool):
        return int(obj)
    iface = getattr(obj, "__cuda_array_interface__", None)
    if iface is not None:
        got_shape = tuple(iface["shape"])
        strides = iface.get("strides")
        contiguous = strides is None or _c_contiguous(got_shape, strides, np.dtype(iface["typestr"]).itemsize)
        ptr = int(iface["data"][0])
        got_dtype = np.dtype(iface["typestr"])
        wrong = dtype is not None and got_dtype.kind != "V" and got_dtype != np.dtype(dtype)
    elif hasattr(obj, "__dlpack__"):
        ptr, got_shape, contiguous, got_dtype = _dlpack_pointer(obj, name)
        wrong = dtype is not None and got_dtype != _dl_dtype(np.dtype(dtype))
    else:
        raise RuntimeInputError(f"binding {name!r} is a {type(obj).__name__}, not a device buffer",
                                where=f"tensor {name!r}",
                                hint="pass an int pointer or an object with __cuda_array_interface__ or __dlpack__")
    if wrong:
        raise RuntimeInputError(f"binding {name!r} holds {got_dtype}, the engine's tensor is {np.dtype(dtype)}",
                                where=f"tensor {name!r}", hint=f"bind a {np.dtype(dtype)} buffer")
    if not contiguous:
        raise RuntimeInputError(f"binding {name!r} is not contiguous", where=f"tensor {name!r}",
                                hint="call .contiguous() on it first")
    if shape is not None and int(np.prod(got_shape, dtype=np.int64)) != int(np.prod(shape, dtype=np.int64)):
        raise RuntimeInputError(f"binding {name!r} has shape {got_shape}, the engine expects {shape}",
                                where=f"tensor {name!r}")
    return ptr


def _c_contiguous(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> bool:
    expect = itemsize
    for d, s in zip(reversed(shape), reversed(strides)):
        if d != 1 and s != expect:
            return False
        expect *= d
    return True


def event_handle(event: Any) -> Any:
    """A CUevent for whatever the caller passed as an event."""
    from polykit.runtime.cuda.driver import drv

    d = drv()
    if isinstance(event, d.CUevent):
        return event
    if hasattr(event, "handle"):
        return event_handle(event.handle)
    if hasattr(event, "cuda_event"):
        return d.CUevent(int(event.cuda_event))
    if isinstance(event, (int, np.integer)) and not isinstance(event, bool):
        return d.CUevent(int(event))
    raise RuntimeInputError(f"the input-consumed event is a {type(event).__name__}, not a CUDA event",
                            hint="pass a CUevent, its int handle, or an object with .handle or .cuda_event")


def stream_handle(stream: Any) -> Any:
    """A CUstream for whatever the caller passed as a stream."""
    from polykit.runtime.cuda.driver import drv

    d = drv()
    if stream is None:
        return d.CUstream(0)
    if isinstance(stream, d.CUstream):
        return stream
    if hasattr(stream, "__cuda_stream__"):
        _, handle = stream.__cuda_stream__()
        return d.CUstream(int(handle))
    if hasattr(stream, "cuda_stream"):
        return d.CUstream(int(stream.cuda_stream))
    if hasattr(stream, "handle"):
        return stream_handle(stream.handle)
    return d.CUstream(int(stream))

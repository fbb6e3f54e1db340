"""Device pointers and streams from what callers hand to `enqueue`.

Accepted buffers: a raw pointer (int), any object with `__cuda_array_interface__` (torch,
cupy, numba) or with `__dlpack__` on a CUDA device. Accepted streams: None (the legacy
default stream), an int handle, a CUstream, or an object with `cuda_stream` (torch) or
`__cuda_stream__()` (cuda.core, cupy). Nothing here synchronizes.
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


def _dlpack_pointer(obj: Any, name: str) -> tuple[int, tuple[int, ...], bool]:
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
    del capsule  # never consumed: the capsule's destructor releases the producer's tensor
    return ptr, shape, contiguous


def device_pointer(obj: Any, name: str, shape: tuple[int, ...] | None = None) -> int:
    """The device address of a binding; RuntimeInputError when it is unusable."""
    if isinstance(obj, (int, np.integer)) and not isinstance(obj, bool):
        return int(obj)
    iface = getattr(obj, "__cuda_array_interface__", None)
    if iface is not None:
        got_shape = tuple(iface["shape"])
        strides = iface.get("strides")
        contiguous = strides is None or _c_contiguous(got_shape, strides, np.dtype(iface["typestr"]).itemsize)
        ptr = int(iface["data"][0])
    elif hasattr(obj, "__dlpack__"):
        ptr, got_shape, contiguous = _dlpack_pointer(obj, name)
    else:
        raise RuntimeInputError(f"binding {name!r} is a {type(obj).__name__}, not a device buffer",
                                where=f"tensor {name!r}",
                                hint="pass an int pointer or an object with __cuda_array_interface__ or __dlpack__")
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

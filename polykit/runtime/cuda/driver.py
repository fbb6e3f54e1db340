"""The one place that talks to the CUDA driver (cuda.bindings.driver).

Everything in polykit.runtime.cuda goes through `call(...)`, which turns a CUresult into a
DeviceError naming what failed, and `current_device()`, which initializes the driver, picks
a device and makes its primary context current on this thread. Importing this module does
not import cuda-python; the first call does.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import Any

from polykit.errors import DeviceError

_NO_GPU_HINT = "run on a machine with an NVIDIA GPU and driver, or use --target cpu"


@functools.lru_cache(maxsize=1)
def drv() -> Any:
    """The cuda.bindings.driver module; DeviceError when cuda-python is not installed."""
    try:
        from cuda.bindings import driver
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise DeviceError(f"cuda-python is not installed ({exc})",
                          hint="pip install 'polykit[cuda]', or use --target cpu") from exc
    return driver


def error_name(err: Any) -> str:
    d = drv()
    res, name = d.cuGetErrorName(err)
    return name.decode() if int(res) == 0 and name else str(err)


def call(fn_name: str, *args: Any, what: str | None = None, where: str | None = None) -> Any:
    """Call driver function `fn_name`; return its result(s) without the status code."""
    out = getattr(drv(), fn_name)(*args)
    err, rest = (out[0], out[1:]) if isinstance(out, tuple) else (out, ())
    if int(err) != 0:
        raise DeviceError(f"{what or fn_name} failed: {error_name(err)} ({int(err)})", where=where,
                          hint=_hint_for(int(err)))
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest


def _hint_for(code: int) -> str | None:
    if code in (100, 101, 35, 999):  # NO_DEVICE, INVALID_DEVICE, INSUFFICIENT_DRIVER, UNKNOWN
        return _NO_GPU_HINT
    if code == 2:
        return "free device memory (smaller batch, fewer contexts) or use --target cpu"
    if code in (700, 716, 719, 720):
        return "a kernel faulted; the context is unusable now -- rerun with the failing layer's tactic excluded"
    return None


@dataclass(frozen=True)
class DeviceInfo:
    """What the runtime needs to know about the device it runs on."""

    ordinal: int
    name: str
    arch: str  # "sm_90"
    sm_count: int
    total_mem: int
    max_shared_per_block_optin: int


class _DeviceState(threading.local):
    ctx: Any = None


_state = _DeviceState()
_lock = threading.Lock()
_primary: dict[int, tuple[Any, DeviceInfo]] = {}


def _cu_init() -> Any:
    """cuInit(0)'s status; DeviceError when the driver library itself cannot be loaded
    (cuda.bindings loads libcuda on the first call: without an NVIDIA driver it raises there)."""
    try:
        (err,) = drv().cuInit(0)
    except DeviceError:
        raise
    except Exception as exc:  # cuda.pathfinder's DynamicLibNotFoundError, an OSError from dlopen, ...
        raise DeviceError(f"no usable NVIDIA driver: {type(exc).__name__}: {exc}", hint=_NO_GPU_HINT) from None
    return err


def is_available() -> bool:
    """Whether a CUDA device is usable here (never raises)."""
    return device_count() > 0


def device_count() -> int:
    """CUDA devices usable here (0 without a driver or GPU; never raises)."""
    try:
        if int(_cu_init()) != 0:
            return 0
        err, count = drv().cuDeviceGetCount()
        return int(count) if int(err) == 0 else 0
    except Exception:
        return 0


def current_device(ordinal: int = 0) -> DeviceInfo:
    """Initialize the driver, retain device `ordinal`'s primary context and make it current."""
    d = drv()
    with _lock:
        if ordinal not in _primary:
            err = _cu_init()
            if int(err) != 0:
                raise DeviceError(f"no usable CUDA device: cuInit failed with {error_name(err)}", hint=_NO_GPU_HINT)
            count = call("cuDeviceGetCount")
            if count == 0:
                raise DeviceError("no CUDA device found", hint=_NO_GPU_HINT)
            if not 0 <= ordinal < count:
                raise DeviceError(f"CUDA device {ordinal} does not exist ({count} device(s) found)",
                                  hint=f"choose a device between 0 and {count - 1}, or use --target cpu")
            dev = call("cuDeviceGet", ordinal)
            ctx = call("cuDevicePrimaryCtxRetain", dev)
            attr = d.CUdevice_attribute
            major = call("cuDeviceGetAttribute", attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
            minor = call("cuDeviceGetAttribute", attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
            sms = call("cuDeviceGetAttribute", attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev)
            smem = call("cuDeviceGetAttribute", attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev)
            name = call("cuDeviceGetName", 256, dev)
            total = call("cuDeviceTotalMem", dev)
            info = DeviceInfo(ordinal, bytes(name).split(b"\0")[0].decode(), f"sm_{major}{minor}", sms, int(total), smem)
            _primary[ordinal] = (ctx, info)
        ctx, info = _primary[ordinal]
    if _state.ctx is not ctx:
        call("cuCtxSetCurrent", ctx)
        _state.ctx = ctx
    return info


def mem_info() -> tuple[int, int]:
    """(free, total) bytes of the current device."""
    free, total = call("cuMemGetInfo")
    return int(free), int(total)


def synchronize() -> None:
    call("cuCtxSynchronize", what="device synchronize")

"""CumSum / CumProd tactics (scan.cu): block scan of innermost rows, thread-per-column scan otherwise.

The axis input is read by the kernel on the device (plans keep no host copy of it); the
host only passes the input's dims. Deterministic: fixed summation order for a given shape.
"""

from __future__ import annotations

from typing import Mapping

from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, Launcher, cuda_tactic
from polykit.kernels.cuda.storage_types import CODE

FILE = "scan.cu"
MAXR = 8
DTYPES = ("f32", "f16", "f64", "i32", "i64", "u32", "u64")
BLOCK = 256
MAX_GRID = 65535


#: layer kind -> kernel name prefix in scan.cu
PREFIX = {"CumSum": "cumsum", "CumProd": "cumprod"}


def _kernels(layer) -> list[KernelSource]:
    kinds = [layer.kind] if layer is not None else list(PREFIX)
    return [KernelSource(f"{PREFIX[k]}_{c}", FILE) for k in kinds for c in DTYPES]


def scan_grid(size: int) -> int:
    """Blocks for `size` elements: one per 64 covers a row per block (rows >= 64 long) or a
    column per thread (shorter rows / inner axes) whatever the axis turns out to be."""
    return max(1, min(-(-size // 64), MAX_GRID))


def enqueue_scan(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    where = f"layer {layer.name!r}"
    x, axis, y = tensors[layer.inputs[0]], tensors[layer.inputs[1]], tensors[layer.outputs[0]]
    code = CODE.get(x.dtype.name)
    if code not in DTYPES:
        raise DeviceError(f"{layer.kind} has no CUDA kernel for {x.dtype}", where=where, hint="use --target cpu")
    if axis.dtype.name not in ("int32", "int64") or axis.size != 1:
        raise DeviceError(f"{layer.kind} axis must be one int32/int64 value, got {axis.dtype} of shape {axis.shape}",
                          where=where)
    if len(x.shape) > MAXR:
        raise DeviceError(f"{layer.kind} of a rank-{len(x.shape)} tensor (at most {MAXR})", where=where,
                          hint="use --target cpu")
    if x.size == 0:
        return
    shape = x.shape or (1,)
    dims = list(shape) + [1] * (MAXR - len(shape))
    args = [x, y, axis, int(axis.dtype.name == "int64"), int(bool(layer.attrs.get("exclusive", 0))),
            int(bool(layer.attrs.get("reverse", 0))), len(shape), *dims]
    launcher.launch(KernelSource(f"{PREFIX[layer.kind]}_{code}", FILE), (scan_grid(x.size), 1, 1), (BLOCK, 1, 1), args)


for _kind in PREFIX:
    cuda_tactic(_kind, "cuda.scan", kernels=_kernels)(enqueue_scan)


def compile_variants() -> list[KernelSource]:
    """The one scan.cu module (every op and dtype is an entry point in it)."""
    return _kernels(None)

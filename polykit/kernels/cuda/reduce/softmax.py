"""Softmax / LogSoftmax / Hardmax tactics (softmax.cu): row kernel when the axis is innermost,
column kernel (thread per column, coalesced) otherwise."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, Launcher, cuda_tactic, stored_as
from polykit.kernels.cuda.storage_types import CODE, dtype_names
from polykit.kernels.cuda.reduce.reduce import block_for

FILE = "softmax.cu"
DTYPES = ("f32", "f16", "bf16", "f64")
STORED = dtype_names(DTYPES)
MODES = {"Softmax": 0, "LogSoftmax": 1, "Hardmax": 2}


def softmax_kernels(layer) -> list[KernelSource]:
    return [KernelSource(f"softmax_{p}_{c}", FILE) for p in ("row", "col") for c in DTYPES]


def split_at_axis(shape: tuple[int, ...], axis: int) -> tuple[int, int, int]:
    """(outer, R, inner) of `shape` around `axis` (already non-negative)."""
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
    return outer, (shape[axis] if shape else 1), inner


def launch_softmax(launcher: Launcher, x: DeviceTensor, y: DeviceTensor, axis: int, mode: int, where: str) -> None:
    """y = Softmax / LogSoftmax / Hardmax (`mode`, see MODES) of x over `axis` (non-negative)."""
    code = CODE.get(x.dtype.name)
    if code not in DTYPES:
        raise DeviceError(f"softmax has no CUDA kernel for {x.dtype}", where=where, hint="use --target cpu")
    if x.size == 0:
        return
    outer, r, inner = split_at_axis(x.shape, axis)
    if inner == 1 and mode != 2:
        launcher.launch(KernelSource(f"softmax_row_{code}", FILE), (min(outer, 1 << 20), 1, 1), (block_for(r), 1, 1),
                        [x, y, outer, r, mode])
    else:
        n = outer * inner
        launcher.launch(KernelSource(f"softmax_col_{code}", FILE), (min(-(-n // 128), 1 << 20), 1, 1), (128, 1, 1),
                        [x, y, outer, r, inner, mode])


def enqueue_softmax(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    x, y = tensors[layer.inputs[0]], tensors[layer.outputs[0]]
    axis = int(layer.attrs.get("axis", -1)) % max(len(x.shape), 1)
    launch_softmax(launcher, x, y, axis, MODES[layer.kind], f"layer {layer.name!r}")


for _kind in MODES:
    cuda_tactic(_kind, "cuda.softmax", kernels=softmax_kernels, supports=stored_as(*STORED))(enqueue_softmax)


def compile_variants() -> list[KernelSource]:
    return softmax_kernels(None)

"""TopK tactic (topk.cu): per-row bitonic sort in shared memory for rows up to 4096 elements,
the same bitonic network in global memory (workspace) for longer rows.

K comes from the values output's shape (the plan knows it), so the kernel needs no host copy
of the K input. Order matches the reference: equal values in ascending index order, NaN
counted as the largest value; the output is sorted whatever `sorted` says.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, Launcher, cuda_tactic
from polykit.kernels.cuda.storage_types import CODE

FILE = "topk.cu"
DTYPES = ("f32", "f16", "f64", "i32", "i64", "u64", "u32", "i16", "u16", "i8", "u8")
SHARED_MAX = 4096
BLOCK = 256
MAX_GRID = 1 << 16


def _kernels(layer) -> list[KernelSource]:
    return [KernelSource(f"topk_{stage}_{c}", FILE) for c in DTYPES for stage in ("shared", "init", "step", "emit")]


def padded_length(r: int) -> int:
    """The bitonic sort's row length: the smallest power of two >= r (at least 1)."""
    return 1 << max(0, (r - 1).bit_length())


def shared_threads(p: int) -> int:
    return min(max(p // 2, 32), 512)


def _grid(n: int) -> tuple[int, int, int]:
    return (max(1, min(-(-n // BLOCK), MAX_GRID)), 1, 1)


def enqueue_topk(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    where = f"layer {layer.name!r}"
    x, y = tensors[layer.inputs[0]], tensors[layer.outputs[0]]
    ind = tensors[layer.outputs[1]] if len(layer.outputs) > 1 and layer.outputs[1] else None
    code = CODE.get(x.dtype.name)
    if code not in DTYPES:
        raise DeviceError(f"TopK has no CUDA kernel for {x.dtype}", where=where, hint="use --target cpu")
    if not x.shape:
        raise DeviceError("TopK of a scalar", where=where)
    axis = int(layer.attrs.get("axis", -1)) % len(x.shape)
    r, k = x.shape[axis], y.shape[axis]
    inner = int(np.prod(x.shape[axis + 1:], dtype=np.int64))
    rows = int(np.prod(x.shape[:axis], dtype=np.int64)) * inner
    if k == 0 or rows == 0:
        return
    if ind is None:  # the plan dropped the indices output: sort into scratch indices
        ind = DeviceTensor(launcher.workspace(y.size * 8), y.shape, np.dtype(np.int64))
    largest = int(bool(layer.attrs.get("largest", 1)))
    p = padded_length(r)
    key_bytes = x.dtype.itemsize if code != "f16" else 4  # fp16 rows sort as fp32 keys
    if p <= SHARED_MAX:
        launcher.launch(KernelSource(f"topk_shared_{code}", FILE), (min(rows, MAX_GRID), 1, 1),
                        (shared_threads(p), 1, 1), [x, y, ind, rows, r, inner, k, p, largest],
                        shared_mem=p * (key_bytes + 4))
        return
    keys = launcher.workspace(rows * p * key_bytes + rows * p * 4)
    ids = keys + rows * p * key_bytes
    launcher.launch(KernelSource(f"topk_init_{code}", FILE), _grid(rows * p), (BLOCK, 1, 1),
                    [x, keys, ids, rows, r, inner, p])
    size = 2
    while size <= p:
        stride = size // 2
        while stride > 0:
            launcher.launch(KernelSource(f"topk_step_{code}", FILE), _grid(rows * p // 2), (BLOCK, 1, 1),
                            [keys, ids, rows, p, size, stride, largest])
            stride //= 2
        size *= 2
    launcher.launch(KernelSource(f"topk_emit_{code}", FILE), _grid(rows * k), (BLOCK, 1, 1),
                    [keys, ids, y, ind, rows, inner, k, p])


cuda_tactic("TopK", "cuda.topk.bitonic", kernels=_kernels)(enqueue_topk)


def compile_variants() -> list[KernelSource]:
    """The one topk.cu module (every stage and dtype is an entry point in it)."""
    return _kernels(None)

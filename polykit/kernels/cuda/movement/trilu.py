"""Trilu tactic (trilu.cu): one thread per element, dtype-agnostic (moves element bits)."""

from __future__ import annotations

from typing import Mapping

from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, Launcher, cuda_tactic

FILE = "trilu.cu"
WIDTHS = (1, 2, 4, 8)
BLOCK = 256
MAX_GRID = 1 << 16


def _kernels(layer) -> list[KernelSource]:
    return [KernelSource(f"trilu_b{w}", FILE) for w in WIDTHS]


def enqueue_trilu(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    where = f"layer {layer.name!r}"
    x, y = tensors[layer.inputs[0]], tensors[layer.outputs[0]]
    k = tensors.get(layer.inputs[1]) if len(layer.inputs) > 1 and layer.inputs[1] else None
    if x.dtype.itemsize not in WIDTHS or x.dtype.kind not in "biuf":
        raise DeviceError(f"Trilu has no CUDA kernel for {x.dtype}", where=where, hint="use --target cpu")
    if len(x.shape) < 2:
        raise DeviceError(f"Trilu needs rank >= 2, got shape {x.shape}", where=where)
    if k is not None and (k.dtype.name != "int64" or k.size != 1):
        raise DeviceError(f"Trilu k must be one int64 value, got {k.dtype} of shape {k.shape}", where=where)
    if x.size == 0:
        return
    n, m = x.shape[-2], x.shape[-1]
    grid = max(1, min(-(-x.size // BLOCK), MAX_GRID))
    launcher.launch(KernelSource(f"trilu_b{x.dtype.itemsize}", FILE), (grid, 1, 1), (BLOCK, 1, 1),
                    [x, y, k.ptr if k is not None else 0, x.size, n, m, int(bool(layer.attrs.get("upper", 1)))])


cuda_tactic("Trilu", "cuda.trilu", kernels=_kernels)(enqueue_trilu)


def compile_variants() -> list[KernelSource]:
    """The one trilu.cu module (one entry point per element width)."""
    return _kernels(None)

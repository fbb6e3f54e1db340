"""Normalization tactics (norm.cu): Layer/Group/Instance/RMS normalization as per-row block
reductions, inference BatchNormalization as one pass over the tensor."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, Launcher, cuda_tactic, stored_as
from polykit.kernels.cuda.launch_geometry import grid_for
from polykit.kernels.cuda.storage_types import CODE, dtype_names
from polykit.kernels.cuda.reduce.reduce import block_for

FILE = "norm.cu"
DTYPES = ("f32", "f16", "f64")
STORED = dtype_names(DTYPES)


def _kernels(layer) -> list[KernelSource]:
    prefix = "batchnorm" if layer is not None and layer.kind == "BatchNormalization" else "norm_rows"
    return [KernelSource(f"{prefix}_{c}", FILE) for c in DTYPES]


def _code(layer, t: DeviceTensor) -> str:
    code = CODE.get(t.dtype.name)
    if code not in DTYPES:
        raise DeviceError(f"{layer.kind} has no CUDA kernel for {t.dtype}", where=f"layer {layer.name!r}",
                          hint="use --target cpu")
    return code


def _opt(layer, tensors, names, i):
    return tensors[names[i]] if len(names) > i and names[i] else None


def enqueue_rows(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    x = tensors[layer.inputs[0]]
    scale, bias = _opt(layer, tensors, layer.inputs, 1), _opt(layer, tensors, layer.inputs, 2)
    y = tensors[layer.outputs[0]]
    mean, rstd = _opt(layer, tensors, layer.outputs, 1), _opt(layer, tensors, layer.outputs, 2)
    eps = np.float64(layer.attrs.get("epsilon", 1e-5))
    if x.size == 0:
        return
    rms = 0
    if layer.kind in ("LayerNormalization", "RMSNormalization"):
        axis = int(layer.attrs.get("axis", -1)) % len(x.shape)
        length = int(np.prod(x.shape[axis:], dtype=np.int64))
        groups, d = 1, 1
        rms = int(layer.kind == "RMSNormalization")
    else:  # Group / Instance: statistics per (n, group), parameters per channel
        c = x.shape[1]
        groups = int(layer.attrs.get("num_groups", c)) if layer.kind == "GroupNormalization" else c
        d = int(np.prod(x.shape[2:], dtype=np.int64))
        length = (c // groups) * d
    for p, what in ((scale, "scale"), (bias, "bias")):
        if p is not None and p.size not in (1, (length if d == 1 else length * groups // d)):
            raise DeviceError(f"{what} of {p.size} elements does not match the normalized size",
                              where=f"layer {layer.name!r}", hint="use --target cpu")
    rows = x.size // length
    if mean is not None and mean.dtype != np.float32 or rstd is not None and rstd.dtype != np.float32:
        raise DeviceError("mean / inv_std outputs must be float32 (stash_type 1)", where=f"layer {layer.name!r}")
    args = [x, scale, bias if bias is not None else 0, y, mean if mean is not None else 0,
            rstd if rstd is not None else 0, rows, length, groups, d, scale.size,
            bias.size if bias is not None else 1, eps, rms]
    launcher.launch(KernelSource(f"norm_rows_{_code(layer, x)}", FILE), (min(rows, 1 << 20), 1, 1),
                    (block_for(length), 1, 1), args)


def enqueue_batchnorm(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    if layer.attrs.get("training_mode", 0):
        raise DeviceError("BatchNormalization in training mode has no CUDA kernel", where=f"layer {layer.name!r}",
                          hint="export the model in eval mode, or use --target cpu")
    x, scale, bias, mean, var = (tensors[n] for n in layer.inputs[:5])
    y = tensors[layer.outputs[0]]
    if x.size == 0:
        return
    c = x.shape[1] if len(x.shape) > 1 else 1
    inner = int(np.prod(x.shape[2:], dtype=np.int64))
    args = [x, scale, bias, mean, var, y, x.size, c, inner, np.float64(layer.attrs.get("epsilon", 1e-5))]
    launcher.launch(KernelSource(f"batchnorm_{_code(layer, x)}", FILE), grid_for(x.size), (256, 1, 1), args)


for _kind in ("LayerNormalization", "GroupNormalization", "InstanceNormalization", "RMSNormalization"):
    cuda_tactic(_kind, "cuda.norm.rows", kernels=_kernels, supports=stored_as(*STORED))(enqueue_rows)
cuda_tactic("BatchNormalization", "cuda.norm.batch", kernels=_kernels,
            supports=stored_as(*STORED, then=lambda layer: not layer.attrs.get("training_mode", 0)))(enqueue_batchnorm)


def compile_variants() -> list[KernelSource]:
    return [KernelSource(f"{p}_{c}", FILE) for p in ("norm_rows", "batchnorm") for c in DTYPES]

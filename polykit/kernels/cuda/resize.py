"""Resize tactic (resize.cu): nearest / linear, every coordinate mode but tf_crop_and_resize."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, Launcher, cuda_tactic
from polykit.kernels.cuda.pointwise import BLOCK, CODE, grid_for

FILE = "resize.cu"
DTYPES = ("f32", "f16", "f64", "u8")
MAXR = 8
COORD = {"half_pixel": 0, "half_pixel_symmetric": 1, "pytorch_half_pixel": 2, "align_corners": 3, "asymmetric": 4,
         "tf_half_pixel_for_nn": 5}
NEAREST = {"round_prefer_floor": 0, "round_prefer_ceil": 1, "floor": 2, "ceil": 3}


def supports(layer) -> bool:
    a = layer.attrs
    return (a.get("mode", "nearest") in ("nearest", "linear")
            and a.get("coordinate_transformation_mode", "half_pixel") in COORD
            and a.get("keep_aspect_ratio_policy", "stretch") == "stretch")


def _kernels(layer) -> list[KernelSource]:
    return [KernelSource(f"resize_{c}", FILE) for c in DTYPES]


def enqueue_resize(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    where = f"layer {layer.name!r}"
    if not supports(layer):
        raise DeviceError("this Resize mode has no CUDA kernel", where=where, hint="use --target cpu")
    x, y = tensors[layer.inputs[0]], tensors[layer.outputs[0]]
    code = CODE.get(x.dtype.name)
    if code not in DTYPES:
        raise DeviceError(f"Resize has no CUDA kernel for {x.dtype}", where=where, hint="use --target cpu")
    rank = len(x.shape)
    if rank > MAXR:
        raise DeviceError(f"rank {rank} exceeds {MAXR}", where=where, hint="use --target cpu")
    if y.size == 0:
        return
    scales = tensors.get(layer.inputs[2]) if len(layer.inputs) > 2 and layer.inputs[2] else None
    if scales is not None and (scales.size == 0 or scales.dtype != np.float32):
        scales = None if scales.size == 0 else scales
        if scales is not None:
            raise DeviceError(f"scales of dtype {scales.dtype} (float32 expected)", where=where)
    axes = [int(a) % rank for a in layer.attrs.get("axes", [])] or list(range(rank))
    slot = [-1] * MAXR
    if scales is not None:
        for k, a in enumerate(axes):
            slot[a] = k
    host = [y.shape[d] / x.shape[d] if x.shape[d] else 1.0 for d in range(rank)] + [1.0] * (MAXR - rank)
    linear = layer.attrs.get("mode", "nearest") == "linear"
    if linear and layer.attrs.get("antialias", 0) and any(h < 1 for h in host):
        raise DeviceError("antialiased linear downscaling has no CUDA kernel", where=where, hint="use --target cpu")
    pad = lambda v: list(v) + [1] * (MAXR - len(v))  # noqa: E731
    args = [x, y, scales if scales is not None else 0, y.size, rank, *pad(x.shape), *pad(y.shape), *slot,
            *[np.float64(h) for h in host], int(linear),
            COORD[layer.attrs.get("coordinate_transformation_mode", "half_pixel")],
            NEAREST.get(layer.attrs.get("nearest_mode", "round_prefer_floor"), 0)]
    launcher.launch(KernelSource(f"resize_{code}", FILE), grid_for(y.size), (BLOCK, 1, 1), args)


cuda_tactic("Resize", "cuda.resize", kernels=_kernels, supports=supports)(enqueue_resize)


def compile_variants() -> list[KernelSource]:
    return _kernels(None)

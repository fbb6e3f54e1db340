"""LRN tactic (lrn.cu): cross-channel local response normalization for float16/32/64."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, Launcher, cuda_tactic
from polykit.kernels.cuda.launch_geometry import BLOCK, grid_for

FILE = "lrn.cu"
CODES = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16", np.dtype(np.float64): "f64"}


def _kernels(layer) -> list[KernelSource]:
    return [KernelSource(f"lrn_{code}", FILE) for code in CODES.values()]


def enqueue_lrn(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    x, y = tensors[layer.inputs[0]], tensors[layer.outputs[0]]
    where = f"layer {layer.name!r}"
    code = CODES.get(x.dtype)
    if code is None:
        raise DeviceError(f"LRN of {x.dtype} has no kernel", where=where, hint="use --target cpu")
    if len(x.shape) < 2:
        raise DeviceError(f"LRN needs an (N, C, ...) input, got shape {x.shape}", where=where)
    if x.size == 0:
        return
    scalar = np.float64 if x.dtype == np.float64 else np.float32
    spatial = int(np.prod(x.shape[2:], dtype=np.int64))
    at = layer.attrs
    args = [x, y, x.size, x.shape[1], spatial, int(at["size"]), scalar(at.get("alpha", 1e-4)),
            scalar(at.get("beta", 0.75)), scalar(at.get("bias", 1.0))]
    launcher.launch(KernelSource(f"lrn_{code}", FILE), grid_for(x.size), (BLOCK, 1, 1), args)


cuda_tactic("LRN", "cuda.lrn", kernels=_kernels, supports=lambda layer: layer.domain in ("", "ai.onnx"))(enqueue_lrn)


def compile_variants() -> list[KernelSource]:
    return _kernels(None)[:1]

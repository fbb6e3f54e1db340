"""Random-op tactics (random.cu): RandomUniform(Like), RandomNormal(Like), Bernoulli on the
counter-based generator of polykit.compiler.ops.math.random (the same bits as the cpu reference)."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from polykit.compiler.ops.math.random import random_key
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, Launcher, cuda_tactic, storage_code
from polykit.kernels.cuda.launch_geometry import BLOCK, grid_for
from polykit.kernels.cuda.storage_types import CODE

FILE = "random.cu"
DTYPES = ("f32", "f16", "f64", "bf16")
#: Bernoulli output dtype -> its code in random.cu's st_code
OUT_CODES = {name: k for k, name in enumerate(
    ("float32", "float16", "float64", "bfloat16", "int8", "uint8", "int16", "int32", "int64", "bool"))}
RANDOM_KINDS = ("RandomUniform", "RandomNormal", "RandomUniformLike", "RandomNormalLike")


def _kernels(layer) -> list[KernelSource]:
    return [KernelSource(f"{p}_{c}", FILE) for p in ("random", "bernoulli") for c in DTYPES]


def _key(layer) -> np.uint64:
    return np.uint64(random_key(layer.attrs, layer.outputs[0]))


def enqueue_random(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    y = tensors[layer.outputs[0]]
    code = storage_code(layer, y, CODE, DTYPES, "output")
    if y.size == 0:
        return
    attrs = layer.attrs
    if layer.kind.startswith("RandomUniform"):
        normal, a, b = 0, float(attrs.get("low", 0.0)), float(attrs.get("high", 1.0))
    else:
        normal, a, b = 1, float(attrs.get("mean", 0.0)), float(attrs.get("scale", 1.0))
    launcher.launch(KernelSource(f"random_{code}", FILE), grid_for(y.size), (BLOCK, 1, 1),
                    [y, y.size, _key(layer), np.int32(normal), np.float64(a), np.float64(b)])


def enqueue_bernoulli(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    p, y = tensors[layer.inputs[0]], tensors[layer.outputs[0]]
    code = storage_code(layer, p, CODE, DTYPES, "input")
    if y.dtype.name not in OUT_CODES:
        raise DeviceError(f"Bernoulli output of dtype {y.dtype} has no CUDA kernel", where=f"layer {layer.name!r}",
                          hint="use --target cpu")
    if y.size == 0:
        return
    launcher.launch(KernelSource(f"bernoulli_{code}", FILE), grid_for(y.size), (BLOCK, 1, 1),
                    [p, y, np.int32(OUT_CODES[y.dtype.name]), y.size, _key(layer)])


for _kind in RANDOM_KINDS:
    cuda_tactic(_kind, "cuda.random", kernels=_kernels)(enqueue_random)
cuda_tactic("Bernoulli", "cuda.random.bernoulli", kernels=_kernels)(enqueue_bernoulli)


def compile_variants() -> list[KernelSource]:
    """The one random.cu module (every kernel is an entry point in it)."""
    return _kernels(None)

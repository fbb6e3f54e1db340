"""Gather / GatherElements / ai.polykit ConcatGather tactics (gather.cu), dtype-agnostic by element size."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.ops.tensor.concat_gather import CONCAT_GATHER, MAX_SOURCES
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, Launcher, cuda_tactic
from polykit.kernels.cuda.launch_geometry import BLOCK, grid_for

FILE = "gather.cu"
SIZES = (1, 2, 4, 8)
MAXR = 8


def _kernels(prefix):
    return lambda layer: [KernelSource(f"{prefix}_{es}", FILE) for es in SIZES]


def _check(layer, data: DeviceTensor, idx: DeviceTensor) -> tuple[int, str]:
    where = f"layer {layer.name!r}"
    if data.dtype.itemsize not in SIZES:
        raise DeviceError(f"no gather kernel for {data.dtype}", where=where, hint="use --target cpu")
    if idx.dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise DeviceError(f"indices of dtype {idx.dtype} (int32/int64 expected)", where=where)
    return data.dtype.itemsize, where


def enqueue_gather(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    data, idx, out = tensors[layer.inputs[0]], tensors[layer.inputs[1]], tensors[layer.outputs[0]]
    es, _ = _check(layer, data, idx)
    if out.size == 0:
        return
    axis = int(layer.attrs.get("axis", 0)) % len(data.shape)
    outer = int(np.prod(data.shape[:axis], dtype=np.int64))
    inner = int(np.prod(data.shape[axis + 1:], dtype=np.int64))
    args = [data, idx, out, int(idx.dtype.itemsize == 8), outer, data.shape[axis], idx.size, inner]
    launcher.launch(KernelSource(f"gather_{es}", FILE), grid_for(out.size), (BLOCK, 1, 1), args)


def enqueue_gather_elements(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    data, idx, out = tensors[layer.inputs[0]], tensors[layer.inputs[1]], tensors[layer.outputs[0]]
    es, where = _check(layer, data, idx)
    if out.size == 0:
        return
    rank = len(data.shape)
    if rank > MAXR:
        raise DeviceError(f"rank {rank} exceeds {MAXR}", where=where, hint="use --target cpu")
    axis = int(layer.attrs.get("axis", 0)) % rank
    pad = lambda s: list(s) + [1] * (MAXR - len(s))  # noqa: E731
    args = [data, idx, out, int(idx.dtype.itemsize == 8), out.size, rank, axis, *pad(idx.shape), *pad(data.shape)]
    launcher.launch(KernelSource(f"gather_elements_{es}", FILE), grid_for(out.size), (BLOCK, 1, 1), args)


def concat_gather_args(layer, tensors: Mapping[str, DeviceTensor]) -> tuple[str, int, list]:
    """(kernel, output elements, arguments) of a ConcatGather: the sources viewed [outer, e_s, inner],
    absent ones null with extent 0; every size a runtime argument."""
    idx, out = tensors[layer.inputs[0]], tensors[layer.outputs[0]]
    sources = [tensors[name] for name in layer.inputs[1:]]
    es, where = _check(layer, sources[0], idx)
    if idx.dtype != np.dtype(np.int64) or len(sources) > MAX_SOURCES:
        raise DeviceError(f"ConcatGather of {len(sources)} sources with {idx.dtype} indices", where=where,
                          hint=f"at most {MAX_SOURCES} sources and int64 indices (compose_concat_gathers makes both)")
    axis = int(layer.attrs.get("axis", 0)) % len(out.shape)
    outer = int(np.prod(out.shape[:axis], dtype=np.int64))
    inner = int(np.prod(out.shape[axis + 1:], dtype=np.int64))
    pad = MAX_SOURCES - len(sources)
    args = [idx, out, outer, idx.size, inner, *sources, *([0] * pad), *(int(x.shape[axis]) for x in sources),
            *([0] * pad)]
    return f"concat_gather_{es}", out.size, args


def enqueue_concat_gather(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    name, n, args = concat_gather_args(layer, tensors)
    if n:
        launcher.launch(KernelSource(name, FILE), grid_for(n), (BLOCK, 1, 1), args)


cuda_tactic("Gather", "cuda.gather", kernels=_kernels("gather"))(enqueue_gather)
cuda_tactic(CONCAT_GATHER, "cuda.gather.concat", domain=POLYKIT_DOMAIN, kernels=_kernels("concat_gather"))(
    enqueue_concat_gather)
cuda_tactic("GatherElements", "cuda.gather.elements", kernels=_kernels("gather_elements"))(enqueue_gather_elements)


def compile_variants() -> list[KernelSource]:
    return _kernels("gather")(None) + _kernels("gather_elements")(None) + _kernels("concat_gather")(None)

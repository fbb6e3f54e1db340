"""Index-addressed tactics (scatter.cu): GatherND, ScatterND, ScatterElements (reduction
none / add / mul / max / min) and MaxUnpool.

Scatters copy data into the output (movement.cu's copy) and then apply the updates; the
reductions run atomically and exist for float32/float16/float64/int32/int64, the plain store
for any element size.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from polykit.compiler.ops.nn.pool import unpool_shape
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, Launcher, cuda_tactic
from polykit.kernels.cuda.movement.movement import launch_copy
from polykit.kernels.tactics import find_tactic
from polykit.kernels.cuda.launch_geometry import BLOCK, grid_for

FILE = "scatter.cu"
SIZES = (1, 2, 4, 8)
MAXR = 8
REDUCTIONS = {"add": 0, "mul": 1, "max": 2, "min": 3}
REDUCE_CODES = {np.dtype("float32"): "f32", np.dtype("float16"): "f16", np.dtype("float64"): "f64",
                np.dtype("int32"): "i32", np.dtype("int64"): "i64"}


def copy_kernels(layer) -> list[KernelSource]:
    """The kernels movement's launch_copy may launch (those of its contiguous-copy tactic)."""
    return find_tactic("cuda", "Reshape", "cuda.movement.copy").kernels(layer)


def _src(name: str) -> KernelSource:
    return KernelSource(name, FILE)


def _sized(prefix: str) -> list[KernelSource]:
    return [_src(f"{prefix}_{es}") for es in SIZES]


def _pad8(v: Sequence[int], fill: int = 1) -> list[int]:
    return [int(x) for x in v] + [fill] * (MAXR - len(v))


def _check(layer, data: DeviceTensor, idx: DeviceTensor) -> tuple[int, str]:
    where = f"layer {layer.name!r}"
    if data.dtype.itemsize not in SIZES:
        raise DeviceError(f"no kernel for {data.dtype} elements", where=where, hint="use --target cpu")
    if idx.dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise DeviceError(f"indices of dtype {idx.dtype} (int32/int64 expected)", where=where)
    return data.dtype.itemsize, where


def enqueue_gather_nd(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    data, idx, out = tensors[layer.inputs[0]], tensors[layer.inputs[1]], tensors[layer.outputs[0]]
    es, where = _check(layer, data, idx)
    if out.size == 0:
        return
    b = int(layer.attrs.get("batch_dims", 0))
    k = idx.shape[-1]
    if k > MAXR:
        raise DeviceError(f"index tuples of {k} dims exceed {MAXR}", where=where, hint="use --target cpu")
    batch = int(np.prod(data.shape[:b], dtype=np.int64))
    m = int(np.prod(idx.shape[b:-1], dtype=np.int64))
    inner = int(np.prod(data.shape[b + k:], dtype=np.int64))
    args = [data, idx, out, int(idx.dtype.itemsize == 8), batch, m, k, inner, *_pad8(data.shape[b:b + k])]
    launcher.launch(_src(f"gather_nd_{es}"), grid_for(out.size), (BLOCK, 1, 1), args)


def _reduction(layer, data: DeviceTensor, where: str) -> tuple[str, int]:
    """(kernel suffix, op code or -1 for a plain store) of the layer's reduction for the data's dtype."""
    reduction = layer.attrs.get("reduction", "none")
    if reduction == "none":
        return f"none_{data.dtype.itemsize}", -1
    code = REDUCE_CODES.get(data.dtype)
    if reduction not in REDUCTIONS or code is None:
        raise DeviceError(f"reduction {reduction!r} of {data.dtype} has no kernel", where=where,
                          hint="use --target cpu")
    return f"reduce_{code}", REDUCTIONS[reduction]


def _copy_data(launcher: Launcher, data: DeviceTensor, out: DeviceTensor, where: str) -> None:
    if data.ptr != out.ptr:
        launch_copy(launcher, data, out, [data.size], [1], [1], where=where)


def enqueue_scatter_nd(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    data, idx, upd = (tensors[n] for n in layer.inputs[:3])
    out = tensors[layer.outputs[0]]
    _, where = _check(layer, data, idx)
    suffix, op = _reduction(layer, data, where)
    _copy_data(launcher, data, out, where)
    k = idx.shape[-1]
    if k > MAXR:
        raise DeviceError(f"index tuples of {k} dims exceed {MAXR}", where=where, hint="use --target cpu")
    m = int(np.prod(idx.shape[:-1], dtype=np.int64))
    inner = int(np.prod(data.shape[k:], dtype=np.int64))
    if m * inner == 0:
        return
    args = [out, idx, upd, int(idx.dtype.itemsize == 8), m, k, inner, *_pad8(data.shape[:k])]
    if op >= 0:
        args.append(np.int32(op))
    launcher.launch(_src(f"scatter_nd_{suffix}"), grid_for(m * inner), (BLOCK, 1, 1), args)


def enqueue_scatter_elements(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    data, idx, upd = (tensors[n] for n in layer.inputs[:3])
    out = tensors[layer.outputs[0]]
    _, where = _check(layer, data, idx)
    suffix, op = _reduction(layer, data, where)
    _copy_data(launcher, data, out, where)
    rank = len(data.shape)
    if rank > MAXR:
        raise DeviceError(f"rank {rank} exceeds {MAXR}", where=where, hint="use --target cpu")
    if idx.size == 0:
        return
    axis = int(layer.attrs.get("axis", 0)) % rank
    args = [out, idx, upd, int(idx.dtype.itemsize == 8), idx.size, rank, axis, *_pad8(idx.shape), *_pad8(data.shape)]
    if op >= 0:
        args.append(np.int32(op))
    launcher.launch(_src(f"scatter_elements_{suffix}"), grid_for(idx.size), (BLOCK, 1, 1), args)


def enqueue_max_unpool(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    x, idx, out = tensors[layer.inputs[0]], tensors[layer.inputs[1]], tensors[layer.outputs[0]]
    es, where = _check(layer, x, idx)
    if idx.dtype != np.dtype(np.int64):
        raise DeviceError(f"MaxUnpool indices of dtype {idx.dtype} (int64 expected)", where=where)
    rank = len(x.shape)
    if rank > MAXR:
        raise DeviceError(f"rank {rank} exceeds {MAXR}", where=where, hint="use --target cpu")
    unpooled = tuple(x.shape[:2]) + tuple(unpool_shape(layer.attrs, x.shape[2:], where=where))
    launcher.launch(_src(f"zero_{es}"), grid_for(out.size), (BLOCK, 1, 1), [out, out.size])
    if x.size:
        launcher.launch(_src(f"max_unpool_{es}"), grid_for(x.size), (BLOCK, 1, 1),
                        [x, idx, out, x.size, rank, *_pad8(unpooled), *_pad8(out.shape)])


def _reduce_kernels(prefix: str):
    return lambda layer: (_sized(f"{prefix}_none") + [_src(f"{prefix}_reduce_{c}") for c in REDUCE_CODES.values()]
                          + copy_kernels(layer))


def _plain(layer) -> bool:
    return layer.domain in ("", "ai.onnx")


def _scatter_supported(layer) -> bool:
    return _plain(layer) and layer.attrs.get("reduction", "none") in ("none", *REDUCTIONS)


cuda_tactic("GatherND", "cuda.scatter.gather_nd", kernels=lambda layer: _sized("gather_nd"),
            supports=_plain)(enqueue_gather_nd)
cuda_tactic("ScatterND", "cuda.scatter.nd", kernels=_reduce_kernels("scatter_nd"),
            supports=_scatter_supported)(enqueue_scatter_nd)
cuda_tactic("ScatterElements", "cuda.scatter.elements", kernels=_reduce_kernels("scatter_elements"),
            supports=_scatter_supported)(enqueue_scatter_elements)
cuda_tactic("MaxUnpool", "cuda.scatter.max_unpool", kernels=lambda layer: _sized("max_unpool") + _sized("zero"),
            supports=_plain)(enqueue_max_unpool)


def compile_variants() -> list[KernelSource]:
    """The one scatter.cu module (every kernel is an entry point in it)."""
    return [_src("gather_nd_4")]

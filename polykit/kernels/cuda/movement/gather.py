"""Gather / GatherElements / ai.polykit ConcatGather tactics (gather.cu), dtype-agnostic by element size.

ConcatGather runs concat_gather_table (32-bit index math, each output position's source and offset
looked up once per block into shared memory; a gather along the last axis as rows, no division per
element) where the positions fit TABLE_MAX_COLUMNS and every size 2^30, else concat_gather (one
thread per element, 64-bit index math, each index searched per element)."""

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
#: most output positions along the axis concat_gather_table takes (4 bytes of shared memory each)
TABLE_MAX_COLUMNS = 8192
#: sizes concat_gather_table indexes with 32-bit integers (every element count stays below 2^31
#: with a grid-stride step added)
TABLE_MAX_SIZE = 1 << 30
#: blocks an SM of concat_gather_table (each builds the table once, then strides over the rows)
TABLE_BLOCKS_PER_SM = 8


def _kernels(*prefixes):
    return lambda layer: [KernelSource(f"{prefix}_{es}", FILE) for prefix in prefixes for es in SIZES]


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


def concat_gather_table_launch(args: list, sm_count: int) -> tuple[str, tuple, tuple, list, int] | None:
    """(kernel suffix, grid, block, arguments, shared bytes) of concat_gather_table for
    concat_gather_args' `args`, or None where it does not apply (more than TABLE_MAX_COLUMNS
    positions, a size past TABLE_MAX_SIZE: concat_gather runs)."""
    idx, out, outer, m, inner = args[:5]
    sources, extents = args[5:5 + MAX_SOURCES], args[5 + MAX_SOURCES:]
    sizes = [out.size, *(x.size for x in sources if x)]
    if not 0 < m <= TABLE_MAX_COLUMNS or max(sizes) >= TABLE_MAX_SIZE or sum(extents) >= TABLE_MAX_SIZE:
        return None
    cap = max(1, sm_count) * TABLE_BLOCKS_PER_SM
    if inner == 1:
        rows_a_pass = max(1, BLOCK // m)
        grid = min(-(-outer // rows_a_pass), cap)
    else:
        grid = min(-(-out.size // BLOCK), cap)
    i32 = np.int32
    c_args = [idx, out, i32(outer), i32(m), i32(inner), *sources, *(i32(e) for e in extents)]
    return "concat_gather_table", (max(1, grid), 1, 1), (BLOCK, 1, 1), c_args, 4 * m


def enqueue_concat_gather(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    name, n, args = concat_gather_args(layer, tensors)
    if not n:
        return
    table = concat_gather_table_launch(args, launcher.sm_count)
    if table is not None:
        prefix, grid, block, c_args, smem = table
        launcher.launch(KernelSource(f"{prefix}_{name.rsplit('_', 1)[1]}", FILE), grid, block, c_args, smem)
    else:
        launcher.launch(KernelSource(name, FILE), grid_for(n), (BLOCK, 1, 1), args)


cuda_tactic("Gather", "cuda.gather", kernels=_kernels("gather"))(enqueue_gather)
cuda_tactic(CONCAT_GATHER, "cuda.gather.concat", domain=POLYKIT_DOMAIN,
            kernels=_kernels("concat_gather", "concat_gather_table"))(
    enqueue_concat_gather)
cuda_tactic("GatherElements", "cuda.gather.elements", kernels=_kernels("gather_elements"))(enqueue_gather_elements)


def compile_variants() -> list[KernelSource]:
    return _kernels("gather", "gather_elements", "concat_gather", "concat_gather_table")(None)

"""NonZero, Compress and Unique tactics (select.cu): ops whose output sizes depend on values.

The plan reserves each output's bound (polykit.compiler.ops.data_dims); the kernels decide the real
size, write it to the layer's count word (`tensors[count_slot(layer.name)]`, which the cuda
context provides and reads back after the layer: polykit.runtime.output_alloc) and lay the
output out for that size. Without a count word (a harness run of a known size) the outputs'
shapes give the sizes.

- NonZero: a one-block prefix count marks each non-zero element with its output column, then
  one thread per element writes its coordinates (int64 [rank, nnz], row-major order).
- Compress: the same prefix count over the condition (which may be shorter than the axis),
  then one thread per element copies the kept ones.
- Unique: O(n^2) comparisons of items (elements, or slices along `axis` compared
  lexicographically): the first occurrence and count of each item, the rank of each distinct
  item (ascending value order for sorted=1, first-occurrence order for sorted=0), then the
  outputs Y / indices / inverse_indices / counts (each optional).

Simple and correct over fast: one block for the prefix count and quadratic Unique are fine
for the sizes these ops see. Copies and zero tests work on raw elements of itemsize
1/2/4/8, so any such dtype works; Unique orders by value (floats and integers, bool as u8).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, Launcher, count_slot, cuda_tactic

FILE = "select.cu"
RAW = {1: "u8", 2: "u16", 4: "u32", 8: "u64"}
#: numpy dtype name -> typed (value-ordering) kernel code of Unique
ORDERED = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16", "int8": "i8", "uint8": "u8",
           "int16": "i16", "uint16": "u16", "int32": "i32", "uint32": "u32", "int64": "i64", "uint64": "u64",
           "bool": "u8"}
FLOATS = ("float16", "bfloat16", "float32", "float64")
#: dtypes whose zero test and copies work on raw bits
RAW_DTYPES = tuple(ORDERED)
FLAG_THREADS = 1024  # SF_THREADS in select.cu
BLOCK = 256
MAX_GRID = 1 << 16
MAX_RANK = 8


def _kernels(layer) -> list[KernelSource]:
    names = [f"select_{stage}_{r}" for r in RAW.values() for stage in ("flags", "compress")]
    names += [f"unique_emit_{r}" for r in RAW.values()]
    names += [f"unique_{stage}_{c}" for c in sorted(set(ORDERED.values())) for stage in ("match", "rank")]
    names += ["select_nonzero_emit", "unique_count"]
    return [KernelSource(n, FILE) for n in names]


def _supports(layer) -> bool:
    dtypes = getattr(layer, "in_dtypes", ())
    return not dtypes or all(d in RAW_DTYPES for d in dtypes if d)


def raw_code(dtype: np.dtype, where: str) -> str:
    """The raw element kernel code (u8/u16/u32/u64) of `dtype`."""
    if np.dtype(dtype).name not in RAW_DTYPES:
        raise DeviceError(f"no CUDA select kernel for dtype {dtype}", where=where, hint="use --target cpu")
    return RAW[np.dtype(dtype).itemsize]


def nonzero_mask(dtype: np.dtype) -> np.uint64:
    """Bits that make an element non-zero: all of them, less the sign bit of a float type
    (so -0.0 counts as zero and NaN as non-zero, like bool(x))."""
    bits = 8 * np.dtype(dtype).itemsize
    mask = (1 << bits) - 1
    if np.dtype(dtype).name in FLOATS:
        mask >>= 1
    return np.uint64(mask)


def grid(n: int) -> tuple[int, int, int]:
    return (max(1, min(-(-n // BLOCK), MAX_GRID)), 1, 1)


def axis_view(shape: tuple[int, ...], axis) -> tuple[int, int, int]:
    """(outer, n, inner) of a tensor seen as [outer, n, inner] around `axis` (None: flattened)."""
    if axis is None:
        return 1, int(np.prod(shape, dtype=np.int64)), 1
    axis = int(axis) % len(shape)
    return (int(np.prod(shape[:axis], dtype=np.int64)), int(shape[axis]),
            int(np.prod(shape[axis + 1:], dtype=np.int64)))


def _flags(launcher: Launcher, t: DeviceTensor, pos: int, where: str, total: DeviceTensor | None) -> None:
    launcher.launch(KernelSource(f"select_flags_{raw_code(t.dtype, where)}", FILE), (1, 1, 1), (FLAG_THREADS, 1, 1),
                    [t, t.size, nonzero_mask(t.dtype), pos, _or_null(total)])


def _or_null(t: DeviceTensor | None) -> DeviceTensor | int:
    """A kernel argument: the tensor, or a null pointer for an absent one."""
    return t if t is not None else 0


def _output(layer, tensors: Mapping[str, DeviceTensor], i: int) -> DeviceTensor | None:
    return tensors[layer.outputs[i]] if len(layer.outputs) > i and layer.outputs[i] else None


def enqueue_nonzero(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    where = f"layer {layer.name!r}"
    x, out = tensors[layer.inputs[0]], tensors[layer.outputs[0]]
    if len(x.shape) > MAX_RANK:
        raise DeviceError(f"NonZero of a rank-{len(x.shape)} tensor (at most {MAX_RANK})", where=where,
                          hint="use --target cpu")
    count = tensors.get(count_slot(layer.name))
    if x.size == 0 or (count is None and out.size == 0):  # no element, or a known count of 0 (the word is 0)
        return
    pos = launcher.workspace(x.size * 8)
    _flags(launcher, x, pos, where, count)
    dims = list(x.shape) + [1] * (MAX_RANK - len(x.shape))
    launcher.launch(KernelSource("select_nonzero_emit", FILE), grid(x.size), (BLOCK, 1, 1),
                    [pos, x.size, out.shape[1], _or_null(count), len(x.shape), *dims, out])


def enqueue_compress(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    where = f"layer {layer.name!r}"
    x, cond, y = tensors[layer.inputs[0]], tensors[layer.inputs[1]], tensors[layer.outputs[0]]
    axis = layer.attrs.get("axis")
    _, n, inner = axis_view(x.shape, axis)
    if cond.size > n:
        raise DeviceError(f"condition has {cond.size} entries for an axis of {n}", where=where,
                          hint="the condition may not be longer than the axis")
    count = tensors.get(count_slot(layer.name))
    if cond.size == 0 or (count is None and y.size == 0):
        return
    m = y.shape[0] if axis is None else y.shape[int(axis) % len(x.shape)]
    pos = launcher.workspace(cond.size * 8)
    _flags(launcher, cond, pos, where, count)
    launcher.launch(KernelSource(f"select_compress_{raw_code(x.dtype, where)}", FILE), grid(x.size), (BLOCK, 1, 1),
                    [x, y, pos, x.size, n, cond.size, inner, m, _or_null(count)])


def enqueue_unique(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    where = f"layer {layer.name!r}"
    x = tensors[layer.inputs[0]]
    y, indices, inverse, counts = (_output(layer, tensors, i) for i in range(4))
    code = ORDERED.get(x.dtype.name)
    if code is None:
        raise DeviceError(f"Unique has no CUDA kernel for dtype {x.dtype}", where=where, hint="use --target cpu")
    axis = layer.attrs.get("axis")
    outer, n, inner = axis_view(x.shape, axis)
    if n == 0:
        return
    if y is not None:
        u = y.shape[0] if axis is None else y.shape[int(axis) % len(x.shape)]
    else:
        u = indices.shape[0] if indices is not None else counts.shape[0] if counts is not None else 0
    first = launcher.workspace(3 * n * 8)  # first, count, rank: one workspace, carved
    count, rank = first + n * 8, first + 2 * n * 8
    sorted_ = int(bool(layer.attrs.get("sorted", 1)))
    nan_equal = int(axis is None or len(x.shape) == 1)  # numpy: NaN slices of an N-D tensor stay distinct
    launcher.launch(KernelSource(f"unique_match_{code}", FILE), grid(n), (BLOCK, 1, 1),
                    [x, n, outer, inner, nan_equal, first, count])
    launcher.launch(KernelSource(f"unique_rank_{code}", FILE), grid(n), (BLOCK, 1, 1),
                    [x, n, outer, inner, nan_equal, sorted_, first, rank])
    live = tensors.get(count_slot(layer.name))
    if live is not None:
        launcher.launch(KernelSource("unique_count", FILE), (1, 1, 1), (1, 1, 1), [first, n, live])
    launcher.launch(KernelSource(f"unique_emit_{RAW[x.dtype.itemsize]}", FILE), grid(max(x.size, n)), (BLOCK, 1, 1),
                    [x, _or_null(y), first, count, rank, n, inner, x.size, u, _or_null(live),
                     *(_or_null(t) for t in (indices, inverse, counts))])


cuda_tactic("NonZero", "cuda.select.nonzero", kernels=_kernels, supports=_supports)(enqueue_nonzero)
cuda_tactic("Compress", "cuda.select.compress", kernels=_kernels, supports=_supports)(enqueue_compress)
cuda_tactic("Unique", "cuda.select.unique", kernels=_kernels, supports=_supports)(enqueue_unique)


def compile_variants() -> list[KernelSource]:
    """The one select.cu module (every entry point of every dtype lives in it)."""
    return _kernels(None)

"""Reduce* over one run of adjacent axes (reduce.cu's reduce_rows / reduce_cols): tactics cuda.reduce.span(.split).

The input is viewed as [O, R, I]: O the kept axes before the run, R the reduced ones, I the kept
axes after it. I == 1 (a reduction of the last axes: BERT's ReduceMean) runs one warp per row;
I > 1 (ResNet's global average pool in NHWC: axes (1, 2) of (N, H, W, C)) runs threads along I
with the rows split over a second block dimension and summed in a fixed tree. Both load 16
bytes a thread when the sizes and pointers allow it. Tactic cuda.reduce.span.split, timed
against it, cuts R of a column span whose grid is short (few outputs over long columns: the
squeeze-excitation pool [N, H*W, C] of EfficientNet's first stages) into chunks over grid z:
each block stores fp32 (fp64 for bf16 and 64-bit types) partials to the workspace, and a second
kernel joins them in chunk order and finishes (deterministic: the split is shape-only).

The view comes from the input and output shapes, not from the axes tensor (which lives on the
device): with keepdims the reduced axes are those the output shrinks to 1 (a size-1 axis reduced
or not is the same reduction); without keepdims, every way of dropping axes of the input that
leaves the output's shape must give the same view, or the layer runs reduce.cu's general kernel
(cuda.reduce's enqueue), as do LogSumExp and shapes no single run covers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from itertools import combinations
from typing import Mapping, Sequence

import numpy as np

from polykit.kernels.cuda.base import DeviceTensor, KernelSource, Launcher, cuda_tactic
from polykit.kernels.cuda.launch_geometry import grid_for
from polykit.kernels.cuda.reduce.reduce import FILE, OPS, REDUCE_DTYPES, dtype_code, enqueue_reduce, unit
from polykit.kernels.cuda.storage_types import CODE

#: threads a block (both kernels)
BLOCK = 256
#: rows a block of reduce_rows (one warp each)
ROWS_PER_BLOCK = BLOCK // 32
#: reduce_cols halves its threads along I (doubling those along R) until its grid has this many blocks
TARGET_BLOCKS = 1024
#: a row this long with fewer rows than this goes to the general kernel (a block per row)
LONG_ROW, FEW_ROWS = 4096, 1024
MAX_GRID_Y = 65535
#: rows each thread of a split reduce_cols reduces at least
SPLIT_ROWS = 8
#: bytes of reduce.cu's accumulator (Acc<T>) by dtype code: float for f32/f16, 64 bits otherwise
ACC_BYTES = {"f32": 4, "f16": 4, "bf16": 8, "f64": 8, "i32": 8, "i64": 8, "b8": 8}


@dataclass(frozen=True)
class Span:
    """x viewed as [outer, reduced, inner] (the reduced axes one contiguous run)."""

    outer: int
    reduced: int
    inner: int


def _span_of(shape: Sequence[int], reduced: set[int]) -> Span | None:
    """The [O, R, I] view when the reduced axes of size > 1 are adjacent among the axes of size > 1."""
    big = [k for k, d in enumerate(shape) if d > 1]
    marks = [k in reduced for k in big]
    first = marks.index(True) if True in marks else len(marks)
    last = len(marks) - marks[::-1].index(True) if True in marks else len(marks)
    if not all(marks[first:last]):
        return None
    dims = [shape[k] for k in big]
    return Span(math.prod(dims[:first]), math.prod(dims[first:last]), math.prod(dims[last:]))


@lru_cache(maxsize=256)
def span_geometry(x_shape: tuple[int, ...], y_shape: tuple[int, ...]) -> Span | None:
    """The one [O, R, I] view that reduces `x_shape` to `y_shape`, or None (ambiguous, or not a run)."""
    rank = len(x_shape)
    if 0 in x_shape or len(y_shape) > rank:
        return None
    if len(y_shape) == rank:
        if any(y not in (x, 1) for x, y in zip(x_shape, y_shape)):
            return None
        return _span_of(x_shape, {k for k in range(rank) if y_shape[k] != x_shape[k]})
    views = set()
    for dropped in combinations(range(rank), rank - len(y_shape)):
        if tuple(d for k, d in enumerate(x_shape) if k not in dropped) == tuple(y_shape):
            views.add(_span_of(x_shape, set(dropped)))
    return views.pop() if len(views) == 1 else None


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def cols_block(span: Span, vec: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(grid, block) of reduce_cols: `vec` elements a thread along I; fewer threads along I and
    more along R while the grid is small (shape-only: the same sizes give the same sum order)."""
    lanes = -(-span.inner // vec)
    tx = min(32, _pow2_at_least(lanes))
    ty = min(_pow2_at_least(span.reduced), BLOCK // tx)
    while tx > 8 and ty < _pow2_at_least(span.reduced) and -(-lanes // tx) * span.outer < TARGET_BLOCKS:
        tx, ty = tx // 2, ty * 2
    tz = max(1, min(BLOCK // (tx * ty), span.outer))
    grid = (-(-lanes // tx), min(-(-span.outer // tz), MAX_GRID_Y), 1)
    return grid, (tx, ty, tz)


def _wide(x: DeviceTensor, y: DeviceTensor, run: int) -> int:
    """1 when 16-byte loads fit: `run` (contiguous elements per row) a multiple of 16 bytes' worth,
    x and y 16-byte aligned."""
    per = 16 // x.dtype.itemsize if x.dtype.itemsize <= 16 else 0
    return int(per > 0 and run % per == 0 and x.ptr % 16 == 0 and y.ptr % 16 == 0)


def _takes(kind: str, x_shape, y_shape) -> Span | None:
    span = span_geometry(tuple(x_shape), tuple(y_shape)) if kind != "ReduceLogSumExp" else None
    if span is None or (span.inner == 1 and span.reduced > LONG_ROW and span.outer < FEW_ROWS):
        return None
    return span


def supports(layer) -> bool:
    shapes, outs = getattr(layer, "in_shapes", ()), getattr(layer, "out_shapes", ())
    return bool(shapes and outs) and _takes(layer.kind, shapes[0], outs[0]) is not None


def enqueue_span(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    x, y = tensors[layer.inputs[0]], tensors[layer.outputs[0]]
    span = _takes(layer.kind, x.shape, y.shape) if y.size else None
    if span is None:  # shapes of this run that no single span covers: the general kernel
        enqueue_reduce(layer, launcher, tensors)
        return
    where, op = f"layer {layer.name!r}", OPS[layer.kind]
    code = dtype_code("reduce", x, REDUCE_DTYPES, where)
    if span.inner == 1:
        vec = _wide(x, y, span.reduced)
        grid = (min(-(-span.outer // ROWS_PER_BLOCK), 1 << 20), 1, 1)
        launcher.launch(KernelSource(f"reduce_rows_{code}", FILE, defines=unit(code)), grid, (BLOCK, 1, 1),
                        [x, y, op, span.outer, span.reduced, vec])
        return
    vec, grid, block, shared = _cols_launch(x, y, span, code)
    launcher.launch(KernelSource(f"reduce_cols_{code}", FILE, defines=unit(code)), grid, block,
                    [x, y, op, span.outer, span.reduced, span.inner, vec], shared_mem=shared)


def _cols_launch(x: DeviceTensor, y: DeviceTensor, span: Span, code: str):
    """(vec, grid, block, shared bytes) of reduce_cols for these tensors."""
    vec = _wide(x, y, span.inner)
    per = 16 // x.dtype.itemsize if vec else 1
    grid, block = cols_block(span, per)
    return vec, grid, block, math.prod(block) * per * ACC_BYTES[code]


def cols_split(span: Span, grid: Sequence[int], block: Sequence[int]) -> tuple[int, int]:
    """(S, chunk): reduce_cols' R cut into S chunks of `chunk` rows, one a block along grid z,
    while its grid has fewer than TARGET_BLOCKS blocks and each thread keeps at least
    SPLIT_ROWS rows (shape-only, like cols_block); (1, R) where no split helps."""
    splits = min(-(-TARGET_BLOCKS // (grid[0] * grid[1])), span.reduced // (block[1] * SPLIT_ROWS), MAX_GRID_Y)
    if splits <= 1:
        return 1, span.reduced
    chunk = -(-span.reduced // splits)
    return -(-span.reduced // chunk), chunk


def _split_of(kind: str, x: DeviceTensor, y: DeviceTensor):
    """(span, code, vec, grid, block, shared, S, chunk) of a split column reduction, or None."""
    span = _takes(kind, x.shape, y.shape) if y.size else None
    code = CODE.get(x.dtype.name)
    if span is None or span.inner == 1 or code not in REDUCE_DTYPES:
        return None
    vec, grid, block, shared = _cols_launch(x, y, span, code)
    splits, chunk = cols_split(span, grid, block)
    return (span, code, vec, grid, block, shared, splits, chunk) if splits > 1 else None


def split_workspace(layer, tensors, sm_count: int) -> int:
    """The split's fp32/fp64 partials (S * O * I accumulators) at the layer's shapes, the most
    of an aligned (16-byte loads) and a misaligned input (their grids, so their S, differ)."""
    try:
        x, y = (tensors[n] for n in (layer.inputs[0], layer.outputs[0]))
        ty = DeviceTensor(0, tuple(y.shape), np.dtype(y.dtype))
        plans = [_split_of(layer.kind, DeviceTensor(ptr, tuple(x.shape), np.dtype(x.dtype)), ty) for ptr in (0, 1)]
    except (KeyError, IndexError, TypeError):
        return 0
    return max([p[-2] * p[0].outer * p[0].inner * ACC_BYTES[p[1]] for p in plans if p is not None], default=0)


def supports_split(layer) -> bool:
    """A column span (I > 1) whose grid is short enough for R to be split."""
    if not supports(layer) or not getattr(layer, "in_dtypes", ()):
        return False
    x = DeviceTensor(0, tuple(layer.in_shapes[0]), np.dtype(layer.in_dtypes[0]))
    y = DeviceTensor(0, tuple(layer.out_shapes[0]), np.dtype(layer.in_dtypes[0]))
    return _split_of(layer.kind, x, y) is not None


def enqueue_split(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    x, y = tensors[layer.inputs[0]], tensors[layer.outputs[0]]
    plan = _split_of(layer.kind, x, y)
    if plan is None:  # rows, a grid already full, or no span: the span (or general) kernel
        enqueue_span(layer, launcher, tensors)
        return
    span, code, vec, grid, block, shared, splits, chunk = plan
    op, n = OPS[layer.kind], span.outer * span.inner
    part = launcher.workspace(splits * n * ACC_BYTES[code])
    launcher.launch(KernelSource(f"reduce_cols_part_{code}", FILE, defines=unit(code)), (grid[0], grid[1], splits),
                    block, [x, part, op, span.outer, span.reduced, span.inner, vec, chunk], shared_mem=shared)
    launcher.launch(KernelSource(f"reduce_cols_join_{code}", FILE, defines=unit(code)), grid_for(n), (BLOCK, 1, 1),
                    [part, y, op, n, span.reduced, splits])


def _span_kernels(layer) -> list[KernelSource]:
    return [KernelSource(f"reduce_{c}", FILE, defines=unit(c)) for c in REDUCE_DTYPES]


for _kind in OPS:
    cuda_tactic(_kind, "cuda.reduce.span", kernels=_span_kernels, supports=supports, priority=5)(enqueue_span)
    # where no split helps (a profile corner with a full grid) enqueue_split runs the span kernel: it serves
    # every shape the span does, so a profile over image sizes keeps it (tuner.serves_corners)
    cuda_tactic(_kind, "cuda.reduce.span.split", kernels=_span_kernels, supports=supports_split, priority=6,
                workspace=split_workspace, serves=supports)(enqueue_split)


def compile_variants() -> list[KernelSource]:
    """The span entry points (in reduce.cu's per-dtype units, compiled once with the general kernel)."""
    return [KernelSource(f"reduce_{k}_{c}", FILE, defines=unit(c))
            for k in ("rows", "cols", "cols_part", "cols_join") for c in REDUCE_DTYPES]

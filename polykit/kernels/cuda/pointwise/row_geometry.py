"""Host geometry of the pointwise row-broadcast kernel (`_r`, pointwise_codegen; tactic
cuda.pointwise.rows in pointwise_rows.py): the iteration space collapsed to [A, B, I], the
vector width a launch may use, its grid and block, and whether a stamped layer's shapes take it
(the generator emits the `_r` entry only for such layers: it costs compile time)."""

from __future__ import annotations

import math
from typing import Sequence

from polykit.kernels.cuda.base import DeviceTensor
from polykit.compiler.ops.nn.concat_operands import concat_shape
from polykit.kernels.cuda.launch_geometry import BLOCK, broadcast_geometry
from polykit.kernels.cuda.pointwise.pointwise_concat import logical_stamps, vector_aligned
from polykit.kernels.cuda.storage_types import LOWP

#: elements per thread of the row kernel's vector loads (16 bytes of fp16/bf16)
ROW_VEC = 8

MAX_GRID_YZ = 65535
#: threads a block spend along I at most while rows are plenty (the rest go along B)
MAX_TX = 32


def rows_geometry(shapes: Sequence[Sequence[int]], n_out: int):
    """([A, B, I], per input (sa, sb, si)) of the row kernel for these shapes (inputs then
    outputs), or None: more than three dims after collapsing, an output smaller than the
    iteration space, or an empty one."""
    n, dims, strides, zm = broadcast_geometry([tuple(s) for s in shapes], n_out)
    if n == 0 or len(dims) > 3 or any(zm):
        return None
    pad = 3 - len(dims)
    per = [tuple([0] * pad + list(st)) for st in strides[:len(shapes) - n_out]]
    if any(p[2] not in (0, 1) for p in per):
        return None
    return [1] * pad + list(dims), per


def _all_full(shapes: Sequence[Sequence[int]], n_out: int) -> bool:
    """Every input the outputs' shape or a single value: cuda.pointwise's vector kernel's case."""
    out = tuple(shapes[-1]) if n_out else ()
    return all(tuple(s) == out or math.prod(s) == 1 for s in shapes)


def takes(shapes: Sequence[Sequence[int]], n_out: int) -> bool:
    """True for a broadcast (not all-full) space the row kernel covers."""
    return not _all_full(shapes, n_out) and rows_geometry(shapes, n_out) is not None


def rows_vec(dims: Sequence[int], per, x: Sequence[DeviceTensor], y: Sequence[DeviceTensor]) -> int:
    """1 when every thread may load ROW_VEC elements: I a multiple of it, every pointer aligned to
    ROW_VEC elements and the row strides of inputs contiguous along I multiples of it."""
    if dims[2] % ROW_VEC:
        return 0
    for t, (sa, sb, si) in zip(x, per):
        if si and (not vector_aligned(t, ROW_VEC) or sa % ROW_VEC or sb % ROW_VEC):
            return 0
    return int(all(t.ptr % (ROW_VEC * t.dtype.itemsize) == 0 for t in y))


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def rows_launch(dims: Sequence[int], vec: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(grid, block): threads along I's chunks (at most MAX_TX while that wastes under an eighth
    of a row, more when rows are few), the rest of the BLOCK along B, blocks along A."""
    a, b, i = dims
    chunks = -(-i // (ROW_VEC if vec else 1))
    tx = min(MAX_TX, _pow2_at_least(chunks))
    while tx > 1 and (-(-chunks // tx) * tx - chunks) * 8 > chunks:
        tx //= 2
    ty = min(BLOCK // tx, _pow2_at_least(b))
    tx = max(tx, min(BLOCK // ty, _pow2_at_least(chunks)))
    grid = (-(-chunks // tx), min(-(-b // ty), MAX_GRID_YZ), min(a, MAX_GRID_YZ))
    return grid, (tx, ty, 1)


def stamped_takes(layer) -> bool:
    """Stamped shapes that broadcast by rows, no low-precision storage, no view operand (the row
    kernel reads every input plainly: pass absorb_views' layers run cuda.pointwise's view entries)."""
    if layer.attrs.get("view"):
        return False
    shapes = [s for n, s in zip(layer.inputs, getattr(layer, "in_shapes", ())) if n]
    outs = list(getattr(layer, "out_shapes", ()))
    dtypes = tuple(getattr(layer, "in_dtypes", ())) + tuple(getattr(layer, "out_dtypes", ()))
    if not outs or len(shapes) != len([n for n in layer.inputs if n]) or any(d in LOWP for d in dtypes):
        return False
    if layer.attrs.get("concat"):  # a concatenated operand has the shape of its sources' concatenation
        shapes = logical_stamps(layer, shapes, lambda axis, ss: concat_shape(ss, axis))
    return takes(shapes + outs, len(outs))

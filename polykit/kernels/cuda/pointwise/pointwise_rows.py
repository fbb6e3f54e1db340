"""Tactic `cuda.pointwise.rows`: an elementwise op (or fused Pointwise body) whose operands
broadcast by rows, run as the generated module's row kernel (`_r`, pointwise_codegen).

The broadcast iteration space collapses (launch_geometry.broadcast_geometry) to at most three
dims [A, B, I]: squeeze-excitation's scale x[N, H, W, C] * s[N, 1, 1, C] is [N, H*W, C] with s
broadcast along B; a bias row [R, C] + [1, C] is [1, R, C]; NCHW's x[N, C, H, W] * s[N, C, 1, 1]
is [1, N*C, H*W] with s broadcast along I. Each thread then owns 8 consecutive elements of I
(16-byte loads of fp16) and finds its offsets by a multiply-add per row, where the strided
kernel divides by every dim for every element. The tuner times it against cuda.pointwise; a
launch whose pointers or sizes do not fit (a fourth dim, an output smaller than the space)
runs cuda.pointwise's kernels instead.
"""

from __future__ import annotations

from typing import Mapping

from polykit.kernels.cuda.base import DeviceTensor, Launcher
from polykit.kernels.cuda.pointwise.pointwise import enqueue_pointwise, layer_tensors, register_pointwise
from polykit.kernels.cuda.pointwise.row_geometry import rows_geometry, rows_launch, rows_vec, stamped_takes
from polykit.kernels.cuda.storage_types import LOWP


def enqueue_rows(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    x, y, (_, _, k_r) = layer_tensors(layer, tensors)
    shapes = [t.shape for t in x + y]
    lowp = any(t.dtype.name in LOWP for t in x + y)
    geo = rows_geometry(shapes, len(y)) if y and k_r is not None and not lowp else None
    if geo is None:
        enqueue_pointwise(layer, launcher, tensors)
        return
    dims, per = geo
    vec = rows_vec(dims, per, x, y)
    grid, block = rows_launch(dims, vec)
    launcher.launch(k_r, grid, block, [*x, *y, *dims, *[s for p in per for s in p], vec])


#: above cuda.pointwise: level 0 (nothing timed) takes it, the others time it first
register_pointwise("cuda.pointwise.rows", enqueue_rows, stamped_takes, priority=1)


def compile_variants():
    """None of its own: the row kernels are entry points of cuda.pointwise's modules, whose
    compile_variants compile them."""
    return []

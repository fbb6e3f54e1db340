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
from polykit.kernels.cuda.pointwise.pointwise import launch_strided_or_vector, layer_tensors, register_pointwise
from polykit.kernels.cuda.pointwise.pointwise_codegen import pointwise_kernels
from polykit.kernels.cuda.pointwise.pointwise_concat import pointer_args, table_args
from polykit.kernels.cuda.pointwise.row_geometry import rows_geometry, rows_launch, rows_vec, stamped_takes, takes
from polykit.kernels.cuda.storage_types import LOWP


def enqueue_rows(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    x, y, (k_s, k_v, k_r) = layer_tensors(layer, tensors, rows=True)
    shapes = [t.shape for t in x + y]
    lowp = any(t.dtype.name in LOWP for t in x + y)
    plain = not layer.attrs.get("view")  # a view operand (pass absorb_views): the view module's entries only
    geo = rows_geometry(shapes, len(y)) if y and not lowp and plain and takes(shapes, len(y)) else None
    if geo is None:  # no row broadcast here: the row module's own strided and vector entries
        launch_strided_or_vector(layer, launcher, x, y, k_s, k_v)
        return
    dims, per = geo
    vec = rows_vec(dims, per, x, y)
    grid, block = rows_launch(dims, vec)
    launcher.launch(k_r, grid, block, [*pointer_args(x), *y, *dims, *[s for p in per for s in p], vec, *table_args(x)])


#: above cuda.pointwise: level 0 (nothing timed) takes it, the others time it first; where no row
#: broadcast is left (a profile corner of batch 1) its enqueue runs the plain entries, so a
#: dynamic plan keeps it for a layer whose opt shape broadcasts rows (BERT's embeddings Add)
register_pointwise("cuda.pointwise.rows", enqueue_rows, stamped_takes, priority=1,
                   kernels=lambda layer: pointwise_kernels(layer, rows=True), falls_back=True)


def compile_variants():
    """None of its own: cuda.pointwise's compile_variants compile the row modules too."""
    return []

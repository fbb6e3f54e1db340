"""Channels-last convolution family: ai.polykit ConvNHWC (docs/FUSION.md, "Channels last") as
implicit GEMM (conv_nhwc.cu) on the shared GEMM main loops, with conv.py's argument building,
split-K launch and epilogue.

Tactics, kind "ConvNHWC" (first supporting one wins; the builder may time them):
  cuda.conv_nhwc.igemm_mma   precision fp16, group 1: mma.sync m16n8k16, fp32 accumulate
  cuda.conv_nhwc.igemm_simt_wide  any ConvNHWC: fp32 FMA 128x128 tiles, 8x8 outputs a thread
  cuda.conv_nhwc.igemm_simt  any ConvNHWC: fp32 FMA 64x64 tiles (groups on grid z)
These are the simple, correct baseline: they load one element at a time like the NCHW kernels;
vectorized loads over the channel axis (C % 8 == 0 from to_channels_last) are for tactics to come.
Each stores Y one element at a time, a pixel's row LDY elements after the last, and loads X's pixels
LDX elements apart (runtime arguments): so each can write its output into a channels-last Concat's
slice (places_last_axis) and read an input placed in one (reads_last_axis: a skip connection).
All three store a ConvNHWC with depth_to_space (D2S_H / D2S_W variants: each element at its
rearranged address), the up-convolutions of a UNet included, still placeable in a Concat.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from polykit.kernels.cuda.base import KernelSource, cuda_tactic, defines, places_last_axis, reads_last_axis, stored_as
from polykit.kernels.cuda.conv.conv import enqueue_igemm, group_of, igemm_problem, layer_variants, variants
from polykit.kernels.cuda.gemm.epilogue import supports_epilogue
from polykit.kernels.cuda.gemm.gemm import STORED, tile_params, tiled_workspace

FILE = "conv_nhwc.cu"
REDUCE = "conv_nhwc_splitk_reduce"
KERNELS = ("conv_nhwc_igemm_simt", "conv_nhwc_igemm_simt_wide", "conv_nhwc_igemm_mma", REDUCE)


def compile_variants() -> list[KernelSource]:
    """Every kernel for each storage dtype, plain and storing 2x2 depth-to-space."""
    plain = [v for k in KERNELS for v in variants(k, FILE)]
    return plain + [replace(v, defines=v.defines + defines(D2S_H=2, D2S_W=2)) for v in plain]


def _mma(layer: Any) -> bool:
    return supports_epilogue(layer) and layer.precision == "fp16" and group_of(layer) == 1


for _kernel, _priority, _supports in (("conv_nhwc_igemm_mma", 10, _mma), ("conv_nhwc_igemm_simt", 5, supports_epilogue),
                                      ("conv_nhwc_igemm_simt_wide", 4, supports_epilogue)):
    cuda_tactic("ConvNHWC", f"cuda.conv_nhwc.{_kernel.split('_', 2)[2]}", kernels=layer_variants(_kernel, FILE),
                priority=_priority, conservative=_kernel == "conv_nhwc_igemm_simt", supports=stored_as(*STORED, then=_supports), params=tile_params(_kernel),
                workspace=tiled_workspace(_kernel, igemm_problem), places=places_last_axis,
                reads_placed=reads_last_axis, depth_to_space=True)(
        enqueue_igemm(_kernel, REDUCE, FILE, row_stride=True))

"""Dense convolution with few channels, channels last, on the halo-tile tensor-core kernel:
ai.polykit ConvNHWC with group 1, C and M multiples of 8 and at most MAX_CHANNELS each,
float16 / bfloat16 storage, on conv_grouped_mma_pipe.cu as a grouped conv of one group: a block
stages its input tile + halo once in shared memory (16-byte cp.async, the W-stride phase layout)
and the weights of its CB output channels, and feeds mma.sync m16n8k16 from ldmatrix fragments at
each tap's offset, where the sm90 implicit GEMM (conv_sm90.py) gathers an im2col A operand (every
input pixel read KH * KW times) and pads N to 32. Bias and the layer's epilogue fused.

Tactics, kind "ConvNHWC", priority HALO_PRIORITY, below every tactic a level-0 build takes for
fp16 layers (the sm90 tiles' 30 on sm_90, igemm_mma's 10 on other GPUs and in builds without
one): they have run on a GPU (72 gpu tests, H200 2026-12-06) but been timed on two shapes only, so an
untimed fp16 build keeps the tiles it took before (a bf16 dense conv, which no other cuda conv
takes, gets them at any level); the tuner times them
as a family past its cap (level 3 on sm_90: four sm90 tiles, igemm_mma and the first of these):
  cuda.conv_nhwc.halo_mma_persist_p32  conv_grouped_mma.PERSIST's kernel and plan: blocks loop over
                                       the tiles of every image, the weights staged once a block,
                                       the next window in flight
  cuda.conv_nhwc.halo_mma_pipe_p32     PIPE's: a tile a block, the window in commit groups by
                                       kernel row
PERSIST is declared first: their estimates tie (latency is not modelled), and it is the one that
stages a dense layer's weights (KH*KW*C a channel) once a block rather than once a tile.
Both write into a channels-last Concat's slice (places_last_axis; gm_store's LDY, as the grouped
tactics): UNet's skip convs on them leave the skip Concat nothing to copy (issue 29).
The plan, tile choice and roofline are conv_grouped_mma's (plan_mma, tile_cost, predict) on the
window of one group (halo_window): a block's slice is M or a divisor of it (never past M), and its
reads are whole pixels (sector_factor 1). MAX_CHANNELS is where the shared-memory plan ends: a
slice's weights (CB rows of KH*KW*C + 8 elements) and its window must fit MMA_SMEM_LIMIT. At 96
channels a 3 x 3 layer still gets 4-warp tiles (16x8x32 PIPE, 8x8x32 PERSIST; [8,128,128,96] ->
96: 36 us predicted, the sm90 tile's estimate 76 us); at 128 only a one-warp 8x4x32 PIPE tile fits
(146 us predicted against 96 us) and no PERSIST one. Within the limit, a wide kernel can still
miss: 5 x 5 with 64 -> 64 channels (its smallest slice, 32 channels, holds 103 KB of weights) is
refused by tile_supports.

`predict` at H100 rates (HBM 3.3 TB/s, L2 -> SM 10 TB/s, mma.sync 600 TFLOP/s, 132 SMs; tile
TH x TW x CB, threads, blocks, shared memory; GFLOP of the launched MMAs, DRAM MB (X, W, Y once),
MB staged from L2; us the largest at those rates, latency not modelled) against what the brief
of issue 29 measured on an H100 on 2026-12-05 (fp16; the sm90 tile the tuner chose, and cuDNN):
  layer                        variant  tile      thr blocks  smem | GFLOP  DRAM staged    us | measured
  EffNetV2-S 24->24 3x3        pipe     16x16x24  256   4608 26.1K |  12.7 113.3  119.4  34.3 | sm90_128x32
    [32,192,192,24]            persist  16x16x24  256    256 41.2K |  12.7 113.3   74.3  34.3 | 296.6, cuDNN 218.9
  EffNetV2-S stem 8->24 3x3/2  pipe     16x16x24  256   4608 21.7K |   4.5 132.1   96.2  40.0 |
    [32,384,384,8]             persist  16x16x24  256    256 39.2K |   4.5 132.1   81.2  40.0 |
  UNet 32->32 3x3              pipe     16x16x32  256   8192 43.8K |  38.7 268.5  320.9  81.3 | sm90_64x32x2
    [8,512,512,32]             persist  16x16x32  256    256 69.1K |  38.7 268.5  174.6  81.3 | 730, 470 (two)
  UNet 64->32 3x3              pipe     16x16x32  256   8192 82.1K |  77.3 402.7  641.7 128.8 |
    [8,512,512,64]             persist  16x8x32   128    261 87.1K |  77.3 402.7  387.1 128.8 |
  UNet 32->64 3x3              pipe     16x16x32  256  16384 43.8K |  77.3 402.7  641.7 128.8 |
    [8,512,512,32]             persist  16x8x64   256    261 65.1K |  77.3 402.7  198.4 128.8 |
The first three are DRAM-bound at these rates, the two 64-channel ones MMA-bound (77 GFLOP at
600 TFLOP/s: 129 us; DRAM 122 us). The measured sm90 times are 6 to 9x the roofline (its im2col
re-reads and latency); latency is what PERSIST's loop over tiles attacks. Which variant wins, and
whether either beats the sm90 tile, is for the tuner to time on the GPU.
Measured (2026-12-06, H200, fp16; docs/CUDA_NOTES.md): the 24 -> 24 conv + SiLU 206.5 us (pipe) / 210.2
(persist) against the sm90_128x32 tile's 295.9 and cuDNN's 247.3; UNet's 32 -> 32 425.5 / 431.9 against
sm90_64x32x2's 463.4 and cuDNN's 370.0: faster than the sm90 tiles, still 5-6x the roofline above.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping, Sequence

from polykit.kernels.cuda.base import KernelSource, cuda_tactic, places_last_axis
from polykit.kernels.cuda.conv.conv_depthwise import epilogue_layers, tile_enqueue, tile_supports
from polykit.kernels.cuda.conv.conv_grouped import GroupedWindow, conv_window
from polykit.kernels.cuda.conv.conv_grouped_mma import (ELEMS, MMA_SMEM_LIMIT, PERSIST, PIPE, WARP_N8, estimate_of,
                                                        kernel_source, kernels_of, launch_of, plan_of, smallest_smem)

#: the most input and output channels a layer may have (each a multiple of 8)
MAX_CHANNELS = 96
#: below conv_sm90's tiles (30) and conv_nhwc's igemm_mma (10), above igemm_simt (5): timed on two shapes so far
HALO_PRIORITY = 9
#: the kernel variants (conv_grouped_mma's), each under its own tactic name; PERSIST first
VARIANTS = (PERSIST, PIPE)


def halo_window(attrs: Mapping[str, Any], x: Sequence[Any], w: Sequence[Any]) -> GroupedWindow | None:
    """The window of a dense ConvNHWC (group 1) with multiples of 8 input and output channels, at
    most MAX_CHANNELS each, as one group; else None."""
    win = conv_window(attrs, x, w)
    if win is None or win.G != 1 or win.C % 8 or win.M % 8 or max(win.C, win.M) > MAX_CHANNELS:
        return None
    return win


def tactic_name(variant: Any) -> str:
    """cuda.conv_nhwc.halo_mma_<pipe|persist>_p32 for conv_grouped_mma's PIPE / PERSIST."""
    return replace(variant, family=variant.family.replace("grouped", "halo", 1)).name


#: SiLU then a residual (EfficientNet's fused MBConv): raw * sigmoid(raw) + skip
SILU_RESIDUAL = [{"op": "Sigmoid", "inputs": ["raw"], "outputs": ["s"], "attrs": {}},
                 {"op": "Mul", "inputs": ["raw", "s"], "outputs": ["t"], "attrs": {}},
                 {"op": "Add", "inputs": ["t", "skip"], "outputs": ["y"], "attrs": {}}]


def compile_variants() -> list[KernelSource]:
    """What group 1 adds to conv_grouped_mma's variants (the same kernels and defines without an
    epilogue): a dense layer's SiLU + residual epilogue for each variant, storage and n8 count,
    with its shapes (16-byte epilogue loads) at odd n8 counts and without (strided) at even ones."""
    layers = epilogue_layers(1, (1, 8, 8, 24), (24, 3, 3, 24), SILU_RESIDUAL)
    return [kernel_source(layers[1 - nb % 2], e, nb, v) for v in VARIANTS for e in ELEMS.values() for nb in WARP_N8]


for _variant in VARIANTS:
    cuda_tactic("ConvNHWC", tactic_name(_variant), kernels=kernels_of(_variant, halo_window),
                supports=tile_supports(halo_window, smallest_smem, MMA_SMEM_LIMIT)(_variant),
                priority=HALO_PRIORITY, estimate=estimate_of(_variant, halo_window), places=places_last_axis,
                params={"p": _variant.p, "threads": _variant.threads, "min_blocks": _variant.min_blocks,
                        "smem_limit": MMA_SMEM_LIMIT, "max_channels": MAX_CHANNELS})(
        tile_enqueue("dense halo-tile tensor-core", plan_of(_variant, halo_window), launch_of(_variant),
                     row_stride=True))

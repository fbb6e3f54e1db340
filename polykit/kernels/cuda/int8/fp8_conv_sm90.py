"""FP8 implicit-GEMM convolutions with a stage promoted in pieces: conv_sm90.cu's `conv_sm90` with F8 1 and
F8_PIECES (docs/INT8.md "FP8 conv tiles with the promotion in pieces").

Tactics `cuda.fp8.conv_sm90_<BM>x<BN>` (kind QConvNHWC, compute capability 9.0) take every layer fp8_sm90.py's
tiles take (3x3, strided, padded convs, the 7x7 stem with its channels padded to 16, 1x1 convs; e4m3 X and W,
float32 / e4m3 / float16 outputs, float32 / e4m3 / float16 residuals) on the same kernel (TMA weights, cp.async
im2col rows by the producer warpgroup, int8_out.cuh's output stage) with fp8_gemm_sm90.py's K loop
(gemm_sm90_core.cuh mainloop_f8_pieces): each stage's columns in `pieces` pieces of four k32 wgmma, each into a
fresh register block the CUDA cores add to the fp32 accumulators (one stage's products a block: fp8_sm90's
numerics and tolerance), with two blocks the next piece's wgmma in flight during a piece's adds. The pieces make
room for wider tiles in the conv consumers' 224 registers (conv_sm90.cu: its producer keeps 56):

- 128x256, 4 pieces of 64 columns, one block (128 + 32 registers a thread; 2 pieces of 128 spill with a
  float16 residual and float16 output), 4 stages;
- 128x192, 3 pieces of 64, two blocks (96 + 64; 2 pieces of 96 in two blocks spill with the float16
  epilogue), 5 stages;
- 128x128, 2 pieces of 64, two blocks (64 + 64: the registers of fp8_sm90's 128x128, its adds now overlapping
  its own next piece's wgmma), 6 stages;
- 128x64x2: two blocks an SM of two consumer warpgroups (88 registers a consumer thread), the whole stage in
  one block (mainloop_f8: 32 + 32 fit; pieces of 32 columns would add wgmma waits and gain no registers that
  matter), INT8's two-blocks tile: one block's epilogue runs while the other's wgmma do.

Fast accumulation, `cuda.fp8.conv_fast_sm90_<BM>x<BN>` (priority 3, another family): the same four tiles with
gemm_sm90_core.cuh's F8_FAST, whole-tile wgmma accumulating every stage in the fp32 accumulators (no promotion,
no register blocks: BN / 2 registers a thread), the 16-bit kernels' K loop with one stage in flight; their error
grows with K (test_fp8_sm90.py's tolerance for fast tactics).

No spills and no serialized wgmma on any of them with each output and residual (ptxas,
tests/kernels/cuda/test_fp8_conv_sm90.py). Priority 3, below fp8_sm90's 5 and fp8_gemm_sm90's 4: a level-0 plan
keeps fp8_sm90's tiles (these pass their gpu tests, H100 2026-12-06; a timed ResNet-50 plan takes them on 19 convs);
a timed build times the best of them beside the conv
tiles (tuner.capped: another family), and a 1x1 stride-1 conv reaches the GEMM tiles first at level 1.
"""

from __future__ import annotations

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.kernels.cuda.base import KernelSource, cuda_tactic
from polykit.kernels.cuda.gemm.gemm_sm90 import ARCHS, ROW_BYTES, Sm90Tile
from polykit.kernels.cuda.int8.fp8_sm90 import E4M3, KIND, _supports, enqueue_conv, fp8_layer, kernel
from polykit.kernels.cuda.int8.int8_sm90 import _estimate

#: (tile, pieces a stage's columns are promoted in, register blocks: gemm_sm90_core.cuh F8_PIECES / F8_BUFS);
#: rates are fp16-equivalent guesses (unmeasured; the cost model halves K for e4m3's rate), fp8_gemm_sm90's for
#: the same shapes and int8_sm90's for 128x64x2
TILES = ((Sm90Tile(1, 2, 256, 4, tflops=660), 4, 1), (Sm90Tile(1, 2, 192, 5, tflops=600), 3, 2),
         (Sm90Tile(1, 2, 128, 6, tflops=500), 2, 2), (Sm90Tile(1, 2, 64, 4, blocks=2, tflops=340), 1, 1))
PRIORITY = 3
#: the fast-accumulation tiles (F8_FAST: one piece, no promotion)
FAST_TILES = tuple(t for t, _, _ in TILES)
#: (output, residual) pairs whose epilogues every tile is compiled with (fp8_layer's; None: no residual)
EPILOGUES = ((E4M3, "float32"), ("float32", "float32"), (E4M3, E4M3), ("float16", "float16"), (E4M3, None),
             ("float32", None))


def compile_variants() -> list[KernelSource]:
    """conv_sm90 F8 for every tile with each output and residual of EPILOGUES read 8 at a time, and the first
    tile with them through the general broadcast (CI: sm_90a)."""
    out = [kernel(fp8_layer(y, residual=r), t, pieces=p, bufs=b) for t, p, b in TILES for y, r in EPILOGUES]
    first, pieces, bufs = TILES[0]
    out += [kernel(fp8_layer(y, residual=r, shapes=False), first, pieces=pieces, bufs=bufs)
            for y, r in EPILOGUES[:4]]
    # the fast tiles: an e4m3 output with an e4m3 residual each, and the widest with the float16 epilogue
    out += [kernel(fp8_layer(E4M3, residual=E4M3), t, fast=True) for t in FAST_TILES]
    return out + [kernel(fp8_layer("float16", residual="float16"), FAST_TILES[0], fast=True)]


def _kernels(tile: Sm90Tile, pieces: int, bufs: int):  # (fp8_sm90's terms: _supports)
    return lambda layer: [kernel(layer, tile, pieces=pieces, bufs=bufs)]


def tactic_name(tile: Sm90Tile, fast: bool = False) -> str:
    return f"cuda.fp8.conv_{'fast_' if fast else ''}sm90_{tile.label}"


for _tile, _pieces, _bufs in TILES:
    cuda_tactic(KIND, tactic_name(_tile), kernels=_kernels(_tile, _pieces, _bufs), supports=_supports(_tile),
                priority=PRIORITY, archs=ARCHS, estimate=_estimate(_tile), domain=POLYKIT_DOMAIN,
                params={"bm": _tile.bm, "bn": _tile.bn, "bk": ROW_BYTES, "msub": _tile.msub, "pieces": _pieces,
                        "bufs": _bufs, "consumers": _tile.consumers, "stages": _tile.stages,
                        "blocks": _tile.blocks})(enqueue_conv(_tile, _pieces, _bufs))
for _tile in FAST_TILES:
    cuda_tactic(KIND, tactic_name(_tile, True), kernels=lambda layer, t=_tile: [kernel(layer, t, fast=True)],
                supports=_supports(_tile), priority=PRIORITY, archs=ARCHS, estimate=_estimate(_tile),
                domain=POLYKIT_DOMAIN,
                params={"bm": _tile.bm, "bn": _tile.bn, "bk": ROW_BYTES, "msub": _tile.msub, "fast_accumulation": 1,
                        "consumers": _tile.consumers, "stages": _tile.stages, "blocks": _tile.blocks})(
        enqueue_conv(_tile, fast=True))

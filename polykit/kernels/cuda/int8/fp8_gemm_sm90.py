"""FP8 GEMMs on Hopper tensor cores: gemm_sm90.cu's `gemm_sm90` with F8 1 (docs/INT8.md "FP8 GEMM tiles").

Tactics `cuda.fp8.gemm_sm90_<BM>x<BN>` (kind QConvNHWC, compute capability 9.0) run the FP8 layers
fp8_sm90.py takes whose convolution is a GEMM over rows: 1x1 kernel, strides 1, no padding (what an
FP8 QMatMul with a constant [K, N] weight becomes in to_channels_last, and a ResNet's stride-1 1x1
convs). Then X [NB, H, W, C] is A [M = NB * H * W, K = C] row-major and the packed KRSC weight is B
[N, K] K-major, both e4m3 and both loaded by TMA (conv_sm90's producer gathers A row by row with
cp.async, 128 threads' address math a stage); one producer thread feeds two consumer warpgroups.
Wider tiles than fp8_sm90's: 128x192 and 128x256 (BERT-base's N = 3072 in one wave of 128x192 tiles
at M = 1024, where 128x128 makes 1.45), 128x160 (N = 2304: 120 tiles; a width the epilogue's 32-column
groups divide, gemm_sm90_epilogue.cuh), 128x128, and 64x96 (one
consumer warpgroup; N = 768: 128 tiles). Their registers fit because a stage's products are
promoted in pieces (gemm_sm90_core.cuh mainloop_f8_pieces, F8_PIECES / F8_BUFS): the CUDA cores add
one piece to the fp32 accumulators while the next piece's wgmma run (two register blocks), or
after it (one block: 128x256), so BN / 2 accumulators + blocks x BN / (2 * pieces) a thread
(128x256: 128 + 64; 128x192: 96 + 96) stay within setmaxnreg's 232; the other consumer
warpgroup's wgmma run while one adds.
The numerics are fp8_sm90's (each stage's products summed in fp32 on the CUDA cores, then
int8_out.cuh's output, epilogue and float32 / e4m3 / float16 store), so the tests hold them to
its tolerance (they pass it on an H100, 2026-12-06, since the 144-column tile became 160: the epilogue finishes
whole 32-column groups). Priority 4, below fp8_sm90's 5: a level-0 plan keeps the conv tiles; the tuner times the
best of them at level >= 1 (tuner.capped: another family), and the default level's BERT-base FP8 plan takes them on
every linear layer (docs/PERFORMANCE.md, sixteenth session).
`cuda.fp8.gemm_fast_sm90_<tile>` (FAST_TILES, their own tuner family): the same tiles with fast accumulation
(gemm_sm90_core.cuh F8_FAST: no promotion, whole-tile wgmma; BERT's FFN2 13.1 -> 9.6 us on an H100, 2026-12-07;
a timed BERT-base FP8 plan takes them on 36 of its 48 GEMMs).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, TensorMapSpec, cuda_tactic, defines
from polykit.kernels.cuda.conv.conv_sm90 import ConvGemm
from polykit.kernels.cuda.gemm.epilogue import epilogue_args
from polykit.kernels.cuda.gemm.gemm_sm90 import ARCHS, ROW_BYTES, Sm90Tile, kernel_for
from polykit.kernels.cuda.int8.fp8_sm90 import E4M3, KIND, _supports as _fp8_supports, fp8_launch, fp8_layer
from polykit.kernels.cuda.int8.int8 import out_defines
from polykit.kernels.cuda.int8.int8_sm90 import _estimate, _geometry

#: (tile, pieces a stage's columns are promoted in, register blocks of a piece: gemm_sm90_core.cuh F8_BUFS);
#: rates are fp16-equivalent guesses (unmeasured; the cost model halves K for e4m3's rate)
TILES = ((Sm90Tile(1, 2, 192, 5, tflops=600), 2, 2), (Sm90Tile(1, 2, 256, 4, tflops=660), 2, 1),
         (Sm90Tile(1, 2, 160, 6, tflops=570), 2, 2), (Sm90Tile(1, 2, 128, 6, tflops=500), 2, 2),
         (Sm90Tile(1, 1, 96, 8, tflops=330), 2, 2))
PRIORITY = 4
#: the fast-accumulation tiles (`cuda.fp8.gemm_fast_sm90_<tile>`, gemm_sm90_core.cuh F8_FAST: no promotion, the
#: stages' products accumulate in the wgmma accumulators as cuBLASLt's fast accumulation does): whole-tile wgmma,
#: BN / 2 accumulators a thread and nothing else, one stage's wgmma in flight while the next is issued
FAST_TILES = tuple(t for t, _, _ in TILES)
#: the rolled tiles (`cuda.fp8.gemm_fast_rolled_sm90_<tile>`, and int8_gemm_sm90's `cuda.int8.gemm_rolled_sm90_<tile>`):
#: the fast tiles of 128 columns or more compiled with EPI_ROLL 1 (gemm_sm90_epilogue.cuh), whose native epilogue is a
#: loop over the tile's 32-column groups instead of BN / 32 copies of one group's code straight through (128x192 with
#: BERT's Gelu: a ~650-instruction loop where the unrolled path runs ~2,600 once a tile). The same bytes (host
#: emulation, tests/kernels/cuda/test_sm90_epilogue_emulated.py); ~2 instructions an output more (the group's
#: accumulators selected, its prefetched loads moved). Variants of their twins (Tactic.variant_of, one priority
#: below): level 0 keeps the twins, and a timed build times a rolled tile beside the one of its twin's family the cap
#: ranks best (tuner._with_variants), keeping the faster. Untimed on a GPU when added (twenty-fifth session): which
#: wins is the tuner's to measure.
ROLLED_TILES = tuple(t for t in FAST_TILES if t.bn >= 128)


def rolls(source: KernelSource) -> bool:
    """Whether EPI_ROLL changes `source` (a gemm_sm90 I8 / F8 unit): its epilogue takes gemm_sm90_epilogue.cuh's
    native path (I8_NATIVE: INT8 out of int8 / uint8 / float32, or F8 fast of e4m3 / float32, one block an SM, an
    epilogue reading no vector input or only 8-bit ones), which is the path EPI_ROLL rolls; elsewhere a rolled tile
    would be its twin's kernel timed twice."""
    d = dict(source.defines)
    code = source.code or ""
    y_out = int(d.get("Y_OUT", "-1"))
    if d.get("F8") == "1":
        native = d.get("F8_FAST") == "1" and y_out in (0, 1)
    else:
        native = d.get("I8") == "1" and y_out in (0, 1, 2)
    epilogue_ok = "#define HAS_EPILOGUE 1" not in code or "#define EPI_BYTES8 1" in code
    return native and epilogue_ok and d.get("BLOCKS", "1") == "1"


def with_rolled_epilogue(source: KernelSource) -> KernelSource:
    """`source` with EPI_ROLL 1 (the rolled tiles' kernel)."""
    return replace(source, defines=tuple(sorted(dict(source.defines, EPI_ROLL="1").items())))


def over_rows(geo: ConvGemm | None) -> bool:
    """Whether a conv's implicit GEMM reads X's pixels as its rows: a 1x1 kernel, strides 1, no padding."""
    return (geo is not None and geo.K == geo.C and geo.strides == (1, 1) and geo.pads == (0, 0)
            and (geo.OH, geo.OW) == (geo.H, geo.W))


def _supports(tile: Sm90Tile):
    fp8 = _fp8_supports(tile)

    def supported(layer: Any) -> bool:
        return fp8(layer) and over_rows(_geometry(layer))

    return supported


def kernel(layer: Any, tile: Sm90Tile, pieces: int, bufs: int, y_dtype: str | None = None,
           steps: tuple[int, int] | None = None, fast: bool = False, rolled: bool = False) -> KernelSource:
    """gemm_sm90 with the tile's defines (B [N, K]: B_MN 0), F8 1, F8_PIECES, F8_BUFS and the output compiled
    in (int8.out_defines: its type, the scale's and bias's steps); `fast`: F8_FAST 1 (one piece, no promotion);
    `rolled`: EPI_ROLL 1 (ROLLED_TILES)."""
    source = kernel_for(layer, tile, "float", False, "gemm_sm90")
    f8 = defines(F8=1, F8_FAST=1) if fast else defines(F8=1, F8_PIECES=pieces, F8_BUFS=bufs)
    extra = f8 + out_defines(layer, y_dtype, steps)
    source = replace(source, defines=tuple(sorted(source.defines + extra)))
    return with_rolled_epilogue(source) if rolled else source


def _enqueue(tile: Sm90Tile, pieces: int, bufs: int, fast: bool = False, rolled: bool = False):
    def enqueue(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor]) -> None:
        run = fp8_launch(layer, tensors)
        if run is None:
            return
        x, w, y, geo = run.x, run.w, run.y, run.geo
        if not over_rows(geo) or geo.C % 16:
            raise DeviceError(f"X {x.shape} * W {w.shape} is not a GEMM over X's rows (the sm90 FP8 GEMM takes a "
                              "1x1, stride-1, unpadded conv of C % 16 channels)", where=f"layer {layer.name!r}",
                              hint="rebuild the plan: the tactic was chosen for other shapes")
        tm_a = TensorMapSpec(x.ptr, x.dtype, (geo.K, geo.M, 1), (geo.K, geo.M * geo.K), (ROW_BYTES, tile.bm, 1))
        tm_b = TensorMapSpec(w.ptr, w.dtype, (geo.K, geo.N, 1), (geo.K, geo.N * geo.K), (ROW_BYTES, tile.bn, 1))
        tiles = -(-geo.M // tile.bm) * -(-geo.N // tile.bn)
        sizes = [geo.M, geo.N, geo.K, 0, 0, np.float32(1.0), np.float32(0.0), 1, 0, 0]  # no C; one item
        launcher.launch(kernel(layer, tile, pieces, bufs, y.dtype.name, run.steps, fast, rolled),
                        (tile.grid(tiles, launcher.sm_count),), (tile.threads,),
                        [tm_a, tm_b, 0, y, *sizes, *run.out] + epilogue_args(layer, tensors, np.dtype(np.float32)),
                        shared_mem=tile.smem_for("int8", False, False))

    return enqueue


def compile_variants() -> list[KernelSource]:
    """gemm_sm90 F8 for every tile (float32 and e4m3 outputs compiled in); the first tile with a float32 and an
    e4m3 residual epilogue (e4m3 out) and a float16 one (float16 out), each read 8 at a time and through the
    general broadcast, and the 256-column tile with the e4m3 and float32 residuals read 8 at a time (its
    registers are the tightest) (CI: sm_90a)."""
    out = [kernel(fp8_layer(y), *t) for t in TILES for y in ("float32", E4M3)]
    out += [kernel(fp8_layer(y, residual=r, shapes=s), *TILES[0])
            for y, r in ((E4M3, "float32"), (E4M3, E4M3), ("float16", "float16")) for s in (True, False)]
    out += [kernel(fp8_layer(E4M3, residual=r), *TILES[1]) for r in ("float32", E4M3)]
    # the fast tiles: the e4m3 output each, the float32 output and the e4m3 residual on the widest
    out += [kernel(fp8_layer(E4M3), t, 1, 1, fast=True) for t in FAST_TILES]
    out += [kernel(fp8_layer(y, residual=r), FAST_TILES[1], 1, 1, fast=True) for y, r in (("float32", None), (E4M3, E4M3))]
    # the rolled tiles: the e4m3 output each, the e4m3 residual and the float32 output on the widest
    out += [kernel(fp8_layer(E4M3), t, 1, 1, fast=True, rolled=True) for t in ROLLED_TILES]
    return out + [kernel(fp8_layer(y, residual=r), ROLLED_TILES[1], 1, 1, fast=True, rolled=True)
                  for y, r in (("float32", None), (E4M3, E4M3))]


for _tile, _pieces, _bufs in TILES:
    cuda_tactic(KIND, f"cuda.fp8.gemm_sm90_{_tile.label}", kernels=lambda layer, t=_tile, p=_pieces, b=_bufs: [
                    kernel(layer, t, p, b)], supports=_supports(_tile), priority=PRIORITY, archs=ARCHS,
                estimate=_estimate(_tile), domain=POLYKIT_DOMAIN,
                params={"bm": _tile.bm, "bn": _tile.bn, "bk": ROW_BYTES, "msub": _tile.msub, "pieces": _pieces,
                        "bufs": _bufs, "consumers": _tile.consumers, "stages": _tile.stages})(
        _enqueue(_tile, _pieces, _bufs))
for _tile in FAST_TILES:
    cuda_tactic(KIND, f"cuda.fp8.gemm_fast_sm90_{_tile.label}", kernels=lambda layer, t=_tile: [
                    kernel(layer, t, 1, 1, fast=True)], supports=_supports(_tile), priority=PRIORITY, archs=ARCHS,
                estimate=_estimate(_tile), domain=POLYKIT_DOMAIN,
                params={"bm": _tile.bm, "bn": _tile.bn, "bk": ROW_BYTES, "msub": _tile.msub, "fast_accumulation": 1,
                        "consumers": _tile.consumers, "stages": _tile.stages})(_enqueue(_tile, 1, 1, True))


def _supports_rolled(tile: Sm90Tile):
    twin = _supports(tile)

    def supported(layer: Any) -> bool:
        return twin(layer) and rolls(kernel(layer, tile, 1, 1, fast=True))

    return supported


for _tile in ROLLED_TILES:
    cuda_tactic(KIND, f"cuda.fp8.gemm_fast_rolled_sm90_{_tile.label}", kernels=lambda layer, t=_tile: [
                    kernel(layer, t, 1, 1, fast=True, rolled=True)], supports=_supports_rolled(_tile),
                priority=PRIORITY - 1, archs=ARCHS, estimate=_estimate(_tile), domain=POLYKIT_DOMAIN,
                params={"bm": _tile.bm, "bn": _tile.bn, "bk": ROW_BYTES, "msub": _tile.msub, "fast_accumulation": 1,
                        "rolled_epilogue": 1, "consumers": _tile.consumers, "stages": _tile.stages},
                variant_of=f"cuda.fp8.gemm_fast_sm90_{_tile.label}")(
        _enqueue(_tile, 1, 1, True, True))

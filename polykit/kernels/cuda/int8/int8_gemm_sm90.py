"""INT8 GEMMs over rows on Hopper tensor cores: gemm_sm90.cu's `gemm_sm90` with I8 1 (docs/INT8.md).

Tactics `cuda.int8.gemm_sm90_<BM>x<BN>` (kind QConvNHWC, compute capability 9.0) run the symmetric INT8
layers int8_sm90.py takes whose convolution is a GEMM over rows (fp8_gemm_sm90.over_rows: 1x1 kernel,
strides 1, no padding; a ResNet's stride-1 1x1 convs, an --int8 QMatMul run as a 1x1 QConvNHWC). X
[NB, H, W, C] is then A [M = NB * H * W, K = C] row-major and the packed KRSC weight is B [N, K]
K-major, both int8 and both loaded by TMA (int8_sm90's conv_sm90 gathers A row by row with cp.async);
one producer thread feeds the consumer warpgroups. The K loop is the s8 wgmma one
(`wgmma.mma_async m64nNk32.s32.s8.s8`, int32 accumulators: exact, so no promotion pieces, the structure
of fp8_gemm_sm90's fast tiles), the output int8_out.cuh's (dequantize, epilogue, requantize: results
equal `cpu.reference` bit for bit, as int8_sm90's). The tiles are fp8_gemm_sm90's FAST_TILES (128x192,
128x256, 128x160, 128x128, 64x96): BN / 2 int32 accumulators a thread.
Priority 4, below int8_sm90's 5: a level-0 plan keeps the conv tiles; the tuner times the best of them
at level >= 1 (tuner.capped: `cuda.int8.gemm` is another family than `cuda.int8.sm90`).
Measured (H100, 2026-12-07): bit-exact in tests/kernels/cuda/test_int8_gemm_sm90.py's and test_int8_sm90.py's GPU
tests; timed ResNet-50 bs32 INT8 builds took them on 25 (5f21e11a) and 30 (75d59973) of its 54 convs
(docs/PERFORMANCE.md, twentieth and twenty-first sessions).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, TensorMapSpec, cuda_tactic
from polykit.kernels.cuda.gemm.epilogue import epilogue_args
from polykit.kernels.cuda.gemm.gemm_sm90 import ARCHS, ROW_BYTES, Sm90Tile, kernel_for
from polykit.kernels.cuda.int8.fp8_gemm_sm90 import FAST_TILES, ROLLED_TILES, over_rows, rolls, with_rolled_epilogue
from polykit.kernels.cuda.int8.int8 import NHWC_CHANNELS, out_defines, residual_layer
from polykit.kernels.cuda.int8.int8_sm90 import (KIND, _estimate, _geometry, _shaped_residual_layer, int8_launch,
                                               shaped_half_layer, zero_y)
from polykit.kernels.cuda.int8.int8_sm90 import _supports as _conv_supports

#: fp8_gemm_sm90's whole-tile (fast) tiles: 128x192, 128x256, 128x160, 128x128, 64x96
TILES = FAST_TILES
PRIORITY = 4


def _supports(tile: Sm90Tile):
    conv = _conv_supports(tile)

    def supported(layer: Any) -> bool:
        if not conv(layer):
            return False
        geo = _geometry(layer)
        return over_rows(geo) and geo.C % NHWC_CHANNELS == 0

    return supported


def kernel(layer: Any, tile: Sm90Tile, y_dtype: str | None = None, steps: tuple[int, int] | None = None,
           rolled: bool = False) -> KernelSource:
    """gemm_sm90 with the tile's defines (B [N, K]: B_MN 0), I8 1 and the output compiled in
    (int8.out_defines: its type, the scale's and bias's steps, from `y_dtype` / `steps` or the record),
    as int8_sm90.kernel does for conv_sm90; `rolled`: EPI_ROLL 1 (fp8_gemm_sm90.ROLLED_TILES)."""
    source = kernel_for(layer, tile, "float", False, "gemm_sm90", int8=True)
    source = replace(source, defines=tuple(sorted(source.defines + out_defines(layer, y_dtype, steps))))
    return with_rolled_epilogue(source) if rolled else source


def _enqueue(tile: Sm90Tile, rolled: bool = False):
    def enqueue(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor]) -> None:
        run = int8_launch(layer, tensors)
        if run is None:
            return
        x, w, y, geo = run.x, run.w, run.y, run.geo
        if geo is None or x.dtype != np.int8 or w.dtype != np.int8 or not over_rows(geo) or geo.C % NHWC_CHANNELS:
            raise DeviceError(f"X {x.shape} {x.dtype} * W {w.shape} {w.dtype} is not an int8 GEMM over X's rows (the "
                              f"sm90 INT8 GEMM takes int8 NHWC X and KRSC W of a 1x1, stride-1, unpadded conv of C % "
                              f"{NHWC_CHANNELS} channels)", where=f"layer {layer.name!r}",
                              hint="rebuild the plan: the tactic was chosen for other shapes (cuda.int8.sm90_* and "
                                   "cuda.int8.mma_* take the others)")
        tm_a = TensorMapSpec(x.ptr, x.dtype, (geo.K, geo.M, 1), (geo.K, geo.M * geo.K), (ROW_BYTES, tile.bm, 1))
        tm_b = TensorMapSpec(w.ptr, w.dtype, (geo.K, geo.N, 1), (geo.K, geo.N * geo.K), (ROW_BYTES, tile.bn, 1))
        tiles = -(-geo.M // tile.bm) * -(-geo.N // tile.bn)
        sizes = [geo.M, geo.N, geo.K, 0, 0, np.float32(1.0), np.float32(0.0), 1, 0, 0]  # no C; one item
        launcher.launch(kernel(layer, tile, y.dtype.name, run.steps, rolled), (tile.grid(tiles, launcher.sm_count),),
                        (tile.threads,),
                        [tm_a, tm_b, 0, y, *sizes, *run.out] + epilogue_args(layer, tensors, np.dtype(np.float32)),
                        shared_mem=tile.smem_for("int8", False, False))

    return enqueue


def compile_variants() -> list[KernelSource]:
    """gemm_sm90 I8 for every tile with an int8 and a float32 output; the first tile and the 256-column one
    (the most accumulators) with an int8 residual epilogue read 8 at a time (shapes stamped: the tile-input,
    I8_NATIVE path), int8 and float32 out; the first tile's int8 residual also through the general broadcast
    (shapes unknown); the int8 outputs with a constant 0 zero point (Y_ZERO 0, what --int8 builds stamp), the first
    tile's plain one also read at run time; the first tile's float16 output; the rolled tiles (CI: sm_90a)."""
    plain = replace(residual_layer(KIND, "int8"), attrs={})
    out = [kernel(zero_y(plain) if y == "int8" else plain, t, y) for t in TILES for y in ("int8", "float32")]
    wide = next(t for t in TILES if t.bn == 256)
    residual = _shaped_residual_layer("int8")
    out += [kernel(residual, t, y) for t in (TILES[0], wide) for y in ("int8", "float32")]
    out += [kernel(plain, TILES[0], "int8")] + [kernel(zero_y(residual), t, "int8") for t in (TILES[0], wide)]
    out += [kernel(shaped_half_layer(), TILES[0], "float16")]  # Relu, float16 out (Y_OUT 3)
    out += [kernel(residual_layer(KIND, "int8"), TILES[0], "int8")]
    # the rolled tiles: the int8 output each (a constant 0 zero point), the int8 residual (tile inputs) on the first
    # and the widest, int8 and float32 out
    out += [kernel(zero_y(plain), t, "int8", rolled=True) for t in ROLLED_TILES]
    return out + [kernel(residual, t, y, rolled=True) for t in (ROLLED_TILES[0], wide) for y in ("int8", "float32")]


for _tile in TILES:
    # estimate: int8_sm90's model (predicted_us at half K plus its fitted epilogue rate), not measured on these tiles
    cuda_tactic(KIND, f"cuda.int8.gemm_sm90_{_tile.label}", kernels=lambda layer, t=_tile: [kernel(layer, t)],
                supports=_supports(_tile), priority=PRIORITY, archs=ARCHS, estimate=_estimate(_tile),
                domain=POLYKIT_DOMAIN,
                params={"bm": _tile.bm, "bn": _tile.bn, "bk": ROW_BYTES, "msub": _tile.msub,
                        "consumers": _tile.consumers, "stages": _tile.stages})(_enqueue(_tile))


def _supports_rolled(tile: Sm90Tile):
    twin = _supports(tile)

    def supported(layer: Any) -> bool:
        return twin(layer) and rolls(kernel(layer, tile))

    return supported


for _tile in ROLLED_TILES:  # (fp8_gemm_sm90.ROLLED_TILES: EPI_ROLL, variants of their twins, untimed when added)
    cuda_tactic(KIND, f"cuda.int8.gemm_rolled_sm90_{_tile.label}", kernels=lambda layer, t=_tile: [
                    kernel(layer, t, rolled=True)], supports=_supports_rolled(_tile), priority=PRIORITY - 1, archs=ARCHS,
                estimate=_estimate(_tile), domain=POLYKIT_DOMAIN,
                params={"bm": _tile.bm, "bn": _tile.bn, "bk": ROW_BYTES, "msub": _tile.msub, "rolled_epilogue": 1,
                        "consumers": _tile.consumers, "stages": _tile.stages},
                variant_of=f"cuda.int8.gemm_sm90_{_tile.label}")(_enqueue(_tile, True))

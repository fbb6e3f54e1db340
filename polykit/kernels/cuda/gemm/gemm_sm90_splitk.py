"""Split-K on the Hopper GEMM (gemm_sm90.cu with SPLITK 1, gemm_sm90_splitk.cuh): for grids of
output tiles too small to fill the SMs (BERT-base bs1: 6 tiles of 128x128 for 132 SMs).

Tactics `cuda.gemm.sm90_<BM>x<BN>_sk<S>` (fp16 / bf16 / tf32) and `cuda.gemm.sm90x3_<BM>x<BN>_sk<S>`
(3xTF32) take the layers their unsplit tile takes. The persistent kernel's work units are the
tiles' K slices (S near-equal ranges of 64-deep K steps, at most one slice a K step); each unit's
fp32 accumulators go to the layer's workspace, and gemm_sm90_splitk_reduce sums the slices in
slice order and applies alpha, beta * C and the fused epilogue: deterministic, bit for bit run to
run. S is the tactic's parameter (the tuner times the counts; the cost model, predicted_us,
orders them for an untimed build); one compiled kernel serves every S of a tile.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, cuda_tactic, defines
from polykit.kernels.cuda.gemm.epilogue import epilogue_args
from polykit.kernels.cuda.gemm.gemm_sm90 import (ARCHS, BK, ELEMS, FILE, ROW_BYTES, TILES, X3_TILES, Sm90Gemm, Sm90Tile,
                                            kernel_for, operands_of, tile_count, tile_estimate, tile_kernels,
                                            tile_supports, workspace_geometry)

REDUCE = "gemm_sm90_splitk_reduce"
#: K slices of the tactics
SPLITS = (2, 4, 8, 16)
#: tiles with split-K tactics: 128x128 and 64x128 (fp16 / bf16 / tf32), the 3xTF32 ones alike
SPLIT_TILES = tuple(t for t in TILES if t.label in ("128x128", "64x128"))
X3_SPLIT_TILES = tuple(t for t in X3_TILES if t.label in ("128x128", "64x128"))
REDUCE_BLOCK = 64  # threads of a reduce block: small, so a small output still spreads over many SMs


def slices(geo: Sm90Gemm, splits: int, storage: str) -> int:
    """The K slices a launch uses: `splits`, or one a K step when K has fewer steps (a step is
    one 128-byte row of K: 64 16-bit elements, 32 floats)."""
    step = ROW_BYTES // (4 if storage == "float32" else 2)
    return max(1, min(splits, -(-geo.K // step)))


def partial_bytes(geo: Sm90Gemm, tile: Sm90Tile, splits: int) -> int:
    """The fp32 partials' workspace: [splits][items][M][N rounded up to BN] (gemm_sm90_splitk.cuh)."""
    return 4 * splits * geo.items * geo.M * -(-geo.N // tile.bn) * tile.bn


def _workspace(tile: Sm90Tile, splits: int):
    def workspace(layer: Any, tensors: Mapping[str, Any], sm_count: int) -> int:
        found = workspace_geometry(layer, tensors)
        return 0 if found is None else partial_bytes(found[0], tile, slices(found[0], splits, found[1]))

    return workspace


def _enqueue(tile: Sm90Tile, split3: bool, splits: int):
    def enqueue(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor]) -> None:
        ops = operands_of(layer, tensors, "sm90 split-K GEMM kernel")
        geo = ops.geo
        s = slices(geo, splits, ops.storage)
        partial = launcher.workspace(partial_bytes(geo, tile, s))
        if not partial:
            raise DeviceError(f"split-K needs {partial_bytes(geo, tile, s)} bytes of workspace, the launcher lent none",
                              where=f"layer {layer.name!r}",
                              hint="run the layer through an engine or harness that lends workspace")
        kernel = kernel_for(layer, tile, ELEMS[ops.storage], geo.b_mn, split3=split3, splitk=True)
        epi = epilogue_args(layer, tensors, ops.Y.dtype)
        grid = tile.grid(tile_count(geo, tile) * s, launcher.sm_count)
        launcher.launch(kernel, (grid,), (tile.threads,), ops.kernel_args(tile) + [partial, s] + epi,
                        shared_mem=tile.smem_for(ops.storage, geo.b_mn, split3))
        groups = geo.items * geo.M * -(-geo.N // 8)
        reduce_grid = max(1, min(-(-groups // REDUCE_BLOCK), 16 * launcher.sm_count))
        launcher.launch(KernelSource(REDUCE, kernel.file, kernel.code, kernel.defines, kernel.arch), (reduce_grid,),
                        (REDUCE_BLOCK,), [ops.c_arg, ops.Y, geo.M, geo.N, geo.c_strides[0], geo.c_strides[1],
                                          np.float32(ops.alpha), np.float32(ops.beta), geo.items, partial, s] + epi)

    return enqueue


def compile_variants() -> list[KernelSource]:
    """The split-K unit (kernel and reduce) of each split tile with both B layouts for fp16, the
    128x128 one for bf16 and for tf32 with a K-major B, and each 3xTF32 split tile with each B
    layout it fits (CI: sm_90a)."""
    def unit(elem: str, tile: Sm90Tile, b_mn: bool, split3: bool = False) -> KernelSource:
        return KernelSource("gemm_sm90", file=FILE, defines=defines(ELEM=elem, SPLITK=1) + tile.defines(b_mn, split3),
                            arch="sm_90a")

    out = [unit("half_t", t, b_mn) for t in SPLIT_TILES for b_mn in (True, False)]
    out += [unit("bf16_t", SPLIT_TILES[0], True), unit("float", SPLIT_TILES[0], False)]
    return out + [unit("float", t, b_mn, True) for t in X3_SPLIT_TILES for b_mn in (False, True)
                  if t.fits("float32", b_mn, True)]


def _register(tiles: tuple[Sm90Tile, ...], prefix: str, split3: bool) -> None:
    for tile in tiles:
        for splits in SPLITS:
            for kind in ("MatMul", "Gemm"):
                cuda_tactic(kind, f"cuda.gemm.{prefix}_{tile.label}_sk{splits}",
                            kernels=tile_kernels(tile, split3, splitk=True), supports=tile_supports(tile, split3),
                            priority=30, archs=ARCHS, estimate=tile_estimate(tile, split3, splits),
                            workspace=_workspace(tile, splits),
                            params={"bm": tile.bm, "bn": tile.bn, "bk": BK, "msub": tile.msub,
                                    "consumers": tile.consumers, "stages": tile.stages, "splits": splits})(
                    _enqueue(tile, split3, splits))


_register(SPLIT_TILES, "sm90", False)
_register(X3_SPLIT_TILES, "sm90x3", True)

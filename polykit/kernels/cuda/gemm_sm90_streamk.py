"""Stream-K on the Hopper GEMM (gemm_sm90.cu with STREAMK 1, gemm_sm90_streamk.cuh): against
wave quantization, grids of output tiles that leave SMs idle in their last wave (BERT-base bs8
FFN1: 192 tiles of 128x128 for 132 SMs, 1.45 waves).

Tactics `cuda.gemm.sm90_<BM>x<BN>_streamk` (fp16 / bf16 / tf32) take the layers their unsplit tile
takes. CUTLASS's data-parallel + stream-K hybrid (`schedule`): whole waves of tiles but the last
run unsplit; the last whole wave and the partial one are spread over every persistent block by
K steps, each block the same share. Tiles split between blocks leave fp32 pieces in the layer's
workspace, summed in K order by gemm_sm90_streamk_reduce, which also runs the epilogue:
deterministic, bit for bit run to run on one device (the split depends on its SM count).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, cuda_tactic, defines
from polykit.kernels.cuda.epilogue import epilogue_args
from polykit.kernels.cuda.gemm_sm90 import (ARCHS, BK, ELEMS, FILE, PARTIAL_BYTES_PER_US, REDUCE_US, TILES, Sm90Gemm,
                                            Sm90Tile, bk_of, kernel_for, layer_geometry, layer_storage, operands_of,
                                            predicted_us, tile_count, tile_kernels, tile_supports, workspace_geometry)

REDUCE = "gemm_sm90_streamk_reduce"
REDUCE_BLOCK = 64  # threads of a reduce block (as split-K's)
#: tiles with a stream-K tactic: one block an SM, the shapes whose waves are coarse
STREAMK_TILES = tuple(t for t in TILES if t.label in ("128x128", "128x256", "256x128", "128x192", "64x128"))
#: the hybrid's cost past its blocks' K steps where tiles are split, beside split-K's REDUCE_US and
#: the pieces' traffic: fitted to the H100 timings of the five tiles on the six BERT-base GEMMs
#: (docs/CUDA_NOTES.md), 10 us in all with the start and the reduce's launch
PIECES_US = 6.5


@dataclass(frozen=True)
class StreamKSchedule:
    """How a launch splits `tiles` output tiles of `ktiles` K steps over `grid` persistent blocks:
    the first dp_tiles (a multiple of grid) whole, the last sk_tiles by K steps."""

    grid: int
    dp_tiles: int
    sk_tiles: int
    ktiles: int

    def block_range(self, b: int) -> tuple[int, int]:
        """Block b's K steps on the stream-K line (gemm_sm90_streamk.cuh sk_begin)."""
        iters = self.sk_tiles * self.ktiles
        return b * iters // self.grid, (b + 1) * iters // self.grid

    def pieces(self) -> int:
        """Partial pieces the blocks store (tiles split between blocks: each piece written and read once)."""
        count = 0
        for b in range(self.grid if self.sk_tiles else 0):
            s0, s1 = self.block_range(b)
            t0, t1 = s0 // self.ktiles, (s1 - 1) // self.ktiles
            if t0 == t1:
                count += int(s1 - s0 < self.ktiles)
            else:
                count += int(s0 % self.ktiles != 0) + int(s1 % self.ktiles != 0)
        return count


def schedule(tiles: int, ktiles: int, slots: int) -> StreamKSchedule:
    """The hybrid split: whole waves unsplit; with a partial last wave, it and the wave before (so
    each block's share is one to two tiles of K steps), or every tile when there is less than a
    wave (then at most one block a K step)."""
    waves, rest = divmod(tiles, slots)
    if rest == 0:
        return StreamKSchedule(slots, tiles, 0, ktiles)
    if waves == 0:
        return StreamKSchedule(min(slots, tiles * ktiles), 0, tiles, ktiles)
    return StreamKSchedule(slots, (waves - 1) * slots, slots + rest, ktiles)


def schedule_of(geo: Sm90Gemm, tile: Sm90Tile, storage: str, sm_count: int) -> StreamKSchedule:
    return schedule(tile_count(geo, tile), -(-geo.K // bk_of(storage)), tile.blocks * sm_count)


def partial_bytes(tile: Sm90Tile, sched: StreamKSchedule) -> int:
    """The pieces' workspace: fp32 [grid][2][BM][BN] (gemm_sm90_streamk.cuh), none without stream-K tiles."""
    return 4 * sched.grid * 2 * tile.bm * tile.bn if sched.sk_tiles else 0


def streamk_us(tile: Sm90Tile, geo: Sm90Gemm, sm_count: int, tf32: bool = False) -> float:
    """predicted_us for the hybrid: the whole waves as the unsplit kernel prices them, then each
    block's share of the stream-K steps at the tile's rate and a start, and with split tiles the
    reduce (a launch, the pieces written and read once)."""
    storage = "float32" if tf32 else "float16"
    sched = schedule_of(geo, tile, storage, sm_count)
    if not sched.sk_tiles:
        return predicted_us(tile, geo.M, geo.N, geo.K, geo.items, sm_count, tf32)
    rate = tile.tflops / (2 if tf32 else 1)
    step_us = 2.0 * tile.bm * tile.bn * bk_of(storage) * tile.blocks * sm_count / (rate * 1e6)
    dp_us = sched.dp_tiles // sched.grid * (sched.ktiles * step_us + 2.0)
    share_us = -(-sched.sk_tiles * sched.ktiles // sched.grid) * step_us + 2.0
    pieces = sched.pieces()
    if not pieces:
        return dp_us + share_us
    return dp_us + share_us + REDUCE_US + PIECES_US + 2 * 4 * tile.bm * tile.bn * pieces / PARTIAL_BYTES_PER_US


def _estimate(tile: Sm90Tile):
    def estimate(layer: Any, sm_count: int) -> float | None:
        geo = layer_geometry(layer)
        if geo is None or not sm_count:
            return None
        return streamk_us(tile, geo, sm_count, layer_storage(layer) == "float32")

    return estimate


def _workspace(tile: Sm90Tile):
    def workspace(layer: Any, tensors: Mapping[str, Any], sm_count: int) -> int:
        found = workspace_geometry(layer, tensors)
        return 0 if found is None or not sm_count else partial_bytes(tile, schedule_of(found[0], tile, found[1], sm_count))

    return workspace


def _enqueue(tile: Sm90Tile):
    def enqueue(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor]) -> None:
        ops = operands_of(layer, tensors, "sm90 stream-K GEMM kernel")
        geo = ops.geo
        sched = schedule_of(geo, tile, ops.storage, launcher.sm_count)
        need = partial_bytes(tile, sched)
        partial = launcher.workspace(need) if need else 0
        if need and not partial:
            raise DeviceError(f"stream-K needs {need} bytes of workspace, the launcher lent none",
                              where=f"layer {layer.name!r}",
                              hint="run the layer through an engine or harness that lends workspace")
        kernel = kernel_for(layer, tile, ELEMS[ops.storage], geo.b_mn, streamk=True)
        epi = epilogue_args(layer, tensors, ops.Y.dtype)
        launcher.launch(kernel, (sched.grid,), (tile.threads,),
                        ops.kernel_args(tile) + [partial, sched.dp_tiles, sched.sk_tiles] + epi,
                        shared_mem=tile.smem_for(ops.storage, geo.b_mn, False))
        if not sched.pieces():
            return
        groups = sched.sk_tiles * tile.bm * tile.bn // 8
        reduce_grid = max(1, min(-(-groups // REDUCE_BLOCK), 16 * launcher.sm_count))
        launcher.launch(KernelSource(REDUCE, kernel.file, kernel.code, kernel.defines, kernel.arch), (reduce_grid,),
                        (REDUCE_BLOCK,), [ops.c_arg, ops.Y, geo.M, geo.N, geo.K, geo.c_strides[0], geo.c_strides[1],
                                          np.float32(ops.alpha), np.float32(ops.beta), partial, sched.dp_tiles,
                                          sched.sk_tiles, sched.grid] + epi)

    return enqueue


def compile_variants() -> list[KernelSource]:
    """The stream-K unit (kernel and reduce) of each stream-K tile with both B layouts for fp16, the
    128x128 one for bf16 and for tf32 (CI: sm_90a)."""
    def unit(elem: str, tile: Sm90Tile, b_mn: bool) -> KernelSource:
        return KernelSource("gemm_sm90", file=FILE, defines=defines(ELEM=elem, STREAMK=1) + tile.defines(b_mn),
                            arch="sm_90a")

    out = [unit("half_t", t, b_mn) for t in STREAMK_TILES for b_mn in (True, False)]
    return out + [unit("bf16_t", STREAMK_TILES[0], True), unit("float", STREAMK_TILES[0], False)]


for _tile in STREAMK_TILES:
    for _kind in ("MatMul", "Gemm"):
        cuda_tactic(_kind, f"cuda.gemm.sm90_{_tile.label}_streamk", kernels=tile_kernels(_tile, False, streamk=True),
                    supports=tile_supports(_tile, False), priority=30, archs=ARCHS, estimate=_estimate(_tile),
                    workspace=_workspace(_tile),
                    params={"bm": _tile.bm, "bn": _tile.bn, "bk": BK, "msub": _tile.msub, "consumers": _tile.consumers,
                            "stages": _tile.stages, "streamk": 1})(_enqueue(_tile))

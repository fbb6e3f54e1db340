"""Stream-K on the Hopper GEMM (gemm_sm90.cu with STREAMK 1, gemm_sm90_streamk.cuh): against
wave quantization, grids of output tiles that leave SMs idle in their last wave (BERT-base bs8
FFN1: 192 tiles of 128x128 for 132 SMs, 1.45 waves).

The tactic `cuda.gemm.sm90_128x128_streamk` (fp16 / bf16 / tf32) takes the layers the unsplit
128x128 tile takes. CUTLASS's data-parallel + stream-K hybrid (`schedule`): whole waves of tiles
unsplit, the rest spread over every persistent block by K steps, each block the same share. A tile
split between blocks is summed in the kernel by the block holding its last K steps (CUTLASS's
fixup): the others leave fp32 pieces in the layer's workspace and release a flag (zeroed by a
memset before the launch); one launch, no reduce kernel. Deterministic: bit for bit run to run on
one device (the split depends on its SM count). Measured (docs/CUDA_NOTES.md) it beats every
unsplit and split-K tactic only on long-K grids just over a wave (896x4864x4096: 60.3 us against
71.1), so only the 128x128 tile (the best stream-K tile there) is registered.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, cuda_tactic, defines
from polykit.kernels.cuda.gemm.epilogue import epilogue_args
from polykit.kernels.cuda.gemm.gemm_sm90 import (ARCHS, BK, ELEMS, FILE, TILES, Sm90Gemm, Sm90Tile, bk_of, kernel_for, layer_geometry, layer_storage, operands_of,
                                            predicted_us, tile_count, tile_kernels, tile_supports, workspace_geometry)

#: tiles with a stream-K tactic (the 128x256, 256x128, 128x192 and 64x128 ones, measured, won nowhere)
STREAMK_TILES = tuple(t for t in TILES if t.label == "128x128")
#: the fixup's cost where tiles are split (us): FIXUP_US (the flags' memset, 1.8 us as a graph
#: node, the pieces' stores and the waits) and SPAN_US for each block the most split tile spans
#: (its fixup block reads their pieces one after another), fitted to the H100 timings of 128x128
#: on nine GEMMs (docs/CUDA_NOTES.md)
FIXUP_US, SPAN_US = 4.0, 1.0


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

    def stored(self) -> int:
        """Pieces the blocks store for another block's fixup: one for each block whose range ends
        inside a tile (each written and read once)."""
        return sum(self.block_range(b)[1] % self.ktiles != 0 for b in range(self.grid if self.sk_tiles else 0))

    def span(self) -> int:
        """The most blocks any stream-K tile's steps lie in (1: no tile split; 0: no stream-K tiles)."""
        iters = self.sk_tiles * self.ktiles

        def block_of(x: int) -> int:  # gemm_sm90_streamk.cuh sk_block_of
            return ((x + 1) * self.grid + iters - 1) // iters - 1

        return max((block_of((t + 1) * self.ktiles - 1) - block_of(t * self.ktiles) + 1 for t in range(self.sk_tiles)),
                   default=0)


def schedule(tiles: int, ktiles: int, slots: int) -> StreamKSchedule:
    """The hybrid split: whole waves unsplit; a partial last wave spread alone where that gives
    every block a K step, else with the whole wave before (CUTLASS's choice always, each block's
    share one to two tiles: on the H100 never faster beyond the 0.5 us noise, 5 us slower on
    1280x2560x3072); every tile when there is less than a wave (then at most one block a K step)."""
    waves, rest = divmod(tiles, slots)
    if rest == 0:
        return StreamKSchedule(slots, tiles, 0, ktiles)
    if waves == 0:
        return StreamKSchedule(min(slots, tiles * ktiles), 0, tiles, ktiles)
    if rest * ktiles >= slots:
        return StreamKSchedule(slots, waves * slots, rest, ktiles)
    return StreamKSchedule(slots, (waves - 1) * slots, slots + rest, ktiles)


def schedule_of(geo: Sm90Gemm, tile: Sm90Tile, storage: str, sm_count: int) -> StreamKSchedule:
    return schedule(tile_count(geo, tile), -(-geo.K // bk_of(storage)), tile.blocks * sm_count)


def partial_bytes(tile: Sm90Tile, sched: StreamKSchedule) -> int:
    """The pieces' workspace: fp32 [grid][BM * BN], then int flags[grid] (gemm_sm90_streamk.cuh);
    none when no block stores a piece."""
    return 4 * sched.grid * (tile.bm * tile.bn + 1) if sched.stored() else 0


def streamk_us(tile: Sm90Tile, geo: Sm90Gemm, sm_count: int, tf32: bool = False) -> float:
    """predicted_us for the hybrid: the whole waves as the unsplit kernel prices them, then each
    block's share of the stream-K steps at the tile's rate and a start, and with split tiles the
    fixup (FIXUP_US, SPAN_US a block of the widest split)."""
    storage = "float32" if tf32 else "float16"
    sched = schedule_of(geo, tile, storage, sm_count)
    if not sched.sk_tiles:
        return predicted_us(tile, geo.M, geo.N, geo.K, geo.items, sm_count, tf32)
    rate = tile.tflops / (2 if tf32 else 1)
    step_us = 2.0 * tile.bm * tile.bn * bk_of(storage) * tile.blocks * sm_count / (rate * 1e6)
    dp_us = sched.dp_tiles // sched.grid * (sched.ktiles * step_us + 2.0)
    share_us = -(-sched.sk_tiles * sched.ktiles // sched.grid) * step_us + 2.0
    span = sched.span()
    return dp_us + share_us + (FIXUP_US + SPAN_US * span if span > 1 else 0.0)


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
        if found is None or not sm_count:
            return 0
        return partial_bytes(tile, schedule_of(found[0], tile, found[1], sm_count))

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
        if need:  # the flags after the pieces: every block's starts unreleased
            launcher.zero(partial + 4 * sched.grid * tile.bm * tile.bn, 4 * sched.grid)
        kernel = kernel_for(layer, tile, ELEMS[ops.storage], geo.b_mn, streamk=True)
        launcher.launch(kernel, (sched.grid,), (tile.threads,),
                        ops.kernel_args(tile) + [partial, sched.dp_tiles, sched.sk_tiles]
                        + epilogue_args(layer, tensors, ops.Y.dtype),
                        shared_mem=tile.smem_for(ops.storage, geo.b_mn, False))

    return enqueue


def compile_variants() -> list[KernelSource]:
    """The stream-K kernel of each stream-K tile with both B layouts for fp16, the 128x128 one for
    bf16 and for tf32 (CI: sm_90a)."""
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

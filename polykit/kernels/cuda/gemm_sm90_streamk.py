"""Stream-K on the Hopper GEMM (gemm_sm90.cu with STREAMK 1, gemm_sm90_streamk.cuh): against
wave quantization, grids of output tiles that leave SMs idle in their last wave (BERT-base bs8
FFN1: 192 tiles of 128x128 for 132 SMs, 1.45 waves).

Tactics `cuda.gemm.sm90_<BM>x<BN>_streamk` (fp16 / bf16 / tf32) take the layers their unsplit tile
takes. CUTLASS's data-parallel + stream-K hybrid (`schedule`): whole waves of tiles unsplit, the
rest spread over every persistent block by K steps, each block the same share: `_streamk` splits
the partial wave and the whole wave before it (CUTLASS's choice: every block's share is one to
two tiles), `_streamk1` the partial wave alone where each block then gets a K step. A tile split
between blocks is summed in the kernel by the block holding its last K steps (CUTLASS's fixup):
the others leave fp32 pieces in the layer's workspace and release a flag (zeroed by a memset
before the launch); one launch, no reduce kernel. Deterministic: bit for bit run to run on one
device (the split depends on its SM count).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, cuda_tactic, defines
from polykit.kernels.cuda.epilogue import epilogue_args
from polykit.kernels.cuda.gemm_sm90 import (ARCHS, BK, ELEMS, FILE, PARTIAL_BYTES_PER_US, TILES, Sm90Gemm, Sm90Tile,
                                            bk_of, kernel_for, layer_geometry, layer_storage, operands_of,
                                            predicted_us, tile_count, tile_kernels, tile_supports, workspace_geometry)

#: tiles with a stream-K tactic: one block an SM, the shapes whose waves are coarse
STREAMK_TILES = tuple(t for t in TILES if t.label in ("128x128", "128x256", "256x128", "128x192", "64x128"))
#: the fixup's cost past its pieces' traffic: the flags' memset and the wait at a split tile (us)
FIXUP_US = 2.0
#: tactic suffix -> whether the schedule also splits the whole wave before the partial one
SCHEDULES = {"streamk": True, "streamk1": False}


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


def schedule(tiles: int, ktiles: int, slots: int, extra_wave: bool = True) -> StreamKSchedule:
    """The hybrid split: whole waves unsplit; with a partial last wave, it and (extra_wave, or when
    the partial wave alone has fewer K steps than slots) the wave before, so each block's share is
    one to two tiles of K steps; or every tile when there is less than a wave (then at most one
    block a K step)."""
    waves, rest = divmod(tiles, slots)
    if rest == 0:
        return StreamKSchedule(slots, tiles, 0, ktiles)
    if waves == 0:
        return StreamKSchedule(min(slots, tiles * ktiles), 0, tiles, ktiles)
    if not extra_wave and rest * ktiles >= slots:
        return StreamKSchedule(slots, waves * slots, rest, ktiles)
    return StreamKSchedule(slots, (waves - 1) * slots, slots + rest, ktiles)


def schedule_of(geo: Sm90Gemm, tile: Sm90Tile, storage: str, sm_count: int, extra_wave: bool = True) -> StreamKSchedule:
    return schedule(tile_count(geo, tile), -(-geo.K // bk_of(storage)), tile.blocks * sm_count, extra_wave)


def partial_bytes(tile: Sm90Tile, sched: StreamKSchedule) -> int:
    """The pieces' workspace: fp32 [grid][BM * BN], then int flags[grid] (gemm_sm90_streamk.cuh);
    none when no block stores a piece."""
    return 4 * sched.grid * (tile.bm * tile.bn + 1) if sched.stored() else 0


def streamk_us(tile: Sm90Tile, geo: Sm90Gemm, sm_count: int, tf32: bool = False, extra_wave: bool = True) -> float:
    """predicted_us for the hybrid: the whole waves as the unsplit kernel prices them, then each
    block's share of the stream-K steps at the tile's rate and a start, and with split tiles the
    fixup (the memset and a wait, the stored pieces written and read once)."""
    storage = "float32" if tf32 else "float16"
    sched = schedule_of(geo, tile, storage, sm_count, extra_wave)
    if not sched.sk_tiles:
        return predicted_us(tile, geo.M, geo.N, geo.K, geo.items, sm_count, tf32)
    rate = tile.tflops / (2 if tf32 else 1)
    step_us = 2.0 * tile.bm * tile.bn * bk_of(storage) * tile.blocks * sm_count / (rate * 1e6)
    dp_us = sched.dp_tiles // sched.grid * (sched.ktiles * step_us + 2.0)
    share_us = -(-sched.sk_tiles * sched.ktiles // sched.grid) * step_us + 2.0
    stored = sched.stored()
    if not stored:
        return dp_us + share_us
    return dp_us + share_us + FIXUP_US + 2 * 4 * tile.bm * tile.bn * stored / PARTIAL_BYTES_PER_US


def _estimate(tile: Sm90Tile, extra_wave: bool):
    def estimate(layer: Any, sm_count: int) -> float | None:
        geo = layer_geometry(layer)
        if geo is None or not sm_count:
            return None
        return streamk_us(tile, geo, sm_count, layer_storage(layer) == "float32", extra_wave)

    return estimate


def _workspace(tile: Sm90Tile, extra_wave: bool):
    def workspace(layer: Any, tensors: Mapping[str, Any], sm_count: int) -> int:
        found = workspace_geometry(layer, tensors)
        if found is None or not sm_count:
            return 0
        return partial_bytes(tile, schedule_of(found[0], tile, found[1], sm_count, extra_wave))

    return workspace


def _enqueue(tile: Sm90Tile, extra_wave: bool):
    def enqueue(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor]) -> None:
        ops = operands_of(layer, tensors, "sm90 stream-K GEMM kernel")
        geo = ops.geo
        sched = schedule_of(geo, tile, ops.storage, launcher.sm_count, extra_wave)
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
    bf16 and for tf32 (CI: sm_90a; both schedules run the same kernel)."""
    def unit(elem: str, tile: Sm90Tile, b_mn: bool) -> KernelSource:
        return KernelSource("gemm_sm90", file=FILE, defines=defines(ELEM=elem, STREAMK=1) + tile.defines(b_mn),
                            arch="sm_90a")

    out = [unit("half_t", t, b_mn) for t in STREAMK_TILES for b_mn in (True, False)]
    return out + [unit("bf16_t", STREAMK_TILES[0], True), unit("float", STREAMK_TILES[0], False)]


for _tile in STREAMK_TILES:
    for _suffix, _extra in SCHEDULES.items():
        for _kind in ("MatMul", "Gemm"):
            cuda_tactic(_kind, f"cuda.gemm.sm90_{_tile.label}_{_suffix}", kernels=tile_kernels(_tile, False, streamk=True),
                        supports=tile_supports(_tile, False), priority=30, archs=ARCHS,
                        estimate=_estimate(_tile, _extra), workspace=_workspace(_tile, _extra),
                        params={"bm": _tile.bm, "bn": _tile.bn, "bk": BK, "msub": _tile.msub,
                                "consumers": _tile.consumers, "stages": _tile.stages, "streamk": 1 + int(not _extra)})(
                _enqueue(_tile, _extra))

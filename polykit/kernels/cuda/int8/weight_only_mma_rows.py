"""WeightOnlyMatMul on tensor cores with the weights as the mma's A operand (weight_only_mma_rows.cu).

Tactics `cuda.weight_only.mma_rows_n<weight rows a block>_k<K a block>` take what weight_only_mma_staged.py's
tactics take (float16 / bfloat16 X, int4 / uint4 weights, K a multiple of 16, N x K-blocks below 2^31) where the
block size is a multiple of 128 (a 128-element slice of a row in one scale block: the kernel scales a slice's
float32 mma sums, one scale a row a slice); other blocks are refused (supports() False; a hand-built layer at
enqueue: a DeviceError that says so). The weights (value - zero point, exact, never times the scale in 16 bits)
are the mma's A (16 weight rows x 16 K), X rows its B (8 a column tile; two at M > 8), so a weight costs about
half the instructions of the staged kernel's B-operand decode (weight_only_mma_rows.cu's header counts ~1.8 / ~1.65
lane-instructions a weight at M = 1 for 1 / 2 row tiles a warp: ESTIMATES, not measured). The staged kernel's
geometry otherwise: all of a warp's loads back to back before any math, X staged once a block by cp.async, WK warps
over K summed in fixed order in shared memory, K past a block's range split over gridDim.z into a float32
workspace that weight_only_mma_staged.cu's weight_only_mma_reduce adds in split order, then the bias
(deterministic). `rows_us` is the model (weight_only_mma_staged.py's staged_us with this kernel's counts).

Priority 11, beside weight_only_mma's tiles and the staged ring tiles, below the measured staged tiles' 12: their
gpu tests pass (H100, 2026-12-07) and a timed build times them beside the staged tiles, which stayed faster (10.0 /
10.1 us against 9.1 at M = 1, N = K = 4096; 14.7 against 13.4 at M = 16: docs/PERFORMANCE.md, twenty-first session);
host-emulated in tests/kernels/cuda/test_weight_only_rows_emulated.py.
ptxas -v (NVRTC 13.5 through cuda.core, sm_80 and sm_90, 2026-12-07, no GPU needed): at most 128 registers a thread for
every tile and activation type, 0 bytes spilled (that test checks <= 128 and no spills).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.ops.quant.weight_only import KIND, X, padded_row_bytes
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, cuda_tactic, defines
from polykit.kernels.cuda.int8.weight_only import (DRAM_BYTES_PER_US, FIXED_US, ISSUE_PER_US_PER_SM, MAX_GRID_Y,
                                                   STEP_LATENCY_US, layer_sources)
from polykit.kernels.cuda.int8.weight_only_mma import (ELEM_BYTES, ELEMS, ROW_TILE, SLICE, estimate_of, refusal)
from polykit.kernels.cuda.int8.weight_only_mma_staged import (ARCHS, DRAM_LATENCY_US, L2_BYTES_PER_US,
                                                              REDUCE, REDUCE_US, REGS_SM, REGS_THREAD,
                                                              SCHEDULERS, SMEM_PER_SM, SMEM_RESERVE, STAGED_TILES,
                                                              launch_split, split_workspace, staged_supports)

FILE = "weight_only_mma_rows.cu"
KERNEL = "weight_only_mma_rows"
#: a block size must be a multiple of this (one scale a row a 128-element slice)
ROWS_BLOCK = SLICE
#: lane-instructions a weight at M = 1 (weight_only_mma_rows.cu's header, ESTIMATES counted from the source, not
#: measured): the decode without the scale by activation type (9 / 15 a word of 8 codes); the mma (2 steps for 2
#: words of 8); a slice's scale work (scale / zero point loads, conversions, the 4 fma of C) over 64 weights; the
#: chunk loads and the stream's steps; X's lds.128 and 4 prmt a word, over 16 weights a lane and the row tiles
ROWS_DEQUANT_OPS = {"float16": 1.125, "bfloat16": 1.875}
ROWS_MMA_OPS, ROWS_SLICE_OPS, ROWS_CHUNK_OPS, ROWS_X_OPS = 0.125, 0.25, 0.05, 5.0 / 16


@dataclass(frozen=True)
class RowsTile:
    """weight_only_mma_rows's shape: `warps_n` x `warps_k` warps, `tiles` 16-row weight tiles a warp, `slices`
    K slices a warp holds in flight at once (2 * tiles * slices 16-byte loads a lane)."""

    warps_n: int
    warps_k: int
    tiles: int
    slices: int

    @property
    def threads(self) -> int:
        return 32 * self.warps_n * self.warps_k

    @property
    def cols(self) -> int:
        """A block's weight rows (Y columns)."""
        return 16 * self.tiles * self.warps_n

    @property
    def k_block(self) -> int:
        return SLICE * self.warps_k * self.slices

    @property
    def name(self) -> str:
        return f"cuda.weight_only.mma_rows_n{self.cols}_k{self.k_block}"

    def in_flight(self) -> int:
        return self.threads * self.slices * self.tiles * 2 * 16

    def splits(self, k: int) -> int:
        return -(-k // self.k_block)

    def smem_bytes(self, m: int, k: int) -> int:
        """Dynamic shared memory: min(16, M) staged X rows (weight_only_mma.cuh's wq_stage_ld), then the warps'
        chunks in flight (in_flight(); the block's partial sums reuse them)."""
        return min(ROW_TILE, m) * (min(self.k_block, -(-k // SLICE) * SLICE) + 8) * ELEM_BYTES + self.in_flight()

    @property
    def reg_blocks(self) -> int:
        """Blocks an SM asked of ptxas (REGS_THREAD registers a thread at most)."""
        return max(1, REGS_SM // (REGS_THREAD * self.threads))

    def sm_blocks(self, m: int, k: int) -> int:
        smem = self.smem_bytes(m, k) + SMEM_RESERVE
        return max(1, min(self.reg_blocks, SMEM_PER_SM // smem))

    def source(self, elem: str, kernel: str = KERNEL) -> KernelSource:
        return KernelSource(kernel, file=FILE, defines=defines(ELEM=elem, WN=self.warps_n, WK=self.warps_k,
                                                               RT=self.tiles, SW=self.slices,
                                                               WR_MIN_BLOCKS=self.reg_blocks))


#: decode: 16 weight rows and all of K = 4096 a block of 8 warps over K, 4 slices a warp (256 threads, 2 blocks an SM:
#: 64 KB in flight an SM, N = 4096's 256 blocks in one wave); the same over K = 2048 with 2 slices a warp (a split in
#: 2 at K = 4096); small batches: 32 rows as 2 tiles a warp over K = 2048 (X's B words shared by both tiles, 1 slice a
#: warp, 16 warps), 64 rows over K = 1024 (X read 4x less than at 16 rows; 4 splits). The chunks wait in shared memory
#: (cp.async), so a tile's slices cost no registers in flight; 2 tiles of 2 slices a warp (16 warps) still spilled 20
#: bytes at 128 registers (ptxas -v, NVRTC 13.5, 2026-12-07), so no tile has 4 chunks of 2 row tiles a lane. Wider
#: blocks for M = 9..16, where each block stages its K range of 16 X rows (128 KB at K = 4096) and N / cols blocks
#: read X again: 32 rows over all of K = 4096 as 2 x 8 warps of 4 slices (one wave of 128 blocks at N = 4096, no
#: split; X 16 MB from L2 at M = 16 where n16's 256 blocks read 32 MB in two waves) and 64 rows over K = 2048
#: (4 x 4 warps of 4 slices: 128 blocks, 2 splits, X 8 MB)
ROWS_TILES = (RowsTile(1, 8, 1, 4), RowsTile(1, 8, 1, 2), RowsTile(1, 16, 2, 1), RowsTile(4, 4, 1, 2),
              RowsTile(2, 8, 1, 4), RowsTile(4, 4, 1, 4))


def rows_us(tile: RowsTile, m: int, n: int, k: int, block: int, elem: str, sm_count: int) -> float:
    """weight_only_mma_rows's predicted time: weight_only_mma_staged.py's staged_us model (DRAM stretched below
    Little's law, L2 bytes, the math left when the last bytes land, issue, dependent round trips, launch and the
    reduce) with this kernel's instruction counts a weight (ROWS_*: estimates)."""
    tiles, col_blocks, splits = -(-m // ROW_TILE), -(-n // tile.cols), tile.splits(k)
    grid_y = min(tiles, MAX_GRID_Y)
    blocks, passes = col_blocks * grid_y * splits, -(-tiles // grid_y)
    nb = -(-k // block)
    slots = sm_count * tile.sm_blocks(m, k)
    resident = min(blocks, slots)
    weight = (n * padded_row_bytes(k, 4) + n * nb * (ELEM_BYTES + 1)) * tiles
    dram = (weight + m * n * ELEM_BYTES) / DRAM_BYTES_PER_US
    dram *= max(1.0, DRAM_BYTES_PER_US * DRAM_LATENCY_US / (resident * tile.in_flight()))
    staged = col_blocks * m * k * ELEM_BYTES + (2 * splits * m * n * 4 if splits > 1 else 0)
    through_l2 = (weight + staged) / L2_BYTES_PER_US
    column_tiles = 2.0 if m > 8 else 1.0
    per_element = ROWS_DEQUANT_OPS[elem] + ROWS_SLICE_OPS + ROWS_CHUNK_OPS + \
        column_tiles * (ROWS_MMA_OPS + ROWS_X_OPS / tile.tiles)
    issue = n * splits * tile.k_block * tiles * per_element / 32 / (ISSUE_PER_US_PER_SM * sm_count)
    ring = tile.slices * SLICE * 16 * tile.tiles * per_element / 32  # warp-instructions of one warp's ring
    warps_sm = -(-resident // sm_count) * tile.threads // 32
    load = min(1.0, issue / max(dram, through_l2))
    tail = ring * max(1.0, load * warps_sm / SCHEDULERS) / (ISSUE_PER_US_PER_SM / SCHEDULERS)
    waves = -(-blocks // slots)
    chain = waves * passes * 2 * STEP_LATENCY_US
    spread = sm_count / min(blocks, sm_count) * (waves * slots / blocks if blocks > slots else 1.0)
    reduce = REDUCE_US + 2 * splits * m * n * 4 / DRAM_BYTES_PER_US if splits > 1 else 0.0
    return max(max(dram, through_l2) * spread + tail, issue * spread, chain) + FIXED_US + reduce


def rows_supports(layer: Any) -> bool:
    """The staged tactics' conditions and a block size that is a multiple of 128."""
    return staged_supports(layer) and int(layer.attrs.get("block_size", 0)) % ROWS_BLOCK == 0


def rows_refusal(layer: Any, tactic: str) -> DeviceError:
    """The error of a rows tactic enqueued on a layer whose block size is not a multiple of 128."""
    return DeviceError(f"WeightOnlyMatMul {tactic} scales a 128-element slice of a row at once and takes blocks of a "
                       f"multiple of {ROWS_BLOCK}: got block {layer.attrs.get('block_size')}",
                       where=f"layer {layer.name!r}",
                       hint="choose another cuda.weight_only tactic (the mma_staged tiles take blocks of 32)")


def reduce_source(elem: str) -> KernelSource:
    """weight_only_mma_staged.cu's reduce (the same parameter list) from the unit of the first staged tile: no
    compile of its own."""
    return STAGED_TILES[0].source(elem, REDUCE)


def _rows_tactic(tile: RowsTile):
    def kernels(layer: Any) -> list[KernelSource]:
        mains = layer_sources(layer, tile.source, ELEMS, "half_t")
        return mains + layer_sources(layer, reduce_source, ELEMS, "half_t")

    estimate = estimate_of(rows_us, tile)

    def enqueue(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor]) -> None:
        from polykit.kernels.cuda.int8.weight_only_mma import supports

        x = tensors[layer.inputs[X]].dtype.name
        if x not in ELEMS or not supports(layer):
            raise refusal(layer, tile.name, x)
        if int(layer.attrs["block_size"]) % ROWS_BLOCK:
            raise rows_refusal(layer, tile.name)
        launch_split(layer, launcher, tensors, tile, reduce_source(ELEMS[x]))

    return kernels, estimate, enqueue


def compile_variants() -> list[KernelSource]:
    """Every activation type with every tile (the reduce is the staged tiles' unit, compiled with them)."""
    return [tile.source(elem) for elem in ELEMS.values() for tile in ROWS_TILES]


# priority 11: not yet timed on a GPU (the module docstring)
for _tile in ROWS_TILES:
    _kernels, _estimate, _enqueue = _rows_tactic(_tile)
    cuda_tactic(KIND, _tile.name, kernels=_kernels, supports=rows_supports, priority=11, estimate=_estimate,
                workspace=split_workspace(_tile), domain=POLYKIT_DOMAIN, archs=ARCHS,
                params={"warps_n": _tile.warps_n, "warps_k": _tile.warps_k, "tiles": _tile.tiles,
                        "slices": _tile.slices})(_enqueue)

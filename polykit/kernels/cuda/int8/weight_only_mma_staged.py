"""WeightOnlyMatMul on tensor cores with X staged and every load up front (weight_only_mma_staged.cu).

Tactics `cuda.weight_only.mma_staged_c<columns a block>_k<K a block>[_p<groups>]` take what weight_only_mma.py's
tactics take (float16 / bfloat16 X, int4 / uint4 weights, K a multiple of 16, blocks a multiple of 32) with
their per-lane math (the reference's weight bit for bit, float32 sums in fixed orders; a decode row tile of
at most 8 rows with blocks of a multiple of 128 scales each slice's sums instead: the .cu's scale-after): a
block of WN x WK warps owns 8 * NT * WN columns and a K range of 128 * WK * SW * groups elements, each warp issues its first
SW * NT 16-byte weight loads back to back before any math (with groups > 1, a ring: slice q + SW loads as
slice q's math ends), and the block stages its X rows once in shared memory by cp.async. K longer
than a block's range is split over blocks (gridDim.z) into a float32 workspace that weight_only_mma_reduce
adds in split order, then the bias (deterministic). weight_only_mma_staged.cu's header gives the why (the
ncu profile of weight_only_mma: latency bound) and the predicted times; `staged_us` is that model.

Priority 12, above weight_only_mma's 11: their gpu tests pass (H100 2026-12-06, STEP=new11: 1302 passed) and a
timed build picks a staged tile at M = 1 and M = 16 (N = K = 4096, benchmarks/weight_only_gemm.py: 10.1 / 14.5 us
against the fp16 GEMM's 16.0 / 15.6 us, docs/PERFORMANCE.md twelfth session), so a level-0 build takes what the
timed builds take; weight_only_mma's tiles stay candidates under them. The ring tiles (_p2, groups > 1; docs/INT8.md
"W4A16 staged kernel, loads back to back") pass their gpu tests but lost to the staged tiles at M = 1 and 16 in a
level-5 build (H100 2026-12-06: 9.4 / 13.2 us on c16_k4096 / c32_k4096): priority 11, beside weight_only_mma's tiles,
so a level-0 build keeps the measured tiles and a timed build times the ring tiles where its cap reaches them. Host-emulated too
(tests/kernels/cuda/test_weight_only_mma_emulated.py).

Rolled tiles (`..._r`, ROLLED_TILES; the .cu's XS_ROLLED, twenty-fourth session, NOT yet run on a GPU): c16_k4096 and
c32_k4096 whose decode blocks (M <= 8, blocks a multiple of 128, within N and K) land their weights in shared memory by
cp.async and run one slice body SW times, where the unrolled tiles run ~1,400 SASS instructions once (ncu, H100: 57 %
of a warp's stall cycles waiting for instructions). The same sums bit for bit (host emulation against the unrolled
tile). Priority 11: a timed build times them beside the measured tiles; a level-0 build keeps those.

Row tiles of at most 8 rows swap the mma's operands (the .cu header; 2026-12-07, twenty-second session): at M = 1
the level-5 build timed c16_k4096 at 8.1 us, c32_k4096 8.0, c16_k4096_p2 8.2 (H100, 968d1ee4; 9.1 / 9.4 before), and
at M = 16 c32_k4096 at 12.5 (13.4 before), where weight_only_mma_rows.py's n32_k4096 took 12.3.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.ops.quant.weight_only import KIND, W, X, padded_row_bytes
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, cuda_tactic, defines
from polykit.kernels.cuda.int8.weight_only import (DRAM_BYTES_PER_US, FIXED_US, ISSUE_PER_US_PER_SM, MAX_GRID_Y,
                                                   STEP_LATENCY_US, layer_sources, weight_only_args)
from polykit.kernels.cuda.int8.weight_only_mma import (DEQUANT_OPS, ELEM_BYTES, ELEMS, MMA_OPS, ROW_TILE, SLICE,
                                                       X_OPS_A_WORD, estimate_of, refusal, supports)

FILE = "weight_only_mma_staged.cu"
KERNEL, REDUCE = "weight_only_mma_staged", "weight_only_mma_reduce"
REDUCE_BLOCK = 256
#: GPUs whose blocks may take the staged X (up to 16 x 4104 x 2 bytes and 16 KB of partial sums, 147 KB):
#: A100 (163 KB a block) and H100 / H200 (227 KB); sm_86 / sm_89 give a block 99 KB
ARCHS = ("sm_80", "sm_90")
#: bytes an SM's shared memory holds for blocks (sm_80 164 KB, sm_90 228 KB: the H100 / H200 this is for),
#: a block's reserve; an SM's registers and the most a thread may take (__launch_bounds__ asks ptxas for
#: REGS_SM / REGS_THREAD / threads blocks an SM: 2 of 256 threads, 1 of 512; a ring tile's thread REGS_RING:
#: 3 blocks of 128 threads, 1 of 256)
SMEM_PER_SM, SMEM_RESERVE, REGS_SM, REGS_THREAD, REGS_RING = 228 * 1024, 1024, 65536, 128, 168
#: X re-reads and the workspace come from L2 (assumed ~5.5 TB/s on an H100; not measured here); a second
#: launch (the reduce) costs about this much on the stream besides its bytes; warp schedulers an SM (a warp
#: issues at most one instruction a cycle: ISSUE_PER_US_PER_SM / SCHEDULERS)
L2_BYTES_PER_US, REDUCE_US, SCHEDULERS = 5.5e6, 1.5, 4
#: DRAM's loaded latency (assumed, not measured here): the bytes in flight over all SMs that DRAM_BYTES_PER_US
#: needs (Little's law); fewer stretch the DRAM time in proportion
DRAM_LATENCY_US = 1.0
#: instructions a lane-element of a chunk's address, predicate, scale and zero point (weight_only_mma's
#: CHUNK_OPS is 0.4): estimated, ~8 a 32-element chunk, from the SASS of c16_k4096 (benchmarks/cuda_sass.py
#: --w4: the 8 chunk loads in 29 instructions, the scale / zero point loads and the block's step besides)
STAGED_CHUNK_OPS = 0.25


@dataclass(frozen=True)
class StagedTile:
    """weight_only_mma_staged's shape: `warps_n` x `warps_k` warps, `tiles` n8 tiles a warp, `slices` K
    slices a warp in flight at once (slices * tiles 16-byte loads a lane), `groups` such groups a warp
    streams through that ring (the kernel's PG: slice q + slices loads as slice q's math ends)."""

    warps_n: int
    warps_k: int
    tiles: int
    slices: int
    groups: int = 1
    #: the .cu's XS_ROLLED: decode's blocks (M <= 8, blocks a multiple of 128, within N and K) land their weights in
    #: shared memory and run one slice body `slices` times (xs_rolled); the name ends in _r
    rolled: bool = False

    @property
    def threads(self) -> int:
        return 32 * self.warps_n * self.warps_k

    @property
    def cols(self) -> int:
        return 8 * self.tiles * self.warps_n

    @property
    def k_block(self) -> int:
        """Elements of K a block sums (the split's length)."""
        return SLICE * self.warps_k * self.slices * self.groups

    @property
    def name(self) -> str:
        ring = f"_p{self.groups}" if self.groups > 1 else ""
        return f"cuda.weight_only.mma_staged_c{self.cols}_k{self.k_block}{ring}{'_r' if self.rolled else ''}"

    def in_flight(self) -> int:
        """Weight bytes a block has in flight at once (a lane's ring of slices * tiles 16-byte chunks)."""
        return self.threads * self.slices * self.tiles * 16

    def splits(self, k: int) -> int:
        return -(-k // self.k_block)

    def smem_bytes(self, m: int, k: int) -> int:
        """Dynamic shared memory: min(16, M) staged X rows of the block's K range (at most K rounded up to
        a slice) and 16 bytes of pad (weight_only_mma.cuh's wq_stage_ld); a rolled tile's weight slots before them
        (the .cu's XS_WBUF_BYTES: 16 bytes a lane a chunk of its ring)."""
        slots = self.threads * self.slices * self.tiles * 16 if self.rolled else 0
        return slots + min(ROW_TILE, m) * (min(self.k_block, -(-k // SLICE) * SLICE) + 8) * ELEM_BYTES

    def part_bytes(self) -> int:
        return self.warps_k * ROW_TILE * self.cols * 4

    @property
    def regs(self) -> int:
        """Registers a thread may take: REGS_THREAD, REGS_RING where a warp streams several groups (its ring
        and the stream's pointers stay live through the math: ptxas spills at 128)."""
        return REGS_THREAD if self.groups == 1 else REGS_RING

    @property
    def reg_blocks(self) -> int:
        """Blocks an SM holds by registers (`regs` a thread at most: ptxas is asked for this many)."""
        return max(1, REGS_SM // (self.regs * self.threads))

    def sm_blocks(self, m: int, k: int) -> int:
        """Blocks an SM holds: by registers, fewer where the staged X does not fit as often."""
        smem = self.smem_bytes(m, k) + self.part_bytes() + SMEM_RESERVE
        return max(1, min(self.reg_blocks, SMEM_PER_SM // smem))

    def source(self, elem: str, kernel: str = KERNEL) -> KernelSource:
        rolled = defines(XS_ROLLED=1) if self.rolled else ()
        return KernelSource(kernel, file=FILE, defines=defines(ELEM=elem, WN=self.warps_n, WK=self.warps_k,
                                                               NT=self.tiles, SW=self.slices,
                                                               PG=self.groups, XS_MIN_BLOCKS=self.reg_blocks) + rolled)


#: decode (16 columns and all of K = 4096 a block: 256 blocks, 2 an SM, no split, the staged X 8 KB at M = 1);
#: small batches: 32 columns and all of K = 4096 (16 warps, 128 blocks of one an SM: X, re-read once a
#: block, costs half, no split), 32 / 64 columns over K 2048 / 1024 (X 2x / 4x less, 256 blocks, for a
#: split in 2 / 4 and its reduce); then warps streaming 2 groups through their ring (_p2: fewer
#: bytes in flight an SM, so less math left after the last bytes land, staged_us): 16 / 32 columns and K =
#: 4096 a block with half the warps (32 KB in flight an SM at M = 1, still above what DRAM wants). (Not tiles:
#: 8 columns, one n8 tile a warp, wins the GPT-2 768 shapes in the model but reads X 4x over at M = 16, above
#: weight_only_mma there; 32 columns with a quarter of the warps and 4 groups, M = 1's best at N or K = 11008
#: in the model, spills at 168 registers on sm_90.)
STAGED_TILES = (StagedTile(1, 8, 2, 4), StagedTile(2, 8, 2, 4), StagedTile(2, 4, 2, 4), StagedTile(4, 2, 2, 4),
                StagedTile(1, 4, 2, 4, 2), StagedTile(2, 4, 2, 4, 2))
#: decode's tiles with the rolled slice body (XS_ROLLED, the twenty-fourth session; untimed): c16_k4096 and
#: c32_k4096, the tiles timed builds take at M = 1
ROLLED_TILES = (StagedTile(1, 8, 2, 4, rolled=True), StagedTile(2, 8, 2, 4, rolled=True))
#: the rolled tiles' GPUs: their weight slots (32 / 64 KB a block) beside 16 staged X rows of K = 4096 (131 KB) and
#: the partial sums pass an A100's 163 KB a block at M > 8 (c32_k4096_r: 211 KB); an H100 / H200 block takes 227 KB
ROLLED_ARCHS = ("sm_90",)


def staged_us(tile: StagedTile, m: int, n: int, k: int, block: int, elem: str, sm_count: int) -> float:
    """weight_only_mma_staged's predicted time (for ordering candidates; weight_only.gemv_us's constants,
    weight_only_mma_staged.cu's header): the slowest of the DRAM traffic (packed weights, scales and zero points once a
    row tile, Y; stretched where the bytes in flight fall short of Little's law), every byte into the SMs at L2 speed
    (those, X once a block, the split's workspace written and read) followed by the math left when the last bytes land
    (one warp's ring where the math keeps well ahead of the bytes, up to every ring in flight on a scheduler, warps /
    SCHEDULERS of them, as the math's load nears 1), its issued instructions and its dependent round trips (one load
    wave and the block's sum a row tile and wave), plus launch and, split, the reduce's launch."""
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
    per_element = DEQUANT_OPS[elem] + MMA_OPS + STAGED_CHUNK_OPS + \
        X_OPS_A_WORD * (1.0 if m > 8 else 0.5) / 8 / tile.tiles
    issue = n * splits * tile.k_block * tiles * per_element / 32 / (ISSUE_PER_US_PER_SM * sm_count)
    ring = tile.slices * SLICE * 8 * tile.tiles * per_element / 32  # warp-instructions of one warp's ring
    warps_sm = -(-resident // sm_count) * tile.threads // 32
    # left when the last bytes land: one ring where the math keeps well ahead of the bytes, every ring in
    # flight on a scheduler (warps / SCHEDULERS) where it only just keeps up (load: math over stream time)
    load = min(1.0, issue / max(dram, through_l2))
    tail = ring * max(1.0, load * warps_sm / SCHEDULERS) / (ISSUE_PER_US_PER_SM / SCHEDULERS)
    waves = -(-blocks // slots)
    chain = waves * passes * 2 * STEP_LATENCY_US
    spread = sm_count / min(blocks, sm_count) * (waves * slots / blocks if blocks > slots else 1.0)
    reduce = REDUCE_US + 2 * splits * m * n * 4 / DRAM_BYTES_PER_US if splits > 1 else 0.0
    return max(max(dram, through_l2) * spread + tail, issue * spread, chain) + FIXED_US + reduce


def _sizes(layer: Any, tensors: Mapping[str, Any]) -> tuple[int, int, int] | None:
    """(M, N, K) from the bound tensors (shapes), else None."""
    x, w = tensors.get(layer.inputs[X]), tensors.get(layer.inputs[W])
    if x is None or w is None or len(w.shape) != 2 or len(x.shape) < 2:
        return None
    m = 1
    for d in x.shape[:-1]:
        m *= int(d)
    return m, int(w.shape[0]), int(layer.attrs["K"])


def split_workspace(tile: Any):
    """The float32 workspace a K-split tile (this module's or weight_only_mma_rows.py's) borrows at enqueue."""

    def workspace(layer: Any, tensors: Mapping[str, Any], sm_count: int) -> int:
        sizes = _sizes(layer, tensors)
        if sizes is None or tile.splits(sizes[2]) == 1:
            return 0
        m, n, k = sizes
        return 4 * tile.splits(k) * m * n

    return workspace


def _staged_tactic(tile: StagedTile):
    def kernels(layer: Any) -> list[KernelSource]:
        mains = layer_sources(layer, tile.source, ELEMS, "half_t")
        return mains + [replace(main, name=REDUCE) for main in mains]

    estimate = estimate_of(staged_us, tile)

    def enqueue(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor]) -> None:
        x = tensors[layer.inputs[X]].dtype.name
        if x not in ELEMS or not supports(layer):
            raise refusal(layer, tile.name, x)
        launch_split(layer, launcher, tensors, tile, tile.source(ELEMS[x], REDUCE))

    return kernels, estimate, enqueue


#: the staged kernel indexes scales and zero points with 32-bit ints: N x blocks a row below this
MAX_SCALES = 2**31


def launch_split(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor], tile: Any,
                 reduce: KernelSource) -> None:
    """Launch a K-split weight-only kernel of `tile` (this module's, or weight_only_mma_rows.py's: the same
    parameter list, geometry properties and split rule) on the layer's tensors: one z a split into a borrowed
    float32 workspace, then `reduce` (weight_only_mma_reduce) where K splits; nothing for an empty Y."""
    sizes, args = weight_only_args(layer, tensors)
    m, n, k = sizes["M"], sizes["N"], sizes["K"]
    if m == 0 or n == 0:
        return
    nb = -(-k // int(layer.attrs["block_size"]))
    if n * nb >= MAX_SCALES:  # the kernel indexes scales and zero points with 32-bit ints
        raise DeviceError(f"WeightOnlyMatMul {tile.name} indexes scales with 32-bit integers: N {n} x {nb} "
                          "blocks a row is past 2^31", where=f"layer {layer.name!r}",
                          hint="choose another cuda.weight_only tactic (weight_only_mma indexes with 64 bits)")
    splits = tile.splits(k)
    ws = 0
    if splits > 1:
        nbytes = 4 * splits * m * n
        ws = launcher.workspace(nbytes)
        if not ws:
            raise DeviceError(f"WeightOnlyMatMul {tile.name} splits K in {splits} and needs {nbytes} bytes of "
                              "workspace; the launcher lent none", where=f"layer {layer.name!r}",
                              hint="run the layer through an engine or harness that lends workspace")
    args = args + [ws, splits]
    x = tensors[layer.inputs[X]].dtype.name
    grid = (-(-n // tile.cols), min(-(-m // ROW_TILE), MAX_GRID_Y), splits)
    launcher.launch(tile.source(ELEMS[x]), grid, (tile.threads,), args, shared_mem=tile.smem_bytes(m, k))
    if splits > 1:
        blocks = max(1, min(-(-m * n // REDUCE_BLOCK), 16 * launcher.sm_count))
        launcher.launch(reduce, (blocks,), (REDUCE_BLOCK,), args)


def staged_supports(layer: Any) -> bool:
    """weight_only_mma's conditions, and N x K-blocks below MAX_SCALES where the build knows N (a layer past it
    goes to weight_only_mma, which indexes with 64 bits; one of unknown N is checked at enqueue)."""
    if not supports(layer):
        return False
    shapes = getattr(layer, "in_shapes", None)
    n = shapes[1][0] if shapes and shapes[1] else None
    return not isinstance(n, int) or n * -(-int(layer.attrs["K"]) // int(layer.attrs["block_size"])) < MAX_SCALES


def compile_variants() -> list[KernelSource]:
    """Every activation type with every tile (the reduce is in the same unit)."""
    return [tile.source(elem) for elem in ELEMS.values() for tile in STAGED_TILES + ROLLED_TILES]


# priority 12: measured ahead of weight_only_mma's tiles at M = 1 and 16; the ring tiles, slower there, 11 (the module
# docstring); the rolled tiles, never timed yet, 11 too: a level-0 build keeps the measured tiles, a timed one times them
for _tile in STAGED_TILES + ROLLED_TILES:
    _kernels, _estimate, _enqueue = _staged_tactic(_tile)
    cuda_tactic(KIND, _tile.name, kernels=_kernels, supports=staged_supports,
                priority=12 if _tile.groups == 1 and not _tile.rolled else 11,
                estimate=_estimate,
                workspace=split_workspace(_tile), domain=POLYKIT_DOMAIN, archs=ROLLED_ARCHS if _tile.rolled else ARCHS,
                params={"warps_n": _tile.warps_n, "warps_k": _tile.warps_k, "tiles": _tile.tiles,
                        "slices": _tile.slices, "groups": _tile.groups, "rolled": int(_tile.rolled)})(_enqueue)

"""WeightOnlyMatMul on tensor cores (weight_only_mma.cu): W4A16 at small M with mma.sync m16n8k16.

Tactics `cuda.weight_only.mma_m16_k<WK>_c<columns a block>`: X float16 / bfloat16 [..., M, K] (rows
folded into M, tiles of 16 rows stepping over any M), the weight int4 / uint4 dequantized with packed
16-bit math into the mma's B operand (bit for bit DequantizeLinear's value), K a multiple of 16, a
block size a multiple of 32; zero points and bias optional. float32 activations, float4 / 8-bit
weights and other K or blocks are refused (weight_only.py's kernels take them). A block of WK warps
splits K (a fixed-order reduction in shared memory: deterministic) for 8 * NT columns. They predict
their cost (`mma_us`, weight_only_mma.cu's header counts it) so the builder times the likeliest first.

Priority 11, above the plain weight-only tactics (m1's 10, the bw_* gemv tiles' 9): their gpu tests pass
(H100 2026-12-06, STEP=new9: 1253 passed) and a timed build picks mma_m16_k8_c16 at M = 1 and M = 16 at
N = K = 4096, where the layer alone takes 11.3 / 14.2 us against the fp16 GEMM's 16.2 / 15.8 us (H100,
benchmarks/weight_only_gemm.py, docs/PERFORMANCE.md); the gemv tiles took 26.5 / 90.6 us (H200). A level-0
build now takes what the timed builds take. It is latency bound (weight_only_mma.cu's header: ncu at M = 1);
weight_only_mma_staged.py's tactics, the geometry built to keep DRAM busy, ran and were timed after
(H100 2026-12-06: 10.1 us at M = 1) and rank a priority above these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.ops.quant.weight_only import KIND, X, padded_row_bytes
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, cuda_tactic, defines
from polykit.kernels.cuda.int8.weight_only import (DRAM_BYTES_PER_US, FIXED_US, ISSUE_PER_US_PER_SM, MAX_GRID_Y,
                                                   STEP_LATENCY_US, layer_sources, static_sizes,
                                                   supports as weight_only_supports, weight_only_args)

FILE = "weight_only_mma.cu"
KERNEL = "weight_only_mma"
#: activation dtype -> the kernel's ELEM (16-bit mma operands only)
ELEMS = {"float16": "half_t", "bfloat16": "bf16_t"}
WEIGHT_TYPES = ("int4", "uint4")
#: K in slices of this many elements (4 lanes x 32 codes of a row); a lane's 32 codes share one scale;
#: rows of the mma's tile; bytes of an X / scale / Y element
SLICE, CHUNK, K_ALIGN, ROW_TILE, ELEM_BYTES = 128, 32, 16, 16, 2
#: lane-instructions a weight element (weight_only_mma.cu's header): dequantization by activation type,
#: the mma, a chunk's address, scale and zero point; X's loads and permutes a word (8 elements), shared
#: by the NT tiles, half of them at M <= 8
DEQUANT_OPS = {"float16": 2.0, "bfloat16": 2.5}
MMA_OPS, CHUNK_OPS, X_OPS_A_WORD = 0.25, 0.4, 10.0
#: an L1 / L2 round trip of X as this kernel waits for it: its SASS loads each word of X (inside bounds
#: branches) just before that word's mma, 4 dependent round trips a slice; fitted to the H100 run
#: (mma_m16_k8_c16 at M = 1: 11.3 us measured, 6.6 us predicted without it; docs/PERFORMANCE.md)
X_LATENCY_US = 0.4


@dataclass(frozen=True)
class MmaTile:
    """weight_only_mma's shape: `warps` warps a block splitting K, `tiles` n8 tiles a warp (the block's
    8 * tiles columns), K slices loaded `group` at a time (group * tiles 16-byte loads in flight a lane)."""

    warps: int
    tiles: int
    group: int

    @property
    def cols(self) -> int:
        return 8 * self.tiles

    @property
    def name(self) -> str:
        return f"cuda.weight_only.mma_m16_k{self.warps}_c{self.cols}"

    @property
    def sm_blocks(self) -> int:
        """Blocks an SM holds (ptxas, sm_90: 118-122 registers at 2 tiles, 188-196 at 4; 256 threads)."""
        return 2 if self.tiles <= 2 else 1

    def source(self, elem: str) -> KernelSource:
        return KernelSource(KERNEL, file=FILE, defines=defines(ELEM=elem, WK=self.warps, NT=self.tiles, G=self.group))


#: decode (16 columns a block: 256 blocks at N = 4096, 2 an SM) and small batches (32 columns: X, re-read
#: from L2 once a block, costs half as much at M = 16)
MMA_TILES = (MmaTile(8, 2, 2), MmaTile(8, 4, 2))


def mma_us(tile: MmaTile, m: int, n: int, k: int, block: int, elem: str, sm_count: int) -> float:
    """weight_only_mma's predicted time (for ordering candidates; weight_only.gemv_us's model and
    constants): the slowest of its traffic (packed weights, scales and zero points once a row tile, X
    once a block from L2 counted at DRAM speed, Y), its issued instructions (~3 a weight element,
    weight_only_mma.cu's header) and its chain of dependent load groups and X loads, plus launch."""
    slices, tiles, col_blocks = -(-k // SLICE), -(-m // ROW_TILE), -(-n // tile.cols)
    blocks = col_blocks * min(tiles, MAX_GRID_Y)
    passes = -(-tiles // min(tiles, MAX_GRID_Y))
    nb = -(-k // block)
    weight = n * padded_row_bytes(k, 4) + n * nb * (ELEM_BYTES + 1)
    dram = (weight * tiles + col_blocks * m * k * ELEM_BYTES + m * n * ELEM_BYTES) / DRAM_BYTES_PER_US
    per_element = DEQUANT_OPS[elem] + MMA_OPS + CHUNK_OPS + X_OPS_A_WORD * (1.0 if m > 8 else 0.5) / 8 / tile.tiles
    issue = n * slices * SLICE * tiles * per_element / 32 / (ISSUE_PER_US_PER_SM * sm_count)
    slots = sm_count * tile.sm_blocks
    waves = -(-blocks // slots)
    x_trips = 4 * -(-slices // tile.warps)  # a warp's slices, 4 dependent X loads each
    chain = waves * passes * ((-(-slices // (tile.group * tile.warps)) + 1) * STEP_LATENCY_US + x_trips * X_LATENCY_US)
    spread = sm_count / min(blocks, sm_count) * (waves * slots / blocks if blocks > slots else 1.0)
    return max(dram * spread, issue * spread, chain) + FIXED_US


def supports(layer: Any) -> bool:
    """int4 / uint4 weights, K a multiple of 16, blocks of a multiple of 32, 16-bit X (a layer built by
    hand, whose types are known at enqueue only: checked there)."""
    attrs = layer.attrs
    if not weight_only_supports(layer) or str(attrs.get("weight_type")) not in WEIGHT_TYPES:
        return False
    k, block = int(attrs.get("K", 0)), int(attrs.get("block_size", 0))
    if k <= 0 or k % K_ALIGN or block <= 0 or block % CHUNK:
        return False
    return not layer.in_dtypes or layer.in_dtypes[X] in ELEMS


def refusal(layer: Any, tactic: str, x: str) -> DeviceError:
    """The error of an mma tactic enqueued on a layer it does not take (a hand-built layer's X type)."""
    return DeviceError(f"WeightOnlyMatMul {tactic} takes float16 / bfloat16 X, int4 / uint4 weights, "
                       f"K % {K_ALIGN} == 0 and blocks of a multiple of {CHUNK}: got X {x}, "
                       f"{layer.attrs.get('weight_type')}, K {layer.attrs.get('K')}, "
                       f"block {layer.attrs.get('block_size')}", where=f"layer {layer.name!r}",
                       hint="choose another cuda.weight_only tactic")


def estimate_of(model: Callable[..., float], tile: Any) -> Callable[[Any, int], float | None]:
    """A tactic's estimate: `model(tile, M, N, K, block, X type, SMs)` of a stamped layer of static shape
    and 16-bit X, else None (nothing to predict)."""

    def estimate(layer: Any, sm_count: int) -> float | None:
        sizes = static_sizes(layer)
        if not sm_count or sizes is None or layer.in_dtypes[X] not in ELEMS:
            return None
        return model(tile, *sizes, layer.in_dtypes[X], sm_count)

    return estimate


def _mma_tactic(tile: MmaTile):
    def kernels(layer: Any) -> list[KernelSource]:
        return layer_sources(layer, tile.source, ELEMS, "half_t")

    estimate = estimate_of(mma_us, tile)

    def enqueue(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor]) -> None:
        sizes, args = weight_only_args(layer, tensors)
        x = tensors[layer.inputs[X]].dtype.name
        if x not in ELEMS or not supports(layer):
            raise refusal(layer, tile.name, x)
        if sizes["M"] == 0 or sizes["N"] == 0:
            return
        grid = (-(-sizes["N"] // tile.cols), min(-(-sizes["M"] // ROW_TILE), MAX_GRID_Y), 1)
        launcher.launch(tile.source(ELEMS[x]), grid, (32 * tile.warps,), args)

    return kernels, estimate, enqueue


def compile_variants() -> list[KernelSource]:
    """Every activation type with every tile."""
    return [tile.source(elem) for elem in ELEMS.values() for tile in MMA_TILES]


# priority 11: measured ahead of the gemv tactics at M = 1 and 16 (the module docstring)
for _tile in MMA_TILES:
    _kernels, _estimate, _enqueue = _mma_tactic(_tile)
    cuda_tactic(KIND, _tile.name, kernels=_kernels, supports=supports, priority=11, estimate=_estimate,
                params={"warps": _tile.warps, "tiles": _tile.tiles, "group": _tile.group},
                domain=POLYKIT_DOMAIN)(_enqueue)

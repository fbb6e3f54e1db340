"""Memory-bound GEMMs with a small K (gemm_skinny.cu): a BM-row tile of A held whole in shared
memory, N walked in narrow chunks of BN columns, mma.sync m16n8k16 (compute capability 8.0+).

Tactics `cuda.gemm.skinny_<BM>x<BN>` (kinds MatMul and Gemm) for float16 / bfloat16 layers whose
GEMM is one item (a MatMul's B shared by every batch item: A's batch folds into M) with K <= MAX_K
and the sm90 kernels' 16-byte row geometry (gemm_sm90.plan_gemm). Pointwise convolutions take the
same kernel through conv_skinny.py. These shapes (M = pixels, K and N = 16..320 channels) move
far more bytes than they multiply: a wgmma tile 64+ columns wide and 64 deep wastes most of its
work on N or K of 16..48 and its pipeline never fills when K is one or two stages. The tile
parameters below are the one source of the kernel's shape (its defines, grid and shared memory).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from polykit.kernels.cuda.base import CUDA_DIR, KernelSource, cuda_tactic, defines
from polykit.kernels.cuda.gemm.epilogue import epilogue_args, epilogue_prelude, has_epilogue, supports_epilogue
from polykit.kernels.cuda.gemm.gemm_sm90 import layer_geometry, layer_storage, memory_us, operands_of

FILE = "gemm_skinny.cu"
ELEMS = {"float16": "half_t", "bfloat16": "bf16_t"}
#: mma.sync m16n8k16 and cp.async: compute capability 8.0 and later
ARCHS = ("sm_80", "sm_86", "sm_87", "sm_89", "sm_90")
MAX_K = 512  # past this a BM-row tile of A stops fitting beside the W chunks; wgmma tiles serve such K
SMEM_PER_BLOCK = 99 * 1024  # the most a block may take on sm_86 / sm_89; sm_80 and sm_90 fit two such blocks an SM
#: cost model constants (H100/H200 class, fp16): the mma.sync rate and the shared-memory read rate
#: over the chip (flops or bytes per us), and a launch's fixed cost (start, first loads, tail)
MMA_FLOPS_PER_US, SMEM_BYTES_PER_US, FIXED_US = 3.5e8, 2.5e7, 3.0


@dataclass(frozen=True)
class SkinnyTile:
    """BM rows of A a block (4 warps, BM / 4 rows each), BN columns a chunk of N."""

    bm: int
    bn: int

    @property
    def label(self) -> str:
        return f"{self.bm}x{self.bn}"

    def smem(self, K: int, b_kn: bool) -> int:
        """Dynamic shared memory for depth K: the A tile and two W chunks, rows padded by 8 elements."""
        kp = -(-K // 16) * 16
        w = kp * (self.bn + 8) if b_kn else self.bn * (kp + 8)
        return 2 * (self.bm * (kp + 8) + 2 * w)

    def fits(self, K: int, b_kn: bool) -> bool:
        return 0 < K <= MAX_K and self.smem(K, b_kn) <= SMEM_PER_BLOCK

    def defines(self, b_kn: bool) -> tuple[tuple[str, str], ...]:
        return defines(BM=self.bm, BN=self.bn, B_KN=int(b_kn))


#: narrow chunks for N = 16..48 (and for wide N, so a warp's accumulators stay few), two row counts
TILES = (SkinnyTile(128, 16), SkinnyTile(128, 32), SkinnyTile(128, 48), SkinnyTile(128, 64),
         SkinnyTile(64, 32), SkinnyTile(64, 64))


def blocks_per_sm(tile: SkinnyTile, K: int, b_kn: bool) -> int:
    """Blocks an SM holds at once: shared memory (228 KiB, 1 KiB reserved a block), at most 8."""
    return max(1, min(8, 228 * 1024 // (tile.smem(K, b_kn) + 1024)))


def n_splits(tile: SkinnyTile, M: int, N: int, K: int, sm_count: int, b_kn: bool = False) -> int:
    """Groups N's chunks are split into (grid y) so that the blocks fill every SM slot at least
    once when M alone has too few row tiles; 1 when it has enough."""
    tiles, chunks = -(-M // tile.bm), -(-N // tile.bn)
    slots = max(1, sm_count * blocks_per_sm(tile, K, b_kn))
    return max(1, min(chunks, -(-slots // tiles)))


def skinny_us(tile: SkinnyTile, M: int, N: int, K: int, sm_count: int, b_kn: bool = False, elem_bytes: int = 2) -> float:
    """The tile's cost model for ordering candidates: the slowest of its DRAM traffic (A and W
    read once, Y written once), its padded mma work (K to 16, each chunk BN wide) and its
    shared-memory reads (every chunk reads the A tile and, per warp, its W chunk), stretched by the
    last wave's idle SM slots (the work units: row tiles x n_splits groups of chunks), plus a fixed
    start."""
    kp, chunks = -(-K // 16) * 16, -(-N // tile.bn)
    tiles, splits = -(-M // tile.bm), n_splits(tile, M, N, K, sm_count, b_kn)
    per = -(-chunks // splits)
    units = tiles * -(-chunks // per)
    dram = memory_us(M, N, K, 1, elem_bytes)
    mma = 2.0 * units * tile.bm * kp * per * tile.bn / MMA_FLOPS_PER_US
    smem = elem_bytes * units * per * kp * (tile.bm + 4 * tile.bn) / SMEM_BYTES_PER_US
    slots = max(1, sm_count * blocks_per_sm(tile, K, b_kn))
    waves = -(-units // slots)
    return max(dram, mma, smem) * waves * slots / units + FIXED_US


def kernel_for(layer: Any, tile: SkinnyTile, elem: str, b_kn: bool) -> KernelSource:
    """gemm_skinny with the tile's defines, plus the layer's epilogue when it has one."""
    if has_epilogue(layer):
        return KernelSource("gemm_skinny", code=epilogue_prelude(layer, elem) + (CUDA_DIR / FILE).read_text(),
                            defines=tile.defines(b_kn))
    return KernelSource("gemm_skinny", file=FILE, defines=defines(ELEM=elem) + tile.defines(b_kn))


def launch(layer: Any, tile: SkinnyTile, launcher: Any, tensors: Mapping[str, Any], A: Any, W: Any, C: Any, Y: Any,
           M: int, N: int, K: int, b_kn: bool, c_strides: tuple[int, int], alpha: float, beta: float) -> None:
    """One launch of gemm_skinny over the layer's tensors (shared by the GEMM and conv tactics); Y's
    rows lie Y.rows_apart(N) elements apart (a Concat's slice where the conv's output is placed)."""
    elem = ELEMS[np.dtype(Y.dtype).name]
    args = [A, W, C if C is not None else 0, Y, M, N, np.int32(K), c_strides[0], c_strides[1], np.float32(alpha),
            np.float32(beta), Y.rows_apart(N)] + epilogue_args(layer, tensors, Y.dtype)
    grid = (-(-M // tile.bm), n_splits(tile, M, N, K, launcher.sm_count, b_kn))
    launcher.launch(kernel_for(layer, tile, elem, b_kn), grid, (128,), args, shared_mem=tile.smem(K, b_kn))


def _supports(tile: SkinnyTile):
    def supports(layer: Any) -> bool:
        storage, geo = layer_storage(layer), layer_geometry(layer)
        return (storage in ELEMS and geo is not None and geo.items == 1 and tile.fits(geo.K, geo.b_mn)
                and supports_epilogue(layer))

    return supports


def _kernels(tile: SkinnyTile):
    def kernels(layer: Any) -> list[KernelSource]:
        return [kernel_for(layer, tile, ELEMS[layer_storage(layer)], layer_geometry(layer).b_mn)]

    return kernels


def _estimate(tile: SkinnyTile):
    def estimate(layer: Any, sm_count: int) -> float | None:
        geo = layer_geometry(layer)
        if geo is None or not sm_count:
            return None
        return skinny_us(tile, geo.M, geo.N, geo.K, sm_count, geo.b_mn)

    return estimate


def _enqueue(tile: SkinnyTile):
    def enqueue(layer: Any, launcher: Any, tensors: Mapping[str, Any]) -> None:
        ops = operands_of(layer, tensors, "skinny GEMM kernel")
        geo = ops.geo
        launch(layer, tile, launcher, tensors, ops.A, ops.B, ops.C, ops.Y, geo.M, geo.N, geo.K, geo.b_mn,
               geo.c_strides, ops.alpha, ops.beta)

    return enqueue


def compile_variants() -> list[KernelSource]:
    """Every tile with both W layouts for fp16, the first tile for bf16, and the first tile with a
    residual add + Relu epilogue (CI: sm_80 and sm_90)."""
    from polykit.compiler.plan.records import LayerDesc

    out = [KernelSource("gemm_skinny", file=FILE, defines=defines(ELEM="half_t") + t.defines(b_kn))
           for t in TILES for b_kn in (False, True)]
    out += [KernelSource("gemm_skinny", file=FILE, defines=defines(ELEM="bf16_t") + TILES[0].defines(b_kn))
            for b_kn in (False, True)]
    body = [{"op": "Add", "inputs": ["raw", "skip"], "outputs": ["s"], "attrs": {}},
            {"op": "Relu", "inputs": ["s"], "outputs": ["y"], "attrs": {}}]
    layer = LayerDesc("epi", "ConvNHWC", ("x", "w", "b", "skip"), ("y",), {"epilogue": {"input": "raw", "body": body}},
                      domain="ai.polykit")
    return out + [kernel_for(layer, TILES[0], "half_t", False)]


for _tile in TILES:
    for _kind in ("MatMul", "Gemm"):
        cuda_tactic(_kind, f"cuda.gemm.skinny_{_tile.label}", kernels=_kernels(_tile), supports=_supports(_tile),
                    priority=30, archs=ARCHS, estimate=_estimate(_tile),
                    params={"bm": _tile.bm, "bn": _tile.bn})(_enqueue(_tile))

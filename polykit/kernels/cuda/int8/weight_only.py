"""WeightOnlyMatMul on CUDA cores (weight_only.cu): W4A16 / W8A16 with the weight kept packed and
dequantized in the main loop (ai.polykit; compiler/ops/quant/weight_only.py is the record).

Tactics `cuda.weight_only.m<ROWS>` (ROWS = 1, 4, 16: activation rows a block's tile holds; any M
runs, tiles stepping over M): X float32 / float16 / bfloat16 [..., M, K] (rows folded into M), the
weight int4 / uint4 / float4_e2m1fn / int8 / uint8 (runtime code), scales in X's type, zero points
or none, a bias in X's type or none. WARPS warps a block, COLS output columns a warp. sm_80 and later;
no tensor cores yet (correctness first; docs/INT8.md says what is measured).

Tactics `cuda.weight_only.bw_m<ROWS>_k<KSPLIT>_c<columns a block>` (weight_only.cu's
weight_only_gemv, the bandwidth-bound kernel): X staged in shared memory once a block as float,
each chunk's codes decoded once for all ROWS rows, the next chunks' loads issued ahead, K split
over KSPLIT warps of a block (a fixed-order reduction: deterministic). They predict their cost
(`gemv_us`) so the builder times the likeliest first. The tensor-core W4A16 kernel (float16 / bfloat16
X, int4 / uint4 weights) is weight_only_mma.py's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.ops.quant.weight_only import (ACTIVATION_TYPES, BIAS, KIND, SCALE, WEIGHT_TYPES, ZERO_POINT, W,
                                                    X, is_weight_only, padded_row_bytes)
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, cuda_tactic, defines

FILE = "weight_only.cu"
KERNEL = "weight_only_matmul"
#: activation dtype -> the kernel's ELEM
ELEMS = {"float32": "float", "float16": "half_t", "bfloat16": "bf16_t"}
#: weight type -> weight_only.cu's WT_* code
WEIGHT_CODES = {"int4": 0, "uint4": 1, "float4_e2m1fn": 2, "int8": 3, "uint8": 4}
#: rows a tile holds, one tactic each (decode: 1; small batches: 4, 16)
ROW_TILES = (1, 4, 16)
WARPS, COLS = 4, 2
MAX_GRID_Y = 65535
INT32_MAX = (1 << 31) - 1


GEMV_KERNEL = "weight_only_gemv"


@dataclass(frozen=True)
class GemvTile:
    """weight_only_gemv's shape: ROWS activation rows a tile, K split over `ksplit` warps, `groups`
    column groups of 4 * `cpt` columns (a warp's 4 slots of 8 lanes, `cpt` columns a lane)."""

    rows: int
    ksplit: int
    groups: int
    cpt: int

    @property
    def warps(self) -> int:
        return self.groups * self.ksplit

    @property
    def cols(self) -> int:
        return self.groups * 4 * self.cpt

    @property
    def name(self) -> str:
        return f"cuda.weight_only.bw_m{self.rows}_k{self.ksplit}_c{self.cols}"

    @property
    def sm_warps(self) -> int:
        """Warps an SM holds at least (weight_only.cu's GV_SM_WARPS: the register budget)."""
        return 8 if self.rows >= 16 else 16

    @property
    def smem_bytes(self) -> int:
        return 4 * (self.rows * self.ksplit * 8 * 36 + self.ksplit * self.cols * self.rows)

    def source(self, elem: str) -> KernelSource:
        return KernelSource(GEMV_KERNEL, file=FILE, defines=defines(ELEM=elem, ROWS=self.rows, KSPLIT=self.ksplit,
                                                                   CGROUPS=self.groups, CPT=self.cpt))


#: decode (M = 1: K split 4 for enough warps on 132 SMs), small batches (4 and 16 rows a tile). Three
#: tiles, not more: each unit takes 12-45 s of NVRTC (five weight types, unrolled), which every CI run
#: pays twice (sm_80, sm_90); GPU timings decide whether another tile earns its compile time.
GEMV_TILES = (GemvTile(1, 4, 2, 1), GemvTile(4, 2, 2, 2), GemvTile(16, 2, 2, 2))
#: the cost model's device: DRAM bytes a us (H100 ~3.0 TB/s), warp-instructions a us an SM (4
#: schedulers at ~1.6 GHz), the latency a step's chained weight load costs, launch and tail
DRAM_BYTES_PER_US, ISSUE_PER_US_PER_SM, STEP_LATENCY_US, FIXED_US = 3.0e6, 6.4e3, 0.6, 3.0
SMEM_PER_SM = 227 * 1024


def gemv_us(tile: GemvTile, m: int, n: int, k: int, bits: int, block: int, elem_bytes: int, sm_count: int) -> float:
    """weight_only_gemv's predicted time (for ordering candidates): the slowest of its DRAM traffic
    (packed weights, scales and zero points once a row tile, X once a column block from L2 counted
    at DRAM speed, Y) and its issued instructions (~8 a weight element to decode, 1.25 a row: an fma
    and a quarter of a 16-byte shared load), both stretched when blocks leave SMs or the last
    wave's slots idle, and its chain of dependent steps (one weight load latency each), plus launch."""
    per = 128 // bits
    step = tile.ksplit * 8 * per
    steps, tiles, col_blocks = -(-k // step), -(-m // tile.rows), -(-n // tile.cols)
    blocks = col_blocks * min(tiles, MAX_GRID_Y)
    passes = -(-tiles // min(tiles, MAX_GRID_Y))
    nb = -(-k // block)
    weight = n * padded_row_bytes(k, bits) + n * nb * (elem_bytes + 1)
    dram = (weight * tiles + col_blocks * m * k * elem_bytes + m * n * elem_bytes) / DRAM_BYTES_PER_US
    elements = n * steps * step * tiles
    issue = elements * (8 + 1.25 * tile.rows) / 32 / (ISSUE_PER_US_PER_SM * sm_count)
    slots = sm_count * max(1, min(tile.sm_warps // tile.warps, SMEM_PER_SM // tile.smem_bytes))
    waves = -(-blocks // slots)
    chain = waves * passes * steps * STEP_LATENCY_US
    spread = sm_count / min(blocks, sm_count) * (waves * slots / blocks if blocks > slots else 1.0)
    return max(dram * spread, issue * spread, chain) + FIXED_US


def source(elem: str, rows: int) -> KernelSource:
    return KernelSource(KERNEL, file=FILE, defines=defines(ELEM=elem, ROWS=rows, COLS=COLS, WARPS=WARPS))


def compile_variants() -> list[KernelSource]:
    """Every activation type with every row tile of both kernels."""
    return ([source(elem, rows) for elem in ELEMS.values() for rows in ROW_TILES]
            + [tile.source(elem) for elem in ELEMS.values() for tile in GEMV_TILES])


def supports(layer: Any) -> bool:
    """What the stamped record says the kernel takes (layers built by hand: judged at enqueue)."""
    if not is_weight_only(layer) or str(layer.attrs.get("weight_type")) not in WEIGHT_CODES:
        return False
    if not layer.in_dtypes:
        return True
    x = layer.in_dtypes[X]
    return (x in ACTIVATION_TYPES and layer.in_dtypes[SCALE] == x and layer.out_dtypes[0] == x
            and layer.in_dtypes[W] == "uint8" and (not layer.inputs[BIAS] or layer.in_dtypes[BIAS] == x))


def weight_only_args(layer: Any, tensors: Mapping[str, DeviceTensor]) -> tuple[dict[str, int], list[Any]]:
    """(sizes M, N, K, and the kernel arguments) of a WeightOnlyMatMul, checked against the record."""
    where = f"layer {layer.name!r}"

    def get(slot: int) -> DeviceTensor | None:
        return tensors[layer.inputs[slot]] if layer.inputs[slot] else None

    x, w, s, z, b, y = get(X), get(W), get(SCALE), get(ZERO_POINT), get(BIAS), tensors[layer.outputs[0]]
    weight_type = str(layer.attrs["weight_type"])
    k, block = int(layer.attrs["K"]), int(layer.attrs["block_size"])
    n = w.shape[0] if len(w.shape) == 2 else -1
    nb = -(-k // block) if block > 0 else -1
    ldw = padded_row_bytes(k, WEIGHT_TYPES[weight_type]) if k > 0 else -1
    problems = []
    if x.dtype.name not in ELEMS or s.dtype != x.dtype or y.dtype != x.dtype:
        problems.append(f"X {x.dtype}, scale {s.dtype}, Y {y.dtype} (one of {', '.join(ELEMS)})")
    if tuple(w.shape) != (n, ldw) or w.dtype != np.uint8 or w.ptr % 16:
        problems.append(f"W {w.dtype} {w.shape} (uint8 [N, {ldw}], 16-byte aligned)")
    if tuple(s.shape) != (n, nb) or (z is not None and (tuple(z.shape) != (n, nb) or z.dtype.name not in ("int8", "uint8"))):
        problems.append(f"scale {s.shape} / zero point {None if z is None else (z.dtype, z.shape)} ([N, {nb}])")
    if b is not None and (b.dtype != x.dtype or tuple(b.shape) != (n,)):
        problems.append(f"B {b.dtype} {b.shape} (X's type, [N])")
    if len(x.shape) < 2 or x.shape[-1] != k:
        problems.append(f"X {x.shape} ([..., M, {k}])")
    m = int(np.prod(x.shape[:-1])) if x.shape else 0
    if max(m, n, k, m * n, m * k) > INT32_MAX:
        problems.append(f"M={m}, N={n}, K={k} past int32 indices")
    if problems:
        raise DeviceError(f"WeightOnlyMatMul the kernel cannot run: {'; '.join(problems)}", where=where,
                          hint="run this layer on --target cpu")
    args = [x, w, s, z if z is not None else 0, b if b is not None else 0, y]
    args += [np.int32(v) for v in (m, n, k, ldw, block, nb, WEIGHT_CODES[weight_type])]
    return {"M": m, "N": n, "K": k}, args


def layer_sources(layer: Any, make: Callable[[str], KernelSource], elems: Mapping[str, str],
                  default: str) -> list[KernelSource]:
    """The kernels a layer compiles: `make(ELEM)` of its activation type, of every type in `elems` for
    a layer built by hand (its activation type known at enqueue only)."""
    if not layer.in_dtypes:
        return [make(elem) for elem in elems.values()]
    return [make(elems.get(layer.in_dtypes[X], default))]


def static_sizes(layer: Any) -> tuple[int, int, int, int] | None:
    """(M, N, K, block size) of a stamped layer whose X shape is static, else None (nothing to predict)."""
    shape = layer.in_shapes[X] if getattr(layer, "in_shapes", None) else None
    if not shape or not layer.in_dtypes or any(not isinstance(d, int) for d in shape):
        return None
    return (int(np.prod(shape[:-1])), int(layer.in_shapes[W][0]), int(layer.attrs["K"]),
            int(layer.attrs["block_size"]))


def _tactic(rows: int):
    def kernels(layer: Any) -> list[KernelSource]:
        return layer_sources(layer, lambda elem: source(elem, rows), ELEMS, "float")

    def enqueue(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor]) -> None:
        sizes, args = weight_only_args(layer, tensors)
        if sizes["M"] == 0 or sizes["N"] == 0:
            return
        elem = ELEMS[tensors[layer.inputs[X]].dtype.name]
        grid = (-(-sizes["N"] // (WARPS * COLS)), min(-(-sizes["M"] // rows), MAX_GRID_Y), 1)
        launcher.launch(source(elem, rows), grid, (32 * WARPS,), args)

    return kernels, enqueue


def _gemv_tactic(tile: GemvTile):
    def kernels(layer: Any) -> list[KernelSource]:
        return layer_sources(layer, tile.source, ELEMS, "float")

    def estimate(layer: Any, sm_count: int) -> float | None:
        sizes = static_sizes(layer)
        if not sm_count or sizes is None:
            return None
        m, n, k, block = sizes
        bits = WEIGHT_TYPES[str(layer.attrs["weight_type"])]
        return gemv_us(tile, m, n, k, bits, block, np.dtype(layer.in_dtypes[X]).itemsize, sm_count)

    def enqueue(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor]) -> None:
        sizes, args = weight_only_args(layer, tensors)
        if sizes["M"] == 0 or sizes["N"] == 0:
            return
        elem = ELEMS[tensors[layer.inputs[X]].dtype.name]
        grid = (-(-sizes["N"] // tile.cols), min(-(-sizes["M"] // tile.rows), MAX_GRID_Y), 1)
        launcher.launch(tile.source(elem), grid, (32 * tile.warps,), args)

    return kernels, estimate, enqueue


# priority 9, under m1's 10 and the tensor-core tactics' 11 (weight_only_mma.py: first wherever they run, the
# 16-bit W4A16 layers): the gemv's layer times (26.5 / 90.6 us at N = K = 4096, H200 2026-12-06,
# docs/PERFORMANCE.md) are far from its model, and m1's were not measured beside them, so a level-0 build of a
# layer the mma kernel refuses (float32 X, 8-bit weights, other K or blocks) keeps m1 until a run times both
for _tile in GEMV_TILES:
    _kernels, _estimate, _enqueue = _gemv_tactic(_tile)
    cuda_tactic(KIND, _tile.name, kernels=_kernels, supports=supports, priority=9, estimate=_estimate,
                params={"rows": _tile.rows, "ksplit": _tile.ksplit, "groups": _tile.groups, "cpt": _tile.cpt},
                domain=POLYKIT_DOMAIN)(_enqueue)

for _rows in ROW_TILES:
    _kernels, _enqueue = _tactic(_rows)
    cuda_tactic(KIND, f"cuda.weight_only.m{_rows}", kernels=_kernels, supports=supports, priority=10 - _rows // 4,
                params={"rows": _rows, "cols": COLS, "warps": WARPS}, conservative=_rows == 1,
                domain=POLYKIT_DOMAIN)(_enqueue)

"""GEMM on Hopper tensor cores (gemm_sm90.cu; its pipeline and epilogue, shared with conv_sm90.cu:
gemm_sm90_core.cuh, gemm_sm90_epilogue.cuh): wgmma + TMA, warp-specialized, persistent.

Tactics `cuda.gemm.sm90_<BM>x<BN>` (kinds MatMul and Gemm, GPUs of compute capability 9.0)
for layers whose A, B (and C, Y) are all float16 or all bfloat16, or all float32 in a layer
built with precision "tf32" (--tf32; a [K, N] B is transposed in shared memory: wgmma reads
tf32 operands K-major only). Tactics `cuda.gemm.sm90x3_<BM>x<BN>` run float32 layers of
precision "fp32" at fp32 accuracy on the same tensor cores (3xTF32: each operand split into two
tf32 parts, three products, docs/CUDA_NOTES.md). TMA-friendly geometry: A row-major with K % 8 == 0
(16-byte rows), B [K, N] with N % 8 == 0 or a transposed Gemm B [N, K] with K % 8 == 0, no transA, batch dims that are either absent on B
(folded into M) or the same on both operands (or absent on A). Other GEMMs keep the mma.sync
and SIMT tactics (gemm.py). The tile parameters below are the one source of each kernel's
shape: they become the kernel's defines and its launch geometry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from polykit.errors import DeviceError
from polykit.kernels.cuda.base import CUDA_DIR, DeviceTensor, KernelSource, TensorMapSpec, cuda_tactic, defines
from polykit.kernels.cuda.gemm.epilogue import (epilogue_args, epilogue_prelude, has_epilogue, store_defines,
                                            supports_epilogue)

FILE = "gemm_sm90.cu"
#: each entry point's source (both share gemm_sm90_core.cuh and gemm_sm90_epilogue.cuh)
FILES = {"gemm_sm90": FILE, "conv_sm90": "conv_sm90.cu"}
#: storage dtype -> the kernel's ELEM type (float32: tf32 math)
ELEMS = {"float16": "half_t", "bfloat16": "bf16_t", "float32": "float"}
ROW_BYTES = 128  # a shared-memory tile row: one 128-byte swizzle row of K (the stage's depth)
SMEM_PER_SM, SMEM_PER_BLOCK = 228 * 1024, 227 * 1024  # compute capability 9.0
BK = 64  # K depth of a stage for 16-bit elements (32 for float32)


def bk_of(dtype: Any) -> int:
    """K elements of one stage for operands of `dtype`."""
    return ROW_BYTES // np.dtype(dtype).itemsize
#: GPU architectures the tactics run on (their kernels compile for sm_90a)
ARCHS = ("sm_90",)


@dataclass(frozen=True)
class Sm90Tile:
    """One tile configuration: `consumers` warpgroups of `msub` x 64 rows by `bn` columns."""

    msub: int
    consumers: int
    bn: int
    stages: int
    blocks: int = 1  # blocks per SM (2: the epilogue of one overlaps the other's products)
    #: whole-chip fp16 TFLOP/s of the tile when every SM is busy (measured, H100, large K)
    tflops: float = 400.0

    @property
    def bm(self) -> int:
        return 64 * self.msub * self.consumers

    @property
    def threads(self) -> int:
        return 128 * (self.consumers + 1)

    @property
    def smem(self) -> int:
        """Dynamic shared memory: 1 KiB alignment slack, the stages, two mbarriers a stage."""
        return 1024 + self.stages * (self.bm + self.bn) * ROW_BYTES + 16 * self.stages

    @property
    def label(self) -> str:
        return f"{self.bm}x{self.bn}" + (f"x{self.blocks}" if self.blocks > 1 else "")

    def grid(self, tiles: int, sm_count: int) -> int:
        """Persistent blocks for `tiles` output tiles."""
        return max(1, min(tiles, self.blocks * sm_count))

    def defines(self, b_mn: bool, split3: bool = False) -> tuple[tuple[str, str], ...]:
        return defines(MSUB=self.msub, CONSUMERS=self.consumers, BN=self.bn, STAGES=self.stages, B_MN=int(b_mn),
                       BLOCKS=self.blocks) + (defines(SPLIT3=1) if split3 else ())

    def scratch(self, storage: str, b_mn: bool, split3: bool) -> int:
        """Bytes of the float-B scratch ring (gemm_sm90_core.cuh B_SCRATCH): 3 buffers of B's K-major
        big part (a [K, N] B) and its small part (3xTF32)."""
        if storage != "float32" or not (b_mn or split3):
            return 0
        return 3 * (int(b_mn) + int(split3)) * self.bn * ROW_BYTES

    def smem_for(self, storage: str, b_mn: bool, split3: bool) -> int:
        return self.smem + self.scratch(storage, b_mn, split3)

    def fits(self, storage: str, b_mn: bool, split3: bool) -> bool:
        """Whether `blocks` blocks of this tile's shared memory fit one SM (228 KiB, 1 KiB of it
        reserved per block; at most 227 KiB a block)."""
        need = self.smem_for(storage, b_mn, split3)
        return need <= SMEM_PER_BLOCK and self.blocks * (need + 1024) <= SMEM_PER_SM


#: tile configurations, in the order a build without timing prefers them
TILES = (Sm90Tile(1, 2, 128, 6, tflops=500), Sm90Tile(1, 2, 256, 4, tflops=660), Sm90Tile(2, 2, 128, 4, tflops=630),
         Sm90Tile(1, 1, 128, 8, tflops=430), Sm90Tile(1, 2, 64, 8, tflops=340), Sm90Tile(1, 1, 64, 8, tflops=330),
         Sm90Tile(1, 2, 192, 5, tflops=600), Sm90Tile(1, 1, 128, 4, blocks=2, tflops=430),
         Sm90Tile(1, 1, 64, 6, blocks=2, tflops=330))
#: 3xTF32 tiles (fewer stages: the float B scratch ring shares the shared memory; one warpgroup
#: tile of rows each: a stage's partial sums need as many registers again as the accumulators);
#: rates are fp16-equivalent guesses (the cost model divides them by 6)
X3_TILES = (Sm90Tile(1, 2, 128, 4, tflops=500), Sm90Tile(1, 1, 128, 4, tflops=430),
            Sm90Tile(1, 2, 64, 4, tflops=340), Sm90Tile(1, 1, 64, 4, blocks=2, tflops=330))


#: split-K's cost past its units' K loops: a second launch (us), more per doubling of the slices
#: (fitted to H100 timings of 64x128 on 16x768x3072: 11.8 / 9.9 / 9.3 / 9.5 us at 2 / 4 / 8 / 16
#: slices), and the rate its fp32 partials move through L2 (bytes/us)
REDUCE_US, PER_DOUBLING_US, PARTIAL_BYTES_PER_US = 1.5, 1.0, 3e6


#: sustained DRAM rate (bytes/us; H100/H200 class) that prices memory-bound GEMM shapes
DRAM_BYTES_PER_US = 4.0e6


def memory_us(M: int, N: int, K: int, items: int, elem_bytes: int) -> float:
    """The least time a GEMM's DRAM traffic takes: A and B read once, Y written once."""
    return elem_bytes * items * (M * K + K * N + M * N) / DRAM_BYTES_PER_US


def predicted_us(tile: Sm90Tile, M: int, N: int, K: int, items: int, sm_count: int, tf32: bool = False,
                 split3: bool = False, splits: int = 1) -> float:
    """A cost model for ordering tiles (docs/CUDA_NOTES.md): whole waves of work units (tiles, or
    with `splits` > 1 tiles x K slices) at the tile's full-chip rate (tf32: half the fp16 rate, as
    the chip's peaks; 3xTF32 a third of that), plus a fixed start per wave (pipeline fill,
    epilogue), and never less than the shape's DRAM traffic (memory_us) plus one start; split-K
    adds its reduce (a launch, the partials written and read once)."""
    splits = max(1, min(splits, -(-K // bk_of("float32" if tf32 or split3 else "float16"))))
    units = -(-M // tile.bm) * -(-N // tile.bn) * items * splits
    slots = max(1, tile.blocks * sm_count)
    waves = -(-units // slots)
    rate = tile.tflops / (2 if tf32 or split3 else 1) / (3 if split3 else 1)
    per_wave = 2.0 * tile.bm * tile.bn * max(-(-K // splits), 64) * slots / (rate * 1e6)
    floor = memory_us(M, N, K, items, 4 if tf32 or split3 else 2) + 2.0
    if splits == 1:
        return max(waves * (per_wave + 2.0), floor)
    partials = 8.0 * splits * items * M * -(-N // tile.bn) * tile.bn
    return max(waves * (per_wave + 2.0), floor) + REDUCE_US + PER_DOUBLING_US * math.log2(splits) + partials / PARTIAL_BYTES_PER_US


@dataclass(frozen=True)
class Sm90Gemm:
    """A GEMM as the sm90 kernel runs it: Y (items, M, N) = A (items_a, M, K) x B, where B is
    (items_b, K, N) when `b_mn`, else (items_b, N, K); an operand with one item is shared."""

    M: int
    N: int
    K: int
    items: int
    a_items: int
    b_items: int
    b_mn: bool
    c_strides: tuple[int, int] = (0, 0)


def plan_gemm(kind: str, attrs: Mapping[str, Any], a: Sequence[int], b: Sequence[int],
              c: Sequence[int] | None = None) -> Sm90Gemm | None:
    """The sm90 geometry of a MatMul / Gemm with operand shapes a, b (c: Gemm's C), or None
    when the kernel cannot take it (then another tactic runs the layer)."""
    if kind == "Gemm":
        if len(a) != 2 or len(b) != 2 or int(attrs.get("transA", 0)):
            return None
        b_mn = not int(attrs.get("transB", 0))
        M, K = a
        N = b[1] if b_mn else b[0]
        if (b[0] if b_mn else b[1]) != K:
            return None
        scm = scn = 0
        if c is not None and len(c) >= 1:
            scn = 1 if c[-1] > 1 else 0
            if len(c) == 2:
                scm = c[1] if c[0] > 1 else 0
        geo = Sm90Gemm(M, N, K, 1, 1, 1, b_mn, (scm, scn))
    elif kind == "MatMul":
        if len(a) < 2 or len(b) < 2 or a[-1] != b[-2]:
            return None
        M, K, N = a[-2], a[-1], b[-1]
        a_batch, b_batch = tuple(a[:-2]), tuple(b[:-2])
        na, nb = int(np.prod(a_batch, dtype=np.int64)), int(np.prod(b_batch, dtype=np.int64))
        if nb == 1:  # B shared by every item: fold A's batch into M
            geo = Sm90Gemm(M * na, N, K, 1, 1, 1, True)
        elif na == 1:
            geo = Sm90Gemm(M, N, K, nb, 1, nb, True)
        elif a_batch == b_batch:
            geo = Sm90Gemm(M, N, K, na, na, nb, True)
        else:
            return None
    else:
        return None
    if min(geo.M, geo.N, geo.K) <= 0 or geo.K % 8 or (geo.b_mn and geo.N % 8):
        return None
    if max(geo.M, geo.N, geo.K) >= 2**31 or geo.items >= 2**31:
        return None
    return geo


def tensor_maps(geo: Sm90Gemm, tile: Sm90Tile, a: DeviceTensor, b: DeviceTensor) -> tuple[TensorMapSpec, TensorMapSpec]:
    """TMA maps of A (box KE K x BM rows) and B (box KE x KE MN-major, or KE K x BN rows), KE
    the stage depth of the dtype (bk_of: 128 bytes of elements)."""
    es, ke = np.dtype(a.dtype).itemsize, bk_of(a.dtype)
    tm_a = TensorMapSpec(a.ptr, a.dtype, (geo.K, geo.M, geo.a_items), (geo.K * es, geo.M * geo.K * es),
                         (ke, tile.bm, 1))
    if geo.b_mn:
        tm_b = TensorMapSpec(b.ptr, b.dtype, (geo.N, geo.K, geo.b_items), (geo.N * es, geo.K * geo.N * es), (ke, ke, 1))
    else:
        tm_b = TensorMapSpec(b.ptr, b.dtype, (geo.K, geo.N, geo.b_items), (geo.K * es, geo.N * geo.K * es),
                             (ke, tile.bn, 1))
    return tm_a, tm_b


def tile_count(geo: Sm90Gemm, tile: Sm90Tile) -> int:
    return -(-geo.M // tile.bm) * -(-geo.N // tile.bn) * geo.items


def layer_geometry(layer: Any) -> Sm90Gemm | None:
    shapes = getattr(layer, "in_shapes", ())
    if len(shapes) < 2:
        return None
    c = shapes[2] if layer.kind == "Gemm" and len(shapes) > 2 and layer.inputs[2] else None
    return plan_gemm(layer.kind, layer.attrs, shapes[0], shapes[1], c)


def storage_of(layer: Any, operands: int, split3: bool = False) -> str | None:
    """The one storage dtype of the layer's first `operands` inputs and its output when the sm90
    kernels take it: float16 / bfloat16, or float32 in a layer of precision "tf32"; with
    `split3` (the 3xTF32 kernels), float32 in a layer of precision "fp32"; else None."""
    dtypes = getattr(layer, "in_dtypes", ())
    outs = getattr(layer, "out_dtypes", ())
    if not dtypes or not outs:
        return None
    used = {d for d in tuple(dtypes[:operands]) + tuple(outs[:1]) if d}
    if len(used) != 1 or next(iter(used)) not in ELEMS:
        return None
    storage = next(iter(used))
    precision = getattr(layer, "precision", None)
    if storage == "float32" and precision != ("fp32" if split3 else "tf32"):
        return None
    return None if split3 and storage != "float32" else storage


def layer_storage(layer: Any, split3: bool = False) -> str | None:
    return storage_of(layer, 3 if layer.kind == "Gemm" else 2, split3)


def tile_supports(tile: Sm90Tile, split3: bool):
    def supports(layer: Any) -> bool:
        storage, geo = layer_storage(layer, split3), layer_geometry(layer)
        if storage is None or geo is None or not tile.fits(storage, geo.b_mn, split3):
            return False
        return supports_epilogue(layer)

    return supports


def kernel_for(layer: Any, tile: Sm90Tile, elem: str, b_mn: bool, name: str = "gemm_sm90",
               split3: bool = False, int8: bool = False, splitk: bool = False, streamk: bool = False,
               rolled: bool = False) -> KernelSource:
    """The layer's kernel `name` (gemm_sm90 or conv_sm90): its .cu (FILES) with the tile's
    defines, plus the layer's epilogue when it has one; `int8`: the I8 variant (s8 operands,
    `elem` the epilogue's float); `splitk`: the split-K variant (gemm_sm90_splitk.py); `streamk`:
    the stream-K variant (gemm_sm90_streamk.py); `rolled`: EPI_ROLL 1 (ROLLED_TILES)."""
    tile_defines = (tile.defines(b_mn, split3) + (defines(I8=1) if int8 else ()) + (defines(SPLITK=1) if splitk else ())
                    + (defines(STREAMK=1) if streamk else ()) + (defines(EPI_ROLL=1) if rolled else ())
                    + store_defines(layer))
    if has_epilogue(layer):
        return KernelSource(name, code=epilogue_prelude(layer, elem) + (CUDA_DIR / FILES[name]).read_text(),
                            defines=tile_defines, arch="sm_90a")
    return KernelSource(name, file=FILES[name], defines=defines(ELEM=elem) + tile_defines, arch="sm_90a")


def tile_kernels(tile: Sm90Tile, split3: bool, splitk: bool = False, streamk: bool = False, rolled: bool = False):
    def kernels(layer: Any) -> list[KernelSource]:
        geo = layer_geometry(layer)
        return [kernel_for(layer, tile, ELEMS[layer_storage(layer, split3)], geo.b_mn, split3=split3, splitk=splitk,
                           streamk=streamk, rolled=rolled)]

    return kernels


def tile_estimate(tile: Sm90Tile, split3: bool, splits: int = 1):
    def estimate(layer: Any, sm_count: int) -> float | None:
        geo = layer_geometry(layer)
        if geo is None or not sm_count:
            return None
        return predicted_us(tile, geo.M, geo.N, geo.K, geo.items, sm_count, layer_storage(layer, split3) == "float32",
                            split3, splits)

    return estimate


@dataclass(frozen=True)
class Sm90Operands:
    """A layer's device tensors as the sm90 GEMM kernels take them (every variant's enqueue)."""

    geo: Sm90Gemm
    A: DeviceTensor
    B: DeviceTensor
    Y: DeviceTensor
    C: DeviceTensor | None
    alpha: float
    beta: float

    @property
    def storage(self) -> str:
        return np.dtype(self.Y.dtype).name

    @property
    def c_arg(self) -> DeviceTensor | int:
        return self.C if self.C is not None else 0

    def kernel_args(self, tile: Sm90Tile) -> list[Any]:
        """gemm_sm90's arguments up to its variant's own (tensor maps, C, Y, sizes, alpha, beta, batching)."""
        geo = self.geo
        tm_a, tm_b = tensor_maps(geo, tile, self.A, self.B)
        return [tm_a, tm_b, self.c_arg, self.Y, geo.M, geo.N, geo.K, geo.c_strides[0], geo.c_strides[1],
                np.float32(self.alpha), np.float32(self.beta), geo.items, int(geo.a_items > 1), int(geo.b_items > 1)]


def operands_of(layer: Any, tensors: Mapping[str, DeviceTensor], what: str) -> Sm90Operands:
    """The layer's operands for the sm90 kernel `what` (a DeviceError when their shapes do not fit it)."""
    A, B, Y = tensors[layer.inputs[0]], tensors[layer.inputs[1]], tensors[layer.outputs[0]]
    C = tensors.get(layer.inputs[2]) if layer.kind == "Gemm" and len(layer.inputs) > 2 and layer.inputs[2] else None
    geo = plan_gemm(layer.kind, layer.attrs, A.shape, B.shape, C.shape if C is not None else None)
    if geo is None:
        raise DeviceError(f"shapes {A.shape} x {B.shape} do not fit the {what}", where=f"layer {layer.name!r}",
                          hint="rebuild the plan: the tactic was chosen for other shapes")
    gemm = layer.kind == "Gemm"
    return Sm90Operands(geo, A, B, Y, C, float(layer.attrs.get("alpha", 1.0)) if gemm else 1.0,
                        float(layer.attrs.get("beta", 1.0)) if gemm else 0.0)


def workspace_geometry(layer: Any, tensors: Mapping[str, Any]) -> tuple[Sm90Gemm, str] | None:
    """The geometry and storage of a layer from its tensors' descriptions (a variant's workspace
    function), or None when they are unknown or do not fit (then `supports` declined the layer)."""
    shapes = [tuple(tensors[n].shape) if n in tensors else None for n in layer.inputs[:3]]
    if None in shapes[:2]:
        return None
    c = shapes[2] if layer.kind == "Gemm" and len(shapes) > 2 else None
    geo = plan_gemm(layer.kind, layer.attrs, shapes[0], shapes[1], c)
    return None if geo is None else (geo, np.dtype(tensors[layer.inputs[0]].dtype).name)


def _enqueue(tile: Sm90Tile, split3: bool, rolled: bool = False):
    def enqueue(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor]) -> None:
        ops = operands_of(layer, tensors, "sm90 GEMM kernel")
        geo = ops.geo
        grid = tile.grid(tile_count(geo, tile), launcher.sm_count)
        launcher.launch(kernel_for(layer, tile, ELEMS[ops.storage], geo.b_mn, split3=split3, rolled=rolled), (grid,),
                        (tile.threads,),
                        ops.kernel_args(tile) + epilogue_args(layer, tensors, ops.Y.dtype),
                        shared_mem=tile.smem_for(ops.storage, geo.b_mn, split3))

    return enqueue


def compile_variants() -> list[KernelSource]:
    """Every tile with both B layouts for fp16, the default tile for bf16, for tf32 the default
    tile and a 2-blocks-per-SM one with both B layouts, every 3xTF32 tile with each B layout it
    fits, and the rolled tiles (rolled_variants) (CI: sm_90a)."""
    def unit(elem: str, tile: Sm90Tile, b_mn: bool, split3: bool = False) -> KernelSource:
        return KernelSource("gemm_sm90", file=FILE, defines=defines(ELEM=elem) + tile.defines(b_mn, split3),
                            arch="sm_90a")

    out = [unit("half_t", t, b_mn) for t in TILES for b_mn in (True, False)]
    out.append(unit("bf16_t", TILES[0], True))
    out += [unit("float", t, b_mn) for t in (TILES[0], TILES[5], TILES[-1]) for b_mn in (False, True)
            if t.fits("float32", b_mn, False)]
    out += [unit("float", t, b_mn, True) for t in X3_TILES for b_mn in (False, True) if t.fits("float32", b_mn, True)]
    return out + rolled_variants()


def rolled_variants() -> list[KernelSource]:
    """The rolled tiles (ROLLED_TILES) on a float16 MatMul with BERT FFN1's bias + Gelu (one group's loads ahead:
    the 16-byte path's bias) and one with a residual + Relu (the row loads), both B layouts on the first."""
    from polykit.compiler.plan.records import LayerDesc

    def layer(body: list[dict[str, Any]], extra: str) -> Any:
        return LayerDesc("mm", "MatMul", ("A", "B", extra), ("Y",), {"epilogue": {"input": "raw", "body": body}},
                         domain="ai.polykit", in_dtypes=("float16",) * 3, out_dtypes=("float16",),
                         in_shapes=((256, 768), (768, 3072), (3072,) if extra == "bias" else (256, 3072)),
                         out_shapes=((256, 3072),))

    gelu = layer([{"op": "Add", "inputs": ["raw", "bias"], "outputs": ["s"], "attrs": {}},
                  {"op": "Gelu", "inputs": ["s"], "outputs": ["Y"], "attrs": {}}], "bias")
    relu = layer([{"op": "Add", "inputs": ["raw", "skip"], "outputs": ["s"], "attrs": {}},
                  {"op": "Relu", "inputs": ["s"], "outputs": ["Y"], "attrs": {}}], "skip")
    out = [kernel_for(gelu, t, "half_t", True, rolled=True) for t in ROLLED_TILES]
    return out + [kernel_for(relu, ROLLED_TILES[0], "half_t", b_mn, rolled=True) for b_mn in (True, False)]


def _register(tiles: tuple[Sm90Tile, ...], prefix: str, split3: bool) -> None:
    for tile in tiles:
        for kind in ("MatMul", "Gemm"):
            cuda_tactic(kind, f"cuda.gemm.{prefix}_{tile.label}", kernels=tile_kernels(tile, split3),
                        supports=tile_supports(tile, split3), priority=30, archs=ARCHS, estimate=tile_estimate(tile, split3),
                        params={"bm": tile.bm, "bn": tile.bn, "bk": BK, "msub": tile.msub,
                                "consumers": tile.consumers, "stages": tile.stages})(_enqueue(tile, split3))


_register(TILES, "sm90", False)
_register(X3_TILES, "sm90x3", True)

#: the rolled tiles (`cuda.gemm.sm90_rolled_<tile>`: EPI_ROLL 1, gemm_sm90_epilogue.cuh): the one-block tiles of one m64
#: subtile a warpgroup and 128 columns or more, their 16-byte epilogue a loop over the tile's 32-column groups (one
#: group's loads ahead at most) instead of BN / 32 copies of one group's code straight through. The same bytes (host
#: emulation, tests/kernels/cuda/test_sm90_epilogue_emulated.py). Layers with a fused epilogue stored in 16 bits only
#: (what the 16-byte path serves, and where the epilogue's code is long). Variants of their twins (Tactic.variant_of,
#: priority 29 below their 30): level 0 keeps the twins, and a timed build times the rolled twin of the tile the cap
#: ranks best (tuner._with_variants). Untimed on a GPU when added (twenty-fifth session).
ROLLED_TILES = tuple(t for t in TILES if t.blocks == 1 and t.msub == 1 and t.bn >= 128)


def rolled_supports(tile: Sm90Tile):
    twin = tile_supports(tile, False)

    def supports(layer: Any) -> bool:
        return twin(layer) and has_epilogue(layer) and layer_storage(layer) in ("float16", "bfloat16")

    return supports


for _tile in ROLLED_TILES:
    for _kind in ("MatMul", "Gemm"):
        cuda_tactic(_kind, f"cuda.gemm.sm90_rolled_{_tile.label}", kernels=tile_kernels(_tile, False, rolled=True),
                    supports=rolled_supports(_tile), priority=29, archs=ARCHS, estimate=tile_estimate(_tile, False),
                    params={"bm": _tile.bm, "bn": _tile.bn, "bk": BK, "msub": _tile.msub, "rolled_epilogue": 1,
                            "consumers": _tile.consumers, "stages": _tile.stages},
                    variant_of=f"cuda.gemm.sm90_{_tile.label}")(_enqueue(_tile, False, True))

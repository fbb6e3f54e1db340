"""GEMM family: MatMul (batched, broadcasting, 1-D operands) and Gemm (transA/B, alpha, beta, C).

Tactics (kinds "MatMul" and "Gemm"):
  cuda.gemm.simt_wide  tiled fp32 FMA kernel, 128x128x16 tiles, 8x8 outputs a thread; as simt
                  (timed against it: faster on large products, 27 vs 22 TFLOP/s at 4096^3; slower on
                  small ones, so below simt in the level-0 order)
  cuda.gemm.simt  tiled fp32 FMA kernel (64x64x16 tiles); any precision, float/half storage
  cuda.gemm.mma   tensor-core kernel (mma.sync m16n8k16, fp16 operands, fp32 accumulation);
                  only for layers built with precision "fp16" (storage may stay float32: the
                  operands are rounded to fp16 as they are staged in shared memory)
Both split K over several blocks when the output has too few tiles to fill the GPU (see
`split_k`): the slices write fp32 partial tiles into a workspace and `gemm_splitk_reduce` (same
module) sums them in a fixed order and applies alpha/beta/C/epilogue, so results stay
deterministic.
Storage dtype is a kernel variant (ELEM = float | half_t, and bf16_t for the SIMT kernels); all are compiled for a layer
because a LayerDesc does not carry tensor dtypes; enqueue picks the one matching its tensors.
Layers with an epilogue (ai.polykit Gemm/MatMul, docs/FUSION.md) run it inside the kernel
(epilogue.py) on each fp32 result before the store.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from polykit.compiler.ir.dtypes import EXTENDED_TYPES, to_numpy
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, cuda_tactic, defines, stored_as
from polykit.kernels.cuda.gemm.epilogue import epilogue_args, kernel_source, supports_epilogue

ELEMS = {np.dtype(np.float32): "float", np.dtype(np.float16): "half_t"}
#: storage the SIMT GEMM kernels also take: bfloat16 (loaded as float, rounded once at the store);
#: the conv/pool families and the fp16 mma kernel keep ELEMS
SIMT_ELEMS = {**ELEMS, **({to_numpy(16): "bf16_t"} if 16 in EXTENDED_TYPES else {})}
#: the ELEM variants the SIMT kernels are generated in: bf16_t too where ml_dtypes (numpy's bfloat16)
#: is not installed, so a plan's kernels are the same with or without it (the lean runtime)
SIMT_VARIANTS = (*ELEMS.values(), "bf16_t")
MAX_GRID_Z = 65535
#: kernel name -> (block tile M, block tile N, block tile K)
TILES = {"gemm_simt": (64, 64, 16), "gemm_simt_wide": (128, 128, 16), "gemm_mma": (128, 128, 32),
         "conv_igemm_simt": (64, 64, 16), "conv_igemm_simt_wide": (128, 128, 16), "conv_igemm_mma": (128, 128, 32),
         "conv_nhwc_igemm_simt": (64, 64, 16), "conv_nhwc_igemm_simt_wide": (128, 128, 16),
         "conv_nhwc_igemm_mma": (128, 128, 32)}
#: most K slices of one launch, and the fewest K tiles a slice gets
MAX_SPLITS, MIN_SLICE_TILES = 32, 4


def split_k(tiles: int, K: int, bk: int, sms: int, items: int) -> int:
    """K slices for a launch of `tiles` output tiles: one when the tiles fill the SMs, else
    enough for about two blocks per SM, each slice at least MIN_SLICE_TILES K tiles deep."""
    if tiles >= sms or sms <= 0:
        return 1
    return max(1, min(-(-2 * sms // tiles), K // (MIN_SLICE_TILES * bk), MAX_SPLITS, MAX_GRID_Z // max(items, 1)))


def launch_tiled(launcher: Any, kernel: KernelSource, reduce_name: str, M: int, N: int, K: int, items: int,
                 args: list[Any], epi_args: list[Any]) -> int:
    """Launch a tiled GEMM / implicit-GEMM kernel over `items` batch items (grid z), split
    along K when that fills the GPU better; returns the split count used."""
    bm, bn, bk = TILES[kernel.name]
    grid = ((N + bn - 1) // bn, (M + bm - 1) // bm)
    splits = split_k(grid[0] * grid[1] * items, K, bk, launcher.sm_count, items)
    partial = launcher.workspace(4 * splits * items * M * N) if splits > 1 else 0
    if not partial:  # a launcher without scratch memory (benchmarks' `lambda n: 0`): no split
        splits = 1
    launcher.launch(kernel, (*grid, items * splits), (256,), args + [splits, partial] + epi_args)
    if splits > 1:
        reduce = KernelSource(reduce_name, kernel.file, kernel.code, kernel.defines)
        launcher.launch(reduce, (min((M * N + 255) // 256, 4096), 1, items), (256,),
                        args + [splits, partial] + epi_args)
    return splits


def elem_of(t: DeviceTensor, where: str, elems: Mapping[np.dtype, str] = ELEMS) -> str:
    elem = elems.get(np.dtype(t.dtype))
    if elem is None:
        raise DeviceError(f"these cuda kernels take {'/'.join(d.name for d in elems)} tensors, not {t.dtype}",
                          where=where, hint="run this layer on --target cpu")
    return elem


def variants(kernel: str, file: str = "gemm.cu", elems: Sequence[str] = tuple(ELEMS.values())) -> list[KernelSource]:
    return [KernelSource(kernel, file=file, defines=defines(ELEM=e)) for e in elems]


def compile_variants() -> list[KernelSource]:
    return (variants("gemm_simt", elems=SIMT_VARIANTS) + variants("gemm_simt_wide", elems=SIMT_VARIANTS)
            + variants("gemm_mma") + variants("gemm_splitk_reduce", elems=SIMT_VARIANTS))


def layer_variants(kernel: str, elems: Sequence[str] = tuple(ELEMS.values())):
    """kernels(layer) of a tactic: `kernel` for each storage type (ELEM), with the layer's epilogue."""
    return lambda layer: [kernel_source(layer, kernel, "gemm.cu", e) for e in elems]


def _fp16(layer: Any) -> bool:
    return supports_epilogue(layer) and layer.precision == "fp16"


def batch_geometry(batch: Sequence[int], a_batch: Sequence[int], a_strides: Sequence[int],
                   b_batch: Sequence[int], b_strides: Sequence[int]) -> tuple[list[int], list[int], list[int]]:
    """Collapse broadcast batch dims: (dims, a_strides, b_strides), size-1 dims dropped,
    mergeable neighbours merged (stride 0 where an operand broadcasts)."""
    r = len(batch)

    def aligned(shape, strides):
        pad = r - len(shape)
        return [0 if i < pad or shape[i - pad] == 1 else strides[i - pad] for i in range(r)]

    sa, sb = aligned(a_batch, a_strides), aligned(b_batch, b_strides)
    dims, oa, ob = [], [], []
    for d, x, y in zip(batch, sa, sb):
        if d == 1:
            continue
        if dims and oa[-1] == x * d and ob[-1] == y * d:
            dims[-1] *= d
            oa[-1], ob[-1] = x, y
            continue
        dims.append(d), oa.append(x), ob.append(y)
    return dims, oa, ob


def _contig_strides(shape: Sequence[int], inner: int) -> list[int]:
    out, acc = [], inner
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return out[::-1]


def gemm_args(A: DeviceTensor, B: DeviceTensor, C: DeviceTensor | None, Y: DeviceTensor, *, M: int, N: int, K: int,
              sam: int, sak: int, sbk: int, sbn: int, scm: int = 0, scn: int = 0, alpha: float = 1.0,
              beta: float = 0.0, batch: Sequence[int] = (), a_bs: Sequence[int] = (), b_bs: Sequence[int] = (),
              where: str = "") -> tuple[int, list[Any]]:
    """(batch count, kernel argument list) for gemm_simt / gemm_mma."""
    if len(batch) > 4:
        raise DeviceError(f"MatMul with {len(batch)} non-mergeable batch dims (at most 4)", where=where,
                          hint="reshape the operands to fewer batch dims, or run on --target cpu")
    pad = 4 - len(batch)
    dims = [1] * pad + list(batch)
    sa = [0] * pad + list(a_bs)
    sb = [0] * pad + list(b_bs)
    count = int(np.prod(dims))
    if count > MAX_GRID_Z:
        raise DeviceError(f"batch of {count} matrices exceeds the grid limit {MAX_GRID_Z}", where=where)
    cptr = C if C is not None else 0
    args = [A, B, cptr, Y, M, N, K, sam, sak, sbk, sbn, scm, scn, np.float32(alpha), np.float32(beta),
            dims[1], dims[2], dims[3], *sa, *sb]
    return count, args


def launch_gemm(launcher: Any, layer: Any, kernel_name: str, elem: str, count: int, M: int, N: int, K: int,
                args: list[Any], epi_args: list[Any]) -> int:
    kernel = kernel_source(layer, kernel_name, "gemm.cu", elem)
    return launch_tiled(launcher, kernel, "gemm_splitk_reduce", M, N, K, count, args, epi_args)


def matmul_problem(layer: Any, tensors: Mapping[str, DeviceTensor]) -> tuple[str, int, int, int, int, list[Any]]:
    where = f"layer {layer.name!r}"
    A, B, Y = tensors[layer.inputs[0]], tensors[layer.inputs[1]], tensors[layer.outputs[0]]
    elem = elem_of(A, where, SIMT_ELEMS)  # the tactics' `supports` narrow it (mma: float16)
    if len(A.shape) == 1:
        M, K, sam, sak, a_batch = 1, A.shape[0], 0, 1, ()
    else:
        M, K, a_batch = A.shape[-2], A.shape[-1], A.shape[:-2]
        sam, sak = K, 1
    if len(B.shape) == 1:
        N, sbk, sbn, b_batch = 1, 1, 0, ()
        kb = B.shape[0]
    else:
        kb, N, b_batch = B.shape[-2], B.shape[-1], B.shape[:-2]
        sbk, sbn = N, 1
    if kb != K:
        raise DeviceError(f"MatMul inner dims differ: {A.shape} x {B.shape}", where=where)
    batch = np.broadcast_shapes(tuple(a_batch), tuple(b_batch))
    dims, abs_, bbs = batch_geometry(batch, a_batch, _contig_strides(a_batch, M * K),
                                     b_batch, _contig_strides(b_batch, K * N))
    count, args = gemm_args(A, B, None, Y, M=M, N=N, K=K, sam=sam, sak=sak, sbk=sbk, sbn=sbn, batch=dims,
                            a_bs=abs_, b_bs=bbs, where=where)
    return elem, count, M, N, K, args


def gemm_problem(layer: Any, tensors: Mapping[str, DeviceTensor]) -> tuple[str, int, int, int, int, list[Any]]:
    where = f"layer {layer.name!r}"
    A, B, Y = tensors[layer.inputs[0]], tensors[layer.inputs[1]], tensors[layer.outputs[0]]
    C = tensors.get(layer.inputs[2]) if len(layer.inputs) > 2 and layer.inputs[2] else None
    elem = elem_of(A, where, SIMT_ELEMS)  # the tactics' `supports` narrow it (mma: float16)
    ta, tb = int(layer.attrs.get("transA", 0)), int(layer.attrs.get("transB", 0))
    M, K = (A.shape[1], A.shape[0]) if ta else A.shape
    sam, sak = (1, M) if ta else (K, 1)
    kb, N = (B.shape[1], B.shape[0]) if tb else B.shape
    sbk, sbn = (1, K) if tb else (N, 1)
    if kb != K:
        raise DeviceError(f"Gemm inner dims differ: {A.shape} x {B.shape} (transA={ta}, transB={tb})", where=where)
    scm = scn = 0
    if C is not None:
        cs = C.shape
        if len(cs) == 1:
            scn = 1 if cs[0] > 1 else 0
        elif len(cs) == 2:
            scm, scn = (cs[1] if cs[0] > 1 else 0), (1 if cs[1] > 1 else 0)
    count, args = gemm_args(A, B, C, Y, M=M, N=N, K=K, sam=sam, sak=sak, sbk=sbk, sbn=sbn, scm=scm, scn=scn,
                            alpha=float(layer.attrs.get("alpha", 1.0)), beta=float(layer.attrs.get("beta", 1.0)),
                            where=where)
    return elem, count, M, N, K, args


_PROBLEMS = {"MatMul": matmul_problem, "Gemm": gemm_problem}


def _enqueue_with(kernel_name: str):
    def enqueue(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor]) -> None:
        elem, count, M, N, K, args = _PROBLEMS[layer.kind](layer, tensors)
        dtype = next(d for d, e in SIMT_ELEMS.items() if e == elem)
        launch_gemm(launcher, layer, kernel_name, elem, count, M, N, K, args, epilogue_args(layer, tensors, dtype))

    return enqueue


def tiled_workspace(kernel: str, problem: Any):
    """workspace_fn of a tactic that launches `kernel` through launch_tiled: the fp32 split-K
    partials it asks for, from `problem(layer, tensors) -> (elem, items, M, N, K, args)` run
    on shape-only tensors."""
    bm, bn, bk = TILES[kernel]

    def workspace(layer: Any, tensors: Mapping[str, Any], sm_count: int) -> int:
        shaped = {n: DeviceTensor(0, tuple(tensors[n].shape), np.dtype(tensors[n].dtype))
                  for n in (*layer.inputs, *layer.outputs) if n in tensors}
        try:
            _, items, M, N, K, _ = problem(layer, shaped)
        except (DeviceError, KeyError, IndexError, ValueError):
            return 0  # the layer fails at enqueue with the problem's own error
        splits = split_k(-(-N // bn) * -(-M // bm) * items, K, bk, sm_count, items)
        return 4 * splits * items * M * N if splits > 1 else 0

    return workspace


def tile_params(kernel: str) -> dict[str, int]:
    return dict(zip(("tile_m", "tile_n", "tile_k"), TILES[kernel]))


#: numpy names of the storage dtypes of ELEMS (what the tactics take)
STORED = tuple(d.name for d in ELEMS)
SIMT_STORED = (*STORED, "bfloat16")
for _kind in _PROBLEMS:
    cuda_tactic(_kind, "cuda.gemm.mma", kernels=layer_variants("gemm_mma"), supports=stored_as(*STORED, then=_fp16),
                priority=10,
                params=tile_params("gemm_mma"), workspace=tiled_workspace("gemm_mma", _PROBLEMS[_kind]))(
        _enqueue_with("gemm_mma"))
    cuda_tactic(_kind, "cuda.gemm.simt_wide", kernels=layer_variants("gemm_simt_wide", SIMT_VARIANTS),
                supports=stored_as(*SIMT_STORED, then=supports_epilogue), priority=-1,  # the tuner's choice, not level 0's
                params=tile_params("gemm_simt_wide"), workspace=tiled_workspace("gemm_simt_wide", _PROBLEMS[_kind]))(
        _enqueue_with("gemm_simt_wide"))
    cuda_tactic(_kind, "cuda.gemm.simt", kernels=layer_variants("gemm_simt", SIMT_VARIANTS),
                supports=stored_as(*SIMT_STORED, then=supports_epilogue), priority=0, conservative=True,
                params=tile_params("gemm_simt"), workspace=tiled_workspace("gemm_simt", _PROBLEMS[_kind]))(
        _enqueue_with("gemm_simt"))

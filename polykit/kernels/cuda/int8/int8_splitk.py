"""Split-K for INT8 QMatMul (int8.cu's int8_matmul_splitk + int8_splitk_reduce): for products with
few 128x128 output tiles and a long K, as a classifier's fc (ResNet-50 bs32: M 32, N 1000, K 2048
is 8 tiles for 132 SMs).

Tactics `cuda.int8.mma_matmul_sk<S>` take what `cuda.int8.mma_matmul` takes. Slice z of the S
(at most; fewer when K is short) sums K range [z * kslice, (z + 1) * kslice), kslice a multiple
of the 64-byte K step, centered with its own zero-point corrections into an int32 workspace
[S, M, N]; the reduce adds the slices and runs int8_out.cuh's output per element. Integers sum
exactly in any order, so the results are `cuda.int8.mma_matmul`'s (and the reference's) bit for
bit. Priority 5 (below the unsplit tactic's 10): level 0 keeps mma_matmul, the tuner times them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, cuda_tactic
from polykit.kernels.cuda.gemm.epilogue import epilogue_args, kernel_source
from polykit.kernels.cuda.int8.int8 import (FILE, TILE, entries, half_layer, half_out, int8_args, output_type,
                                          residual_layer, supports)

KIND = "QMatMul"
KERNEL, REDUCE = "int8_matmul_splitk", "int8_splitk_reduce"
#: K slices of the tactics
SPLITS = (4, 8, 16)
REDUCE_BLOCK = 256


def slicing(k: int, splits: int) -> tuple[int, int]:
    """(kslice, slices): K cut into at most `splits` ranges of whole 64-byte steps."""
    step = TILE["tile_k"]
    kslice = -(-max(1, -(-k // splits)) // step) * step
    return kslice, max(1, -(-k // kslice))


def _sizes(layer: Any, tensors: Mapping[str, Any]) -> tuple[int, int, int] | None:
    """(M, N, K) from the bound tensors, or None when they are not 2-D W products."""
    x, w = (tensors.get(layer.inputs[i]) for i in (0, 2))
    if x is None or w is None or len(w.shape) != 2 or len(x.shape) < 2:
        return None
    return int(np.prod(x.shape[:-1])), int(w.shape[1]), int(w.shape[0])


def _workspace(splits: int):
    def workspace(layer: Any, tensors: Mapping[str, Any], sm_count: int) -> int:
        sizes = _sizes(layer, tensors)
        if sizes is None:
            return 0
        m, n, k = sizes
        return 4 * slicing(k, splits)[1] * m * n

    return workspace


def _supports(layer: Any) -> bool:
    return layer.kind == KIND and supports(layer)


def _kernels(layer: Any, y_dtype: str | None = None) -> list[KernelSource]:
    """The split kernel and its reduce (which stores the output: a float16 one compiled in, int8.half_out)."""
    y = y_dtype or output_type(layer)
    return [entries(half_out(kernel_source(layer, k, FILE, "float"), y)) for k in (KERNEL, REDUCE)]


def _enqueue(splits: int):
    def enqueue(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor]) -> None:
        g, args = int8_args(layer, tensors)
        if g["M"] == 0 or g["N"] == 0:
            return
        kslice, s = slicing(g["K"], splits)
        nbytes = 4 * s * g["M"] * g["N"]
        partial = launcher.workspace(nbytes)
        if not partial:
            raise DeviceError(f"split-K needs {nbytes} bytes of workspace, the launcher lent none",
                              where=f"layer {layer.name!r}", hint="run the layer through an engine or harness "
                              "that lends workspace")
        epi = epilogue_args(layer, tensors, np.dtype(np.float32))
        main, reduce = _kernels(layer, tensors[layer.outputs[0]].dtype.name)
        grid = (-(-g["N"] // TILE["tile_n"]), -(-g["M"] // TILE["tile_m"]), s)
        launcher.launch(main, grid, (256,), args + epi + [partial, kslice])
        blocks = max(1, min(-(-g["M"] * g["N"] // REDUCE_BLOCK), 16 * launcher.sm_count))
        launcher.launch(reduce, (blocks,), (REDUCE_BLOCK,), args + epi + [partial, s])

    return enqueue


def compile_variants() -> list[KernelSource]:
    """Both kernels plain, with each residual epilogue, and with a float16 output (int8.half_layer)."""
    plain = replace(residual_layer(KIND, "int8"), attrs={})
    return [k for layer in (plain, residual_layer(KIND, "float32"), residual_layer(KIND, "int8"), half_layer(KIND))
            for k in _kernels(layer)]


for _splits in SPLITS:
    cuda_tactic(KIND, f"cuda.int8.mma_matmul_sk{_splits}", kernels=_kernels, supports=_supports, priority=5,
                workspace=_workspace(_splits), params={**TILE, "splits": _splits}, domain=POLYKIT_DOMAIN)(
        _enqueue(_splits))

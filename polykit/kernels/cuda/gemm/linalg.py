"""Det tactic (linalg.cu): one thread per matrix, LU with partial pivoting in double in a
workspace copy (B * M * M doubles)."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from polykit.kernels.cuda.base import DeviceTensor, KernelSource, Launcher, cuda_tactic, storage_code, stored_as
from polykit.kernels.cuda.storage_types import CODE, dtype_names

FILE = "linalg.cu"
DTYPES = ("f32", "f16", "f64")
BLOCK = 128


def _kernels(layer) -> list[KernelSource]:
    return [KernelSource(f"det_{c}", FILE) for c in DTYPES]


def _lu_bytes(layer, tensors, sm_count: int) -> int:
    x = tensors.get(layer.inputs[0])
    return 0 if x is None else 8 * int(np.prod(x.shape, dtype=np.int64))


def enqueue_det(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    x, y = tensors[layer.inputs[0]], tensors[layer.outputs[0]]
    code = storage_code(layer, x, CODE, DTYPES)
    batch, m = y.size, x.shape[-1]
    if batch == 0:
        return
    lu = launcher.workspace(max(8 * x.size, 8))
    grid = (max(1, min(-(-batch // BLOCK), 65535)), 1, 1)
    launcher.launch(KernelSource(f"det_{code}", FILE), grid, (BLOCK, 1, 1), [x, y, lu, batch, m])


cuda_tactic("Det", "cuda.linalg.det", kernels=_kernels, supports=stored_as(*dtype_names(DTYPES)),
            workspace=_lu_bytes)(enqueue_det)


def compile_variants() -> list[KernelSource]:
    return _kernels(None)

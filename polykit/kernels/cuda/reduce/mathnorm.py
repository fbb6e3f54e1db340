"""LpNormalization and MeanVarianceNormalization tactics (mathnorm.cu).

The host splits the input's dims into kept and reduced runs; a block reduces each kept
index when the innermost dim is reduced (or few groups exist), a thread does when the
innermost dim is kept (coalesced column walk).
"""

from __future__ import annotations

from typing import Mapping, Sequence

from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, Launcher, cuda_tactic, stored_as
from polykit.kernels.cuda.storage_types import CODE, dtype_names
from polykit.kernels.cuda.reduce.reduce import block_for

FILE = "mathnorm.cu"
DTYPES = ("f32", "f16", "f64")
STORED = dtype_names(DTYPES)
MAXD = 4
MAX_GRID = 1 << 16
COLS_MIN_GROUPS = 256

Run = tuple[int, int]  # (size, element stride)


def split_runs(shape: Sequence[int], reduced: set[int]) -> tuple[list[Run], list[Run]]:
    """Kept and reduced (size, stride) runs of a contiguous tensor, innermost first, with
    size-1 dims dropped and neighbours of the same kind merged."""
    kept: list[Run] = []
    red: list[Run] = []
    stride, last = 1, None
    for axis in range(len(shape) - 1, -1, -1):
        n = int(shape[axis])
        kind = axis in reduced
        if n != 1:
            runs = red if kind else kept
            if last is kind and runs:
                runs[-1] = (runs[-1][0] * n, runs[-1][1])
            else:
                runs.append((n, stride))
            last = kind
        stride *= n
    return kept, red


def _padded(runs: list[Run]) -> tuple[list[int], list[int]]:
    runs = runs + [(1, 0)] * (MAXD - len(runs))
    return [r[0] for r in runs], [r[1] for r in runs]


def _reduced_axes(layer, rank: int) -> set[int]:
    if layer.kind == "LpNormalization":
        return {int(layer.attrs.get("axis", -1)) % rank}
    return {int(a) % rank for a in layer.attrs.get("axes", [0, 2, 3])}


def _kernels(layer) -> list[KernelSource]:
    return [KernelSource(f"mathnorm_{p}_{c}", FILE) for p in ("rows", "cols") for c in DTYPES]


def enqueue_mathnorm(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    where = f"layer {layer.name!r}"
    x, y = tensors[layer.inputs[0]], tensors[layer.outputs[0]]
    code = CODE.get(x.dtype.name)
    if code not in DTYPES:
        raise DeviceError(f"{layer.kind} has no CUDA kernel for {x.dtype}", where=where, hint="use --target cpu")
    if x.size == 0:
        return
    if not x.shape:
        raise DeviceError(f"{layer.kind} of a scalar", where=where)
    kept, red = split_runs(x.shape, _reduced_axes(layer, len(x.shape)))
    if len(kept) > MAXD or len(red) > MAXD:
        raise DeviceError(f"{layer.kind} over a rank-{len(x.shape)} tensor with these axes has too many "
                          f"alternating kept/reduced dims", where=where, hint="use --target cpu")
    groups = 1
    for n, _ in kept:
        groups *= n
    r = x.size // groups
    if layer.kind == "LpNormalization":
        mode = 0 if int(layer.attrs.get("p", 2)) == 1 else 1
    else:
        mode = 2
    kd, ks = _padded(kept)
    rd, rs = _padded(red)
    args = [x, y, groups, r, mode, *kd, *ks, *rd, *rs]
    if kept and kept[0][1] == 1 and groups >= COLS_MIN_GROUPS:
        launcher.launch(KernelSource(f"mathnorm_cols_{code}", FILE), (min(-(-groups // 128), MAX_GRID), 1, 1),
                        (128, 1, 1), args)
    else:
        launcher.launch(KernelSource(f"mathnorm_rows_{code}", FILE), (min(groups, MAX_GRID), 1, 1),
                        (block_for(r), 1, 1), args)


for _kind in ("LpNormalization", "MeanVarianceNormalization"):
    cuda_tactic(_kind, "cuda.mathnorm", kernels=_kernels, supports=stored_as(*STORED))(enqueue_mathnorm)


def compile_variants() -> list[KernelSource]:
    """The one mathnorm.cu module (every dtype and walk is an entry point in it)."""
    return _kernels(None)

"""Reduce* and ArgMax/ArgMin tactics (reduce.cu): one block per output, deterministic block reductions.

The axes input of Reduce* (opset >= 18) is read by the kernel on the device, so enqueue
needs no host copy of it; only its length (from the tensor's shape) is used on the host.
"""

from __future__ import annotations

from typing import Mapping

from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, Launcher, cuda_tactic, defines
from polykit.kernels.cuda.storage_types import CODE

FILE = "reduce.cu"
MAXR = 8
OPS = {"ReduceSum": 0, "ReduceMean": 1, "ReduceMax": 2, "ReduceMin": 3, "ReduceProd": 4, "ReduceL1": 5,
       "ReduceL2": 6, "ReduceSumSquare": 7, "ReduceLogSum": 8, "ReduceLogSumExp": 9}
REDUCE_DTYPES = ("f32", "f16", "bf16", "f64", "i32", "i64", "b8")
ARG_DTYPES = ("f32", "f16", "bf16", "f64", "i32", "i64")


def unit(code: str) -> tuple[tuple[str, str], ...]:
    """Defines that compile only dtype `code`'s entry points of a split .cu (one unit per dtype)."""
    return defines(PK_SPLIT=1, **{f"PK_ONLY_{code}": 1})


def block_for(r: int) -> int:
    """Threads per output: the smallest of 32/64/128/256 covering R (256 for long rows)."""
    for b in (32, 64, 128):
        if r <= b:
            return b
    return 256


def geometry_args(x: DeviceTensor, axes: DeviceTensor | None, n_axes: int, mask: int, n_out: int, r: int,
                  where: str) -> list:
    if len(x.shape) > MAXR:
        raise DeviceError(f"reduction over a rank-{len(x.shape)} tensor (at most {MAXR})", where=where,
                          hint="use --target cpu")
    dims = list(x.shape) + [1] * (MAXR - len(x.shape))
    return [axes.ptr if axes is not None else 0, n_axes, mask, len(x.shape), *dims, n_out, r]


def _reduce_kernels(layer) -> list[KernelSource]:
    return [KernelSource(f"reduce_{c}", FILE, defines=unit(c)) for c in REDUCE_DTYPES]


def _arg_kernels(layer) -> list[KernelSource]:
    return [KernelSource(f"{layer.kind.lower()}_{c}", FILE, defines=unit(c)) for c in ARG_DTYPES]


def dtype_code(prefix: str, t: DeviceTensor, allowed, where: str) -> str:
    """reduce.cu's name suffix for `t`'s dtype (one of `allowed`)."""
    code = CODE.get(t.dtype.name)
    if code not in allowed:
        raise DeviceError(f"{prefix} has no CUDA kernel for {t.dtype}", where=where, hint="use --target cpu")
    return code


def _kernel(prefix: str, t: DeviceTensor, allowed, where: str) -> KernelSource:
    code = dtype_code(prefix, t, allowed, where)
    return KernelSource(f"{prefix}_{code}", FILE, defines=unit(code))


def enqueue_reduce(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    where = f"layer {layer.name!r}"
    x, y = tensors[layer.inputs[0]], tensors[layer.outputs[0]]
    op = OPS[layer.kind]
    axes = tensors.get(layer.inputs[1]) if len(layer.inputs) > 1 and layer.inputs[1] else None
    n_axes = axes.size if axes is not None else 0
    if n_axes == 0:
        axes = None
        if layer.attrs.get("noop_with_empty_axes", 0):
            op, mask = OPS["ReduceSum"], 0  # a sum over nothing: the identity copy
        else:
            mask = (1 << len(x.shape)) - 1
    else:
        mask = -1
    n_out = y.size
    if n_out == 0:
        return
    r = x.size // n_out
    args = [x, y, op, *geometry_args(x, axes, n_axes, mask, n_out, r, where)]
    launcher.launch(_kernel("reduce", x, REDUCE_DTYPES, where), (min(n_out, 1 << 20), 1, 1), (block_for(r), 1, 1), args)


def enqueue_arg(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    where = f"layer {layer.name!r}"
    x, y = tensors[layer.inputs[0]], tensors[layer.outputs[0]]
    rank = max(len(x.shape), 1)
    axis = int(layer.attrs.get("axis", 0)) % rank
    n_out = y.size
    if n_out == 0:
        return
    r = x.shape[axis] if x.shape else 1
    args = [x, y, int(layer.attrs.get("select_last_index", 0)),
            *geometry_args(x, None, 0, 1 << axis if x.shape else 0, n_out, r, where)]
    launcher.launch(_kernel(layer.kind.lower(), x, ARG_DTYPES, where), (min(n_out, 1 << 20), 1, 1),
                    (block_for(r), 1, 1), args)


for _kind in OPS:
    cuda_tactic(_kind, "cuda.reduce", kernels=_reduce_kernels)(enqueue_reduce)
for _kind in ("ArgMax", "ArgMin"):
    cuda_tactic(_kind, "cuda.reduce.arg", kernels=_arg_kernels)(enqueue_arg)


def compile_variants() -> list[KernelSource]:
    """The one reduce.cu module (every op and dtype is an entry point in it)."""
    return [KernelSource(f"reduce_{c}", FILE, defines=unit(c)) for c in REDUCE_DTYPES] + \
        [KernelSource(f"arg{m}_{c}", FILE, defines=unit(c)) for m in ("max", "min") for c in ARG_DTYPES]

"""Integer product tactics (intmath.cu): MatMulInteger and ConvInteger on int8/uint8 operands
with optional zero points, int32 output."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from polykit.compiler.ops.nn.conv import window_geometry
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, Launcher, cuda_tactic
from polykit.kernels.cuda.launch_geometry import BLOCK, grid_for

FILE = "intmath.cu"
TILE = 16
MAXB = 6
CODES = {np.dtype(np.int8): "i8", np.dtype(np.uint8): "u8"}


def _kernels(prefix: str):
    return lambda layer: [KernelSource(f"{prefix}_{a}_{b}", FILE) for a in CODES.values() for b in CODES.values()]


def _code(t: DeviceTensor, where: str) -> str:
    code = CODES.get(t.dtype)
    if code is None:
        raise DeviceError(f"an integer product operand of dtype {t.dtype} (int8/uint8 expected)", where=where,
                          hint="use --target cpu")
    return code


def _opt(layer, tensors: Mapping[str, DeviceTensor], i: int) -> DeviceTensor | None:
    return tensors[layer.inputs[i]] if len(layer.inputs) > i and layer.inputs[i] else None


def _zero_point(zp: DeviceTensor | None, per: int, what: str, where: str) -> tuple[DeviceTensor | int, int]:
    """(pointer argument, count) of a zero point: count 0 none, 1 one value, `per` one per row/column."""
    if zp is None or zp.size == 0:
        return 0, 0
    if zp.size not in (1, per):
        raise DeviceError(f"{what} has {zp.size} values (1 or {per} expected)", where=where)
    return zp, zp.size


def batch_geometry(a_shape, b_shape, m: int, n: int, k: int, where: str):
    """(nbatch, dims, A strides, B strides) of the broadcast batch dims, in elements."""
    a_batch, b_batch = tuple(a_shape[:-2]), tuple(b_shape[:-2])
    rank = max(len(a_batch), len(b_batch))
    a_batch = (1,) * (rank - len(a_batch)) + a_batch
    b_batch = (1,) * (rank - len(b_batch)) + b_batch
    dims = [max(x, y) for x, y in zip(a_batch, b_batch)]

    def strides(batch, matrix):
        out, acc = [0] * rank, matrix
        for d in range(rank - 1, -1, -1):
            out[d] = 0 if batch[d] == 1 else acc
            acc *= batch[d]
        return out

    sa, sb = strides(a_batch, m * k), strides(b_batch, k * n)
    keep = [d for d in range(rank) if dims[d] != 1]
    dims, sa, sb = [dims[d] for d in keep], [sa[d] for d in keep], [sb[d] for d in keep]
    if len(dims) > MAXB:
        raise DeviceError(f"{len(dims)} batch dims (at most {MAXB})", where=where, hint="use --target cpu")
    nbatch = int(np.prod(dims, dtype=np.int64))
    pad = lambda v, f: v + [f] * (MAXB - len(v))  # noqa: E731
    return nbatch, len(dims), pad(dims, 1), pad(sa, 0), pad(sb, 0)


def enqueue_matmul_integer(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    a, b, y = tensors[layer.inputs[0]], tensors[layer.inputs[1]], tensors[layer.outputs[0]]
    where = f"layer {layer.name!r}"
    name = f"mmi_{_code(a, where)}_{_code(b, where)}"
    a_shape = (1,) + tuple(a.shape) if len(a.shape) == 1 else tuple(a.shape)
    b_shape = tuple(b.shape) + (1,) if len(b.shape) == 1 else tuple(b.shape)
    m, k, n = a_shape[-2], a_shape[-1], b_shape[-1]
    if b_shape[-2] != k:
        raise DeviceError(f"MatMulInteger of {a.shape} and {b.shape}: inner dims differ", where=where)
    azp, azp_n = _zero_point(_opt(layer, tensors, 2), m, "a_zero_point", where)
    bzp, bzp_n = _zero_point(_opt(layer, tensors, 3), n, "b_zero_point", where)
    if y.size == 0:
        return
    nbatch, nb, dims, sa, sb = batch_geometry(a_shape, b_shape, m, n, k, where)
    grid = (-(-n // TILE), -(-m // TILE), min(nbatch, 65535))
    if grid[1] > 65535:
        raise DeviceError(f"{m} rows exceed the grid", where=where, hint="use --target cpu")
    args = [a, b, azp, azp_n, bzp, bzp_n, y, m, n, k, nbatch, nb, *dims, *sa, *sb]
    launcher.launch(KernelSource(name, FILE), grid, (TILE, TILE, 1), args)


def _to3(values, fill: int) -> list[int]:
    return [fill] * (3 - len(values)) + [int(v) for v in values]


def enqueue_conv_integer(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    x, w, y = tensors[layer.inputs[0]], tensors[layer.inputs[1]], tensors[layer.outputs[0]]
    where = f"layer {layer.name!r}"
    name = f"convi_{_code(x, where)}_{_code(w, where)}"
    spatial, kernel = x.shape[2:], w.shape[2:]
    if not 1 <= len(spatial) <= 3:
        raise DeviceError(f"{len(spatial)} spatial dims (the cuda kernel takes 1 to 3)", where=where,
                          hint="use --target cpu")
    geo = window_geometry(layer.attrs, spatial, kernel, where=where)
    nb, c = x.shape[:2]
    m = w.shape[0]
    xzp = _opt(layer, tensors, 2)
    if xzp is not None and xzp.size > 1:
        raise DeviceError(f"x_zero_point has {xzp.size} values (one expected)", where=where)
    wzp, wzp_n = _zero_point(_opt(layer, tensors, 3), m, "w_zero_point", where)
    if y.size == 0:
        return
    args = [x, w, xzp if xzp is not None and xzp.size else 0, wzp, wzp_n, y, nb, c, *_to3(spatial, 1), m,
            *_to3(y.shape[2:], 1), *_to3(kernel, 1), *_to3(geo.strides, 1), *_to3(geo.pads_begin, 0),
            *_to3(geo.dilations, 1), int(layer.attrs.get("group", 1))]
    launcher.launch(KernelSource(name, FILE), grid_for(y.size), (BLOCK, 1, 1), args)


def _plain(layer) -> bool:
    return layer.domain in ("", "ai.onnx")


cuda_tactic("MatMulInteger", "cuda.intmath.matmul", kernels=_kernels("mmi"), supports=_plain)(enqueue_matmul_integer)
cuda_tactic("ConvInteger", "cuda.intmath.conv", kernels=_kernels("convi"), supports=_plain)(enqueue_conv_integer)


def compile_variants() -> list[KernelSource]:
    """The one intmath.cu module (every kernel is an entry point in it)."""
    return [KernelSource("mmi_i8_i8", FILE)]

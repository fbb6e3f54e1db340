"""Pooling family: MaxPool (with optional Indices), AveragePool, LpPool and their Global forms;
the channels-last MaxPoolNHWC and AveragePoolNHWC (ai.polykit, docs/FUSION.md "Channels last").

One thread per output element for windowed pools (geometry from the compiler's
window_geometry, so auto_pad / ceil_mode / dilations match the shape rules), one block per
(n, c) row with a deterministic shared-memory tree reduction for global pools. fp32 compute
for float and half storage. Tactics: cuda.pool.window (kinds MaxPool, AveragePool, LpPool),
cuda.pool.global (GlobalMaxPool, GlobalAveragePool, GlobalLpPool), cuda.pool_nhwc.window
(MaxPoolNHWC, AveragePoolNHWC: one thread per output, channels fastest; MaxPoolNHWC also on
int8/uint8, 16 channels a thread when C % 16 == 0: the pool between INT8 layers, and on float8_e4m3fn,
compared as order-preserving byte keys (pool.cu e4m3_keys): the pool between FP8 layers).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from polykit.compiler.ir.dtypes import EXTENDED_TYPES
from polykit.compiler.ops.nn.conv import window_geometry
from polykit.kernels.cuda.base import (DeviceTensor, KernelSource, cuda_tactic, defines, places_last_axis,
                                       reads_last_axis, stored_as)
from polykit.kernels.cuda.conv.conv import _grid_1d, _to3
from polykit.errors import DeviceError
from polykit.kernels.cuda.gemm.gemm import ELEMS, STORED, elem_of

MODES = {"MaxPool": 0, "AveragePool": 1, "LpPool": 2, "GlobalMaxPool": 0, "GlobalAveragePool": 1, "GlobalLpPool": 2,
         "MaxPoolNHWC": 0, "AveragePoolNHWC": 1}
NHWC_KINDS = ("MaxPoolNHWC", "AveragePoolNHWC")
BLOCK = 256
#: MaxPool also takes 8-bit integers (exact in the fp32 compute)
MAX_INT_ELEMS = {np.dtype(np.uint8): "u8", np.dtype(np.int8): "i8"}
#: MaxPoolNHWC also takes float8_e4m3fn (ELEM "e4m3": u8 storage, POOL_E4M3 1); absent where ml_dtypes is not
E4M3 = EXTENDED_TYPES.get(17)


#: storage -> the channels-last kernel that moves 16 bytes a thread, and its channels a thread
NHWC_VECTOR = {"half_t": ("pool_window_nhwc_v8", 8), "i8": ("pool_window_nhwc_v16", 16),
               "u8": ("pool_window_nhwc_v16", 16), "e4m3": ("pool_window_nhwc_v16", 16)}
#: the max pools that also take 8-bit integers
INT_MAX_POOLS = ("MaxPool", "MaxPoolNHWC")


def _elems(kind: str) -> list[str]:
    return list(ELEMS.values()) + (list(MAX_INT_ELEMS.values()) if kind in INT_MAX_POOLS else [])


def window_elem(kind: str, t: DeviceTensor, where: str) -> str:
    """The ELEM define for a windowed pool's input (max pools: float32/float16/uint8/int8; MaxPoolNHWC float8_e4m3fn:
    "e4m3", which kernel_for turns into u8 storage and POOL_E4M3)."""
    if kind == "MaxPoolNHWC" and E4M3 is not None and np.dtype(t.dtype) == E4M3:
        return "e4m3"
    ints = kind in INT_MAX_POOLS
    elem = MAX_INT_ELEMS.get(np.dtype(t.dtype)) if ints else None
    if elem is not None:
        return elem
    if np.dtype(t.dtype) not in ELEMS:
        raise DeviceError(f"cuda {kind} takes float32 or float16{' or 8-bit integer' if ints else ''} "
                          f"tensors, not {t.dtype}", where=where, hint="run this layer on --target cpu")
    return elem_of(t, where)


def kernel_for(name: str, kind: str, elem: str) -> KernelSource:
    if elem == "e4m3":
        return KernelSource(name, file="pool.cu", defines=defines(ELEM="u8", POOL_MODE=MODES[kind], POOL_E4M3=1))
    return KernelSource(name, file="pool.cu", defines=defines(ELEM=elem, POOL_MODE=MODES[kind]))


def compile_variants() -> list[KernelSource]:
    return [kernel_for(n, kind, e) for kind in ("MaxPool", "AveragePool", "LpPool") for e in ELEMS.values()
            for n in ("pool_window", "pool_global")] + \
        [kernel_for("pool_window", "MaxPool", e) for e in MAX_INT_ELEMS.values()] + \
        [kernel_for("pool_window_nhwc", kind, e) for kind in NHWC_KINDS for e in ELEMS.values()] + \
        [kernel_for(n, "MaxPoolNHWC", e) for e in MAX_INT_ELEMS.values() for n in ("pool_window_nhwc", "pool_window_nhwc_v16")] + \
        [kernel_for(n, "MaxPoolNHWC", "e4m3") for n in ("pool_window_nhwc_e4m3", "pool_window_nhwc_v16")]


def _window_kernels(layer: Any) -> list[KernelSource]:
    return [kernel_for("pool_window", layer.kind, e) for e in _elems(layer.kind)]


def _global_kernels(layer: Any) -> list[KernelSource]:
    return [kernel_for("pool_global", layer.kind, e) for e in ELEMS.values()]


def _nhwc_kernels(layer: Any) -> list[KernelSource]:
    eight_bit = [kernel_for(n, layer.kind, e) for e in MAX_INT_ELEMS.values()
                 for n in ("pool_window_nhwc", "pool_window_nhwc_v16")] if layer.kind in INT_MAX_POOLS else []
    if layer.kind == "MaxPoolNHWC" and E4M3 is not None:
        eight_bit += [kernel_for(n, layer.kind, "e4m3") for n in ("pool_window_nhwc_e4m3", "pool_window_nhwc_v16")]
    return [kernel_for("pool_window_nhwc", layer.kind, e) for e in ELEMS.values()] + eight_bit


def _supports_window(layer: Any) -> bool:
    return int(layer.attrs.get("storage_order", 0)) in (0, 1)


def enqueue_window(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor]) -> None:
    where = f"layer {layer.name!r}"
    X, Y = tensors[layer.inputs[0]], tensors[layer.outputs[0]]
    ind = tensors.get(layer.outputs[1]) if len(layer.outputs) > 1 and layer.outputs[1] else None
    elem = window_elem(layer.kind, X, where)
    args = [X, Y, ind if ind is not None else 0, X.shape[0] * X.shape[1],
            *_geometry_args(layer, X.shape[2:], Y.shape[2:], where), int(int(layer.attrs.get("storage_order", 0)) == 1)]
    launcher.launch(kernel_for("pool_window", layer.kind, elem), _grid_1d(Y.size), (BLOCK,), args)


def enqueue_window_nhwc(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor]) -> None:
    where = f"layer {layer.name!r}"
    X, Y = tensors[layer.inputs[0]], tensors[layer.outputs[0]]
    elem, C = window_elem(layer.kind, X, where), X.shape[3]
    geometry = _geometry_args(layer, X.shape[1:3], Y.shape[1:3], where)
    vector, width = NHWC_VECTOR.get(elem, ("", 0))
    # a Concat's channel total where Y (X: a skip connection the Concat reads too) is placed in its slice
    ldy, ldx = Y.rows_apart(C), X.rows_apart(C)
    aligned = all(ld % width == 0 and t.ptr % 16 == 0 for ld, t in ((ldy, Y), (ldx, X))) if vector else False
    if vector and C % width == 0 and aligned and max(X.size // C * ldx, Y.size // C * ldy) < 2**31:
        # `width` channels a thread, 16-byte loads and stores
        launcher.launch(kernel_for(vector, layer.kind, elem), _grid_1d(Y.size // width), (BLOCK,),
                        [X, Y, np.int32(X.shape[0]), np.int32(C), *geometry, ldy, ldx])
        return
    args = [X, Y, X.shape[0] * C, C, *geometry, ldy, ldx]
    scalar = "pool_window_nhwc_e4m3" if elem == "e4m3" else "pool_window_nhwc"
    launcher.launch(kernel_for(scalar, layer.kind, elem), _grid_1d(Y.size), (BLOCK,), args)


def _geometry_args(layer: Any, spatial, out, where: str) -> list[Any]:
    """pool.cu's POOL_GEOMETRY arguments for input / output spatial dims `spatial` / `out`."""
    kernel = [int(k) for k in layer.attrs["kernel_shape"]]
    geo = window_geometry(layer.attrs, spatial, kernel, ceil_mode=bool(layer.attrs.get("ceil_mode", 0)), where=where)
    return [*_to3(spatial, 1), *_to3(out, 1), *_to3(kernel, 1), *_to3(geo.strides, 1), *_to3(geo.pads_begin, 0),
            *_to3(geo.pads_end, 0), *_to3(geo.dilations, 1), int(layer.attrs.get("count_include_pad", 0)),
            np.float32(layer.attrs.get("p", 2))]


def enqueue_global(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor]) -> None:
    X, Y = tensors[layer.inputs[0]], tensors[layer.outputs[0]]
    elem = elem_of(X, f"layer {layer.name!r}")
    nc = X.shape[0] * X.shape[1]
    s = int(np.prod(X.shape[2:], dtype=np.int64))
    launcher.launch(kernel_for("pool_global", layer.kind, elem), (nc,), (BLOCK,),
                    [X, Y, nc, s, np.float32(layer.attrs.get("p", 2))])


for _kind in ("MaxPool", "AveragePool", "LpPool"):
    cuda_tactic(_kind, "cuda.pool.window", kernels=_window_kernels,
                supports=stored_as(*STORED, *(d.name for d in MAX_INT_ELEMS if _kind == "MaxPool"),
                                   then=_supports_window))(enqueue_window)
for _kind in ("GlobalMaxPool", "GlobalAveragePool", "GlobalLpPool"):
    cuda_tactic(_kind, "cuda.pool.global", kernels=_global_kernels, supports=stored_as(*STORED))(enqueue_global)
for _kind in NHWC_KINDS:
    cuda_tactic(_kind, "cuda.pool_nhwc.window", kernels=_nhwc_kernels, places=places_last_axis,
                reads_placed=reads_last_axis,
                supports=stored_as(*STORED, *(d.name for d in MAX_INT_ELEMS if _kind in INT_MAX_POOLS),
                                   *((E4M3.name,) if _kind == "MaxPoolNHWC" and E4M3 is not None else ())))(enqueue_window_nhwc)

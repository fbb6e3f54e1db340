"""ai.polykit Attention on tensor cores (flash_attention.cu): tactic `cuda.attention.flash`.

Runs float16/bfloat16 attention with Q, K, V of one head size D = Dv, a multiple of 32 up to 256
(key tiles of 64, of 32 above 128: shared memory under 99 KiB), any query and key lengths
(partial tiles masked), rank 3 or 4,
whose batch dims broadcast to [B, H], with an optional additive (Q's dtype) or bool mask
broadcastable to [B, H, S, Skv] that is contiguous or broadcast along the key axis. Reads and
writes through (batch, head, seq) strides, so inputs and outputs may also be laid out
[B, S, H, D] (the layer's `q_layout` / `k_layout` / `v_layout` / `out_layout` "bshd", set by
the fold_attention_layouts pass): the head transposes around attention disappear.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from polykit.kernels.cuda.base import DeviceTensor, KernelSource, cuda_tactic, defines

FILE = "flash_attention.cu"
ELEMS = {"float16": "half_t", "bfloat16": "bf16_t"}
HEAD_SIZES = tuple(range(32, 257, 32))
BQ = 64
LAYOUT_ATTRS = ("q_layout", "k_layout", "v_layout", "out_layout")


def logical_shape(shape: Sequence[int], layout: str) -> tuple[int, ...]:
    """[b, h, s, d] of a tensor stored as `layout` ("bhsd" or "bshd"; rank 3 means b = 1)."""
    shape = tuple(int(d) for d in shape)
    if len(shape) == 3:
        shape = (1,) + shape
    if layout == "bshd":
        b, s, h, d = shape
        return (b, h, s, d)
    return shape


def head_strides(shape: Sequence[int], layout: str) -> tuple[int, int, int]:
    """Element strides (batch, head, seq) of a contiguous tensor stored as `layout`; 0 where
    the dim is 1 (broadcast)."""
    b, h, s, d = logical_shape(shape, layout)
    if layout == "bshd":
        sb, sh, ss = s * h * d, d, h * d
    else:
        sb, sh, ss = h * s * d, s * d, d
    return (0 if b == 1 else sb, 0 if h == 1 else sh, ss)


def mask_strides(shape: Sequence[int]) -> tuple[int, int, int, int] | None:
    """Element strides (b, h, q, k) of a mask broadcast to rank 4 (0 on size-1 dims)."""
    if len(shape) > 4:
        return None
    shape = (1,) * (4 - len(shape)) + tuple(int(d) for d in shape)
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(0 if d == 1 else acc)
        acc *= d
    return tuple(strides[::-1])


def _layouts(layer: Any) -> list[str]:
    return [str(layer.attrs.get(a, "bhsd")) for a in LAYOUT_ATTRS]


def flash_geometry(layer: Any, elems: Mapping[str, str] = ELEMS,
                   heads: Sequence[int] = HEAD_SIZES) -> tuple[str, int] | None:
    """(storage dtype, head size) when a flash kernel taking the storage dtypes `elems` (numpy
    name -> kernel ELEM) and the head sizes `heads` can run the layer, else None."""
    dtypes, shapes = getattr(layer, "in_dtypes", ()), getattr(layer, "in_shapes", ())
    if len(shapes) < 3 or len(dtypes) < 3 or layer.domain != "ai.polykit":
        return None
    if len({dtypes[0], dtypes[1], dtypes[2]}) != 1 or dtypes[0] not in elems:
        return None
    layouts = _layouts(layer)
    if any(x not in ("bhsd", "bshd") for x in layouts) or any(len(s) not in (3, 4) for s in shapes[:3]):
        return None
    q, k, v = (logical_shape(s, lay) for s, lay in zip(shapes[:3], layouts))
    D = q[3]
    if D not in heads or k[3] != D or v[3] != D or k[2] != v[2]:
        return None
    for x in (k, v):
        if any(a != c and a != 1 for a, c in zip(x[:2], q[:2])) and any(a != c and c != 1 for a, c in zip(x[:2], q[:2])):
            return None
    if len(layer.inputs) > 3 and layer.inputs[3]:
        mshape = shapes[3]
        ms = mask_strides(mshape)
        if ms is None or ms[3] not in (0, 1) or dtypes[3] not in (dtypes[0], "bool"):
            return None
    return dtypes[0], D


def _supports(layer: Any) -> bool:
    return flash_geometry(layer) is not None


def block_kv(head: int) -> int:
    """Keys a shared-memory tile holds: 64, 32 for heads over 128."""
    return 64 if head <= 128 else 32


def kernel_for(elem: str, head: int) -> KernelSource:
    return KernelSource("flash_attention", file=FILE, defines=defines(ELEM=elem, HD=head, BKV=block_kv(head)))


def _kernels(layer: Any) -> list[KernelSource]:
    dtype, head = flash_geometry(layer)
    return [kernel_for(ELEMS[dtype], head)]


@dataclass(frozen=True)
class FlashLaunch:
    """What every flash kernel takes for one layer: grid, head size and the argument list
    (Q, K, V, O, mask, S, Skv, (batch, head, seq) strides of Q, K, V, O, mask strides, scale,
    mask kind, nan_probs_to_zero)."""

    grid: tuple[int, int, int]
    head: int
    args: tuple[Any, ...]


def flash_launch(layer: Any, tensors: Mapping[str, DeviceTensor]) -> FlashLaunch | None:
    """The layer's flash launch, None when its output is empty."""
    q, k, v = (tensors[n] for n in layer.inputs[:3])
    mask = tensors[layer.inputs[3]] if len(layer.inputs) > 3 and layer.inputs[3] else None
    y = tensors[layer.outputs[0]]
    lq, lk, lv, lo = _layouts(layer)
    B, H, S, D = logical_shape(q.shape, lq)
    kshape, oshape = logical_shape(k.shape, lk), logical_shape(y.shape, lo)
    B, H = max(B, kshape[0], oshape[0]), max(H, kshape[1], oshape[1])
    Skv = kshape[2]
    if y.size == 0:
        return None
    if mask is None:
        mptr, ms, kind = 0, (0, 0, 0, 0), 0
    else:
        mptr, ms = mask, mask_strides(mask.shape)
        kind = 2 if mask.dtype == np.bool_ else 1
    scale = float(layer.attrs.get("scale", 1.0 / math.sqrt(D)))
    args = (q, k, v, y, mptr, np.int32(S), np.int32(Skv), *head_strides(q.shape, lq), *head_strides(k.shape, lk),
            *head_strides(v.shape, lv), *head_strides(y.shape, lo), *ms, np.float32(scale), np.int32(kind),
            np.int32(int(layer.attrs.get("nan_probs_to_zero", 0))))
    return FlashLaunch((-(-S // BQ), H, B), D, args)


def enqueue_flash(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor]) -> None:
    run = flash_launch(layer, tensors)
    if run is None:
        return
    elem = ELEMS[np.dtype(tensors[layer.inputs[0]].dtype).name]
    launcher.launch(kernel_for(elem, run.head), run.grid, (128,), list(run.args), shared_mem=(BQ + 4 * block_kv(run.head)) * run.head * 2)


def compile_variants() -> list[KernelSource]:
    return [kernel_for(e, d) for e in ELEMS.values() for d in HEAD_SIZES]


cuda_tactic("Attention", "cuda.attention.flash", kernels=_kernels, supports=_supports, priority=20,
            params={"block_q": BQ, "block_kv": 64, "block_kv_over_128": 32, "warps": 4})(enqueue_flash)

"""ai.polykit Attention tactic (attention.cu).

float32/float16 with head sizes D, Dv <= 128 run `attention_tiled_*` (K/V tiles in shared
memory shared by 16 query rows, online softmax); float64 and wider heads run the simple
kernel (one block per query row, two-pass softmax). Both are exact up to rounding and
deterministic, and agree on rows whose softmax is undefined (NaN, or 0 with nan_probs_to_zero).
Grouped-query heads (`kv_groups` g) need no kernel of their own: the heads of Q, the mask and the
output are iterated as (H / g, g) and those of K and V as (H / g, 1), so each query head reads
key/value head h // g through the batch strides the kernels already take.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Mapping

import numpy as np

from polykit.compiler.ops.nn.fused import (LAYOUT_ATTRS, VIEW_ATTRS, OperandView, ViewError, dense_strides, kv_groups,
                                          operand_view)
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, Launcher, cuda_tactic, stored_as
from polykit.kernels.cuda.launch_geometry import broadcast_geometry

FILE = "attention.cu"
VARIANTS = ("f32", "f32_b8", "f16", "f16_b8", "f64", "f64_b8")
TILED = ("f32", "f32_b8", "f16", "f16_b8")
#: storage dtype (numpy name) -> kernel code
STORED = {"float32": "f32", "float16": "f16", "float64": "f64"}
MAXR = 8
#: tiled kernel: query rows per block, keys per shared-memory tile, largest D / Dv, block size
QT, KT, TILED_MAX_D, TILED_BLOCK = 16, 32, 128, 128


def _kernels(layer) -> list[KernelSource]:
    """The attention module, and the movement kernels that relay [B, S, H, D] tensors."""
    from polykit.kernels.cuda.movement import movement

    relay = movement.copy_kernels(None) if layer is not None and _has_views(layer) else []
    return [KernelSource(f"attention_{c}", FILE) for c in VARIANTS] + \
        [KernelSource(f"attention_tiled_{c}{h}", FILE) for c in TILED for h in ("", "_h64", "_h128")] + relay


def _has_views(layer) -> bool:
    attrs = layer.attrs
    return any(attrs.get(a) is not None for a in VIEW_ATTRS) or any(attrs.get(a, "bhsd") != "bhsd" for a in LAYOUT_ATTRS)


def _pad(v, fill=0):
    return list(v) + [fill] * (MAXR - len(v))


def enqueue_attention(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    where = f"layer {layer.name!r}"
    q, k, v = (tensors[n] for n in layer.inputs[:3])
    mask = tensors[layer.inputs[3]] if len(layer.inputs) > 3 and layer.inputs[3] else None
    y = tensors[layer.outputs[0]]
    code = STORED.get(q.dtype.name)
    if code is None or k.dtype != q.dtype or v.dtype != q.dtype:
        raise DeviceError(f"Attention on {q.dtype}/{k.dtype}/{v.dtype} has no CUDA kernel", where=where,
                          hint="use --target cpu")
    if mask is not None and mask.dtype == np.bool_:
        code += "_b8"
    elif mask is not None and mask.dtype != q.dtype:
        raise DeviceError(f"mask dtype {mask.dtype} is neither bool nor {q.dtype}", where=where)
    if y.size == 0:
        return
    S, D = q.shape[-2:]
    Skv, Dv = v.shape[-2:]
    rank = len(y.shape)
    mshape = (1,) * (rank - len(mask.shape)) + tuple(mask.shape) if mask is not None else (1,) * rank
    batches = [tuple(t.shape[:-2]) for t in (q, k, v)] + [mshape[:-2], tuple(y.shape[:-2])]
    nb, dims, strides, _ = broadcast_geometry(grouped_batches(batches, _groups(layer, where)), 1)
    if len(dims) > MAXR:
        raise DeviceError(f"{len(dims)} batch dims exceed {MAXR}", where=where, hint="use --target cpu")
    units = [S * D, Skv * D, Skv * Dv, mshape[-2] * mshape[-1]]
    st = [[s * u for s in strides[i]] for i, u in enumerate(units)]
    ms_s = mshape[-1] if mshape[-2] != 1 else 0
    ms_j = 1 if mshape[-1] != 1 else 0
    scale = float(layer.attrs.get("scale", 1.0 / math.sqrt(D)))
    wide = q.dtype == np.float64  # computes in double: double scale and shared memory
    args = [q, k, v, mask if mask is not None else 0, y, nb, len(dims), *_pad(dims, 1), *(x for s in st for x in _pad(s)),
            ms_s, ms_j, S, Skv, D, Dv, np.float64(scale) if wide else np.float32(scale),
            int(layer.attrs.get("nan_probs_to_zero", 0))]
    if not wide and D <= TILED_MAX_D and Dv <= TILED_MAX_D:
        head = f"_h{D}" if D == Dv and D in (64, 128) else ""  # head size compiled in
        launcher.launch(KernelSource(f"attention_tiled_{code}{head}", FILE), (min(nb * -(-S // QT), 1 << 20), 1, 1),
                        (TILED_BLOCK, 1, 1), args, shared_mem=4 * (QT * D + KT * (D + 1) + KT * Dv))
        return
    block = 128 if max(Skv, Dv) > 64 else 64
    launcher.launch(KernelSource(f"attention_{code}", FILE), (min(nb * S, 1 << 20), 1, 1), (block, 1, 1), args,
                    shared_mem=(8 if wide else 4) * (D + Skv))


def _groups(layer, where: str) -> int:
    try:
        return kv_groups(layer.attrs)
    except ViewError as exc:
        raise DeviceError(str(exc), where=where, hint="rebuild the plan") from None


def grouped_batches(batches: list[tuple[int, ...]], g: int) -> list[tuple[int, ...]]:
    """The batch dims of Q, K, V, mask and output with the head axis (the last) split as (H / g, g)
    for Q, the mask and the output and (H / g, 1) for K and V: a broadcast in which query head h
    meets key/value head h // g (unchanged for g = 1)."""
    if g == 1:
        return batches
    out = []
    for i, batch in enumerate(batches):
        h = batch[-1]
        split = (h, 1) if i in (1, 2) or h == 1 else (h // g, g)
        out.append(tuple(batch[:-1]) + split)
    return out


def _views(layer, tensors) -> list[tuple[int, OperandView]]:
    """(position, view) of each of Q, K, V (0-2) and the output (3) that is not its tensor as
    stored: a [B, S, H, D] layout (fold_attention_layouts) or a strided view of a packed tensor."""
    names = list(layer.inputs[:3]) + [layer.outputs[0]]
    out = []
    for i, name in enumerate(names):
        if name not in tensors:
            continue
        shape = tuple(int(d) for d in tensors[name].shape)
        view = operand_view(layer.attrs, i, shape)
        if view is not None and (view.offset, view.shape, view.strides) != (0, shape, dense_strides(shape)):
            out.append((i, view))
    return out


def _relayout_bytes(layer, tensors, sm_count: int) -> int:
    """Workspace: a contiguous [..., S, D] copy of every view (256-byte slots)."""
    names = list(layer.inputs[:3]) + [layer.outputs[0]]
    sizes = [int(np.prod(v.shape)) * np.dtype(tensors[names[i]].dtype).itemsize for i, v in _views(layer, tensors)]
    return sum(-(-b // 256) * 256 for b in sizes)


def enqueue_relaid(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    """enqueue_attention for layers with views (fp32/fp64, or what the flash kernels refuse): each
    view is gathered into a contiguous workspace copy through its offset and strides, the attention
    runs on those, and an output so stored is scattered back through its strides."""
    from polykit.kernels.cuda.movement.movement import contiguous_strides, launch_copy

    views = _views(layer, tensors)
    if not views:
        return enqueue_attention(layer, launcher, tensors)
    names = list(layer.inputs[:3]) + [layer.outputs[0]]
    local = dict(tensors)
    where = f"layer {layer.name!r}"
    relaid = list(names)  # each copy under a name of its own: Q, K and V may be views of one packed tensor
    for i, view in views:
        t = tensors[names[i]]
        tmp = DeviceTensor(launcher.workspace(int(np.prod(view.shape)) * t.dtype.itemsize), view.shape, t.dtype)
        if i < 3:
            launch_copy(launcher, t, tmp, view.shape, view.strides, contiguous_strides(view.shape),
                        src_base=view.offset, where=where)
        relaid[i] = f"{names[i]}#relaid{i}"
        local[relaid[i]] = tmp
    plain = replace(layer, inputs=tuple(relaid[:3]) + tuple(layer.inputs[3:]),
                    outputs=(relaid[3],) + tuple(layer.outputs[1:]),
                    attrs={k: v for k, v in layer.attrs.items() if k not in LAYOUT_ATTRS + VIEW_ATTRS})
    enqueue_attention(plain, launcher, local)
    for i, view in views:
        if i == 3:
            launch_copy(launcher, local[relaid[3]], tensors[names[3]], view.shape, contiguous_strides(view.shape),
                        view.strides, dst_base=view.offset, where=where)


cuda_tactic("Attention", "cuda.attention.simple", kernels=_kernels, workspace=_relayout_bytes,
            supports=stored_as(*STORED, then=lambda layer: layer.domain == "ai.polykit"))(enqueue_relaid)


def compile_variants() -> list[KernelSource]:
    return _kernels(None)

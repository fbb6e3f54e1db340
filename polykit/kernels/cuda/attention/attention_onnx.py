"""ONNX Attention (opset 23-25) on cuda: tactics `cuda.attention_onnx.generic` and `.fused`.

Both first write present_key / present_value ([B, Hkv, Spast + Skv, D], past then new; into
the outputs when the node has them, else into workspace) with the strided copy kernels.
`generic` (attention_onnx.cu) runs every variant: 3-D or 4-D, GQA, masks of every float type
or bool (shorter than Skv too), causal, windows, nonpad_kv_seqlen, softcap, the qk output of
every mode, softmax_precision, float32/float16/bfloat16/float64. `fused` hands the variants the
fused-attention kernels already run (4-D, as many key/value heads as query heads, float32 or
float16, D and Dv <= 128, an additive mask of Q's type or a bool mask covering every key, or
is_causal without a mask: a [Sq, Skv] keep-mask written to workspace) to attention.cu's tiled
kernel, and the builder times the two. On the fused path a row with a NaN score gives 0
where the generic kernel (and the reference) give NaN; fully masked rows give 0 on both.
The variants the flash kernels compute (GQA, 3-D, bf16, sm90, causal tile skipping) also have the
`cuda.attention_onnx.flash*` tactics of attention_onnx_flash.py, timed against these.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Mapping

import numpy as np

from polykit.compiler.ir import dtypes
from polykit.compiler.ops.models.attention_onnx import MASK, NONPAD, PAST_KEY, PAST_VALUE, attention_geometry
from polykit.errors import DeviceError
from polykit.kernels.cuda.attention import attention
from polykit.kernels.cuda.movement import movement
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, Launcher, cuda_tactic
from polykit.kernels.cuda.attention.flash_attention import mask_strides

FILE = "attention_onnx.cu"
#: storage dtype (numpy name) -> kernel code, for Q/K/V/Y and for the mask
CODES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64", "bool": "b8"}
TYPES = ("f32", "f16", "bf16", "f64")
MASKS = ("b8", "f16", "bf16", "f32", "f64")
#: half / bfloat16 rounding of the softmax stages (kernel argument `sm`) by softmax_precision
SOFTMAX_ROUNDING = {"float16": 1, "bfloat16": 2}
MAX_GRID = 1 << 20
FUSED_DTYPES = ("float32", "float16")


def _kernels(layer) -> list[KernelSource]:
    return [KernelSource(f"attention_onnx_{t}_{m}", FILE) for t in TYPES for m in MASKS] + \
        movement.copy_kernels(None)


def _fused_kernels(layer) -> list[KernelSource]:
    return [KernelSource("attention_onnx_causal_mask", FILE), *attention.compile_variants(), *movement.copy_kernels(None)]


def _opt(layer, tensors, i) -> DeviceTensor | None:
    return tensors[layer.inputs[i]] if len(layer.inputs) > i and layer.inputs[i] else None


def _geometry(layer, tensors):
    where = f"layer {layer.name!r}"

    def fail(what, hint=None):
        return DeviceError(what, where=where, hint=hint)

    shapes = [t.shape if t is not None else None for t in (_opt(layer, tensors, i) for i in range(7))]
    return attention_geometry(shapes, layer.attrs, fail)


def _head_strides(shape, rank: int, heads: int) -> tuple[int, int, int]:
    """(batch, head, seq) element strides of a contiguous [B, H, S, d] or [B, S, H*d] tensor."""
    if rank == 4:
        _, h, s, d = shape
        return (h * s * d, s * d, d)
    _, s, hidden = shape
    return (s * hidden, hidden // heads, hidden)


def write_present(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor], geo, i_new: int,
                  i_past: int, out: int, head: int) -> DeviceTensor:
    """present = concat(past, new) along the sequence, as [B, Hkv, Skv, head] (the node's output
    `out` when it has one, else workspace)."""
    new, past = tensors[layer.inputs[i_new]], _opt(layer, tensors, i_past)
    shape = (geo.batch, geo.kv_heads, geo.kv_len, head)
    name = layer.outputs[out] if len(layer.outputs) > out and layer.outputs[out] else ""
    dst = tensors[name] if name else DeviceTensor(launcher.workspace(int(np.prod(shape)) * new.dtype.itemsize),
                                                  shape, new.dtype)
    ds = movement.contiguous_strides(shape)
    where = f"layer {layer.name!r}"
    if past is not None:
        movement.launch_copy(launcher, past, dst, past.shape, movement.contiguous_strides(past.shape), ds, where=where)
    nb, nh, ns = _head_strides(new.shape, geo.rank, geo.kv_heads)
    movement.launch_copy(launcher, new, dst, (geo.batch, geo.kv_heads, geo.new_kv_len, head), (nb, nh, ns, 1), ds,
                         dst_base=geo.past_len * head, where=where)
    return dst


def _scale(layer, geo) -> float:
    scale = layer.attrs.get("scale")
    return 1.0 / math.sqrt(geo.head_size) if scale is None else float(scale)


def enqueue_generic(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    where = f"layer {layer.name!r}"
    q = tensors[layer.inputs[0]]
    geo = _geometry(layer, tensors)
    code = CODES.get(q.dtype.name)
    mask, nonpad = _opt(layer, tensors, MASK), _opt(layer, tensors, NONPAD)
    if code not in TYPES or any(tensors[n].dtype != q.dtype for n in layer.inputs[1:3]):
        raise DeviceError(f"Attention on {[tensors[n].dtype.name for n in layer.inputs[:3]]} has no CUDA kernel",
                          where=where, hint="use float32/float16/bfloat16/float64 Q, K, V of one type, or --target cpu")
    mcode = CODES.get(mask.dtype.name) if mask is not None else "b8"
    if mcode not in MASKS or (mask is not None and len(mask.shape) > 4):
        raise DeviceError(f"attn_mask {mask.dtype}{mask.shape} has no CUDA kernel", where=where, hint="use --target cpu")
    k = write_present(layer, launcher, tensors, geo, 1, PAST_KEY, 1, geo.head_size)
    v = write_present(layer, launcher, tensors, geo, 2, PAST_VALUE, 2, geo.v_head_size)
    y = tensors[layer.outputs[0]]
    qk = tensors[layer.outputs[3]] if len(layer.outputs) > 3 and layer.outputs[3] else None
    rows = geo.batch * geo.q_heads * geo.q_len
    if rows == 0 or (y.size == 0 and qk is None):
        return
    ms = mask_strides(mask.shape) if mask is not None else (0, 0, 0, 0)
    wide = q.dtype == np.float64
    real = np.float64 if wide else np.float32
    root = np.sqrt(_scale(layer, geo))
    root = real(np.asarray(root).astype(q.dtype)) if q.dtype.itemsize < 4 else real(root)
    precision = layer.attrs.get("softmax_precision")
    sm = 0
    if precision is not None and q.dtype.itemsize < 4:
        sm = SOFTMAX_ROUNDING.get(np.dtype(dtypes.to_numpy(int(precision))).name, 0)
    elif q.dtype.itemsize < 4:
        sm = SOFTMAX_ROUNDING[q.dtype.name]
    args = [q, k, v, mask if mask is not None else 0, nonpad if nonpad is not None else 0, y, qk if qk is not None else 0,
            geo.batch, geo.q_heads, geo.group, geo.q_len, geo.kv_len, geo.head_size, geo.v_head_size,
            *_head_strides(q.shape, geo.rank, geo.q_heads), *_head_strides(y.shape, geo.rank, geo.q_heads),
            *ms, mask.shape[-1] if mask is not None else geo.kv_len, geo.past_len,
            int(layer.attrs.get("is_causal", 0)), int(layer.attrs.get("left_window_size", -1)),
            int(layer.attrs.get("right_window_size", -1)), int(layer.attrs.get("qk_matmul_output_mode", 0)),
            root, real(layer.attrs.get("softcap", 0.0)), sm]
    block = 128 if max(geo.kv_len, geo.v_head_size) > 64 else 64
    launcher.launch(KernelSource(f"attention_onnx_{code}_{mcode}", FILE), (min(rows, MAX_GRID), 1, 1), (block, 1, 1),
                    args, shared_mem=(8 if wide else 4) * (geo.head_size + geo.kv_len))


def _fits_fused(layer: Any) -> bool:
    """Whether attention.cu's tiled kernel computes this layer (stamped shapes and dtypes needed)."""
    dtypes, shapes, attrs = layer.in_dtypes, layer.in_shapes, layer.attrs
    if layer.domain != "" or len(shapes) < 3 or any(len(s) != 4 for s in shapes[:3]):
        return False
    if len(set(dtypes[:3])) != 1 or dtypes[0] not in FUSED_DTYPES or shapes[0][1] != shapes[1][1]:
        return False
    if max(shapes[0][3], shapes[2][3]) > attention.TILED_MAX_D or float(attrs.get("softcap", 0.0)) > 0:
        return False
    if int(attrs.get("left_window_size", -1)) >= 0 or int(attrs.get("right_window_size", -1)) >= 0:
        return False
    has = [len(layer.inputs) > i and bool(layer.inputs[i]) for i in range(7)]
    if has[NONPAD] or (len(layer.outputs) > 3 and layer.outputs[3]):
        return False
    kv_len = shapes[1][2] + (shapes[PAST_KEY][2] if has[PAST_KEY] else 0)
    if has[MASK]:
        if int(attrs.get("is_causal", 0)) or dtypes[MASK] not in ("bool", dtypes[0]) or len(shapes[MASK]) > 4:
            return False
        return shapes[MASK][-1] == kv_len
    return True


def enqueue_fused(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    geo = _geometry(layer, tensors)
    local = dict(tensors)
    k = write_present(layer, launcher, tensors, geo, 1, PAST_KEY, 1, geo.head_size)
    v = write_present(layer, launcher, tensors, geo, 2, PAST_VALUE, 2, geo.v_head_size)
    local["__present_key"], local["__present_value"] = k, v
    mask = layer.inputs[MASK] if len(layer.inputs) > MASK and layer.inputs[MASK] else ""
    if int(layer.attrs.get("is_causal", 0)):
        keep = DeviceTensor(launcher.workspace(geo.q_len * geo.kv_len), (geo.q_len, geo.kv_len), np.dtype(np.bool_))
        n = geo.q_len * geo.kv_len
        launcher.launch(KernelSource("attention_onnx_causal_mask", FILE), (max(1, min(-(-n // 256), MAX_GRID)), 1, 1),
                        (256, 1, 1), [keep, geo.q_len, geo.kv_len, geo.past_len])
        local["__causal"], mask = keep, "__causal"
    fused = replace(layer, kind="Attention", domain="ai.polykit", outputs=(layer.outputs[0],),
                    inputs=(layer.inputs[0], "__present_key", "__present_value") + ((mask,) if mask else ()),
                    attrs={"scale": _scale(layer, geo), "nan_probs_to_zero": 1})
    attention.enqueue_attention(fused, launcher, local)


def _workspace(layer, tensors, sm_count: int) -> int:
    """present K/V not among the outputs, and the causal keep-mask (256-byte slots)."""
    geo = _geometry(layer, tensors)
    need = []
    for out, i, head in ((1, 1, geo.head_size), (2, 2, geo.v_head_size)):
        if not (len(layer.outputs) > out and layer.outputs[out]):
            need.append(geo.batch * geo.kv_heads * geo.kv_len * head * np.dtype(tensors[layer.inputs[i]].dtype).itemsize)
    need.append(geo.q_len * geo.kv_len)
    return sum(-(-b // 256) * 256 for b in need)


cuda_tactic("Attention", "cuda.attention_onnx.generic", kernels=_kernels, workspace=_workspace, conservative=True,
            supports=lambda layer: layer.domain == "")(enqueue_generic)
cuda_tactic("Attention", "cuda.attention_onnx.fused", kernels=_fused_kernels, workspace=_workspace, priority=10,
            supports=_fits_fused)(enqueue_fused)


def compile_variants() -> list[KernelSource]:
    return _kernels(None) + [KernelSource("attention_onnx_causal_mask", FILE)]

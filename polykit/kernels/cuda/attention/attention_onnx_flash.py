"""ONNX Attention (opset 23-25) on the flash kernels: tactics `cuda.attention_onnx.flash`, `_q128`,
`_kv128`, `_sm90`, `_f32`, `_tf32`, one for each flash tactic of ai.polykit Attention.

A layer whose variant the flash kernels compute becomes, at build and at run time alike, its
*flash layer*: the ai.polykit Attention over the same buffers (`route`), which the flash tactic it
wraps then runs (same kernels, params, archs and priority: the builder times these against
`cuda.attention_onnx.generic` / `.fused`, and a level-0 build takes the flash route where it fits).

    Q, Y       rank 4 [B, H, S, D] as stored; rank 3 [B, S, H*D] as [B, S, H, D] read in layout
               "bshd" (q_num_heads / kv_num_heads split the hidden size): no copy.
    K, V       without past_key / past_value the inputs themselves (rank 3 as Q); with them the
               present tensors [B, Hkv, Spast + Skv, D], written first as `generic` writes them
               (the node's present outputs, else workspace). Present outputs without a past are
               written too, and flash reads the inputs.
    heads      Hq a multiple of Hkv: kv_groups Hq / Hkv (grouped- and multi-query attention).
    mask       a bool keep-mask or an additive mask of Q's dtype, rank <= 4, broadcastable to
               [B, Hq, Sq, Skv] with a last axis of exactly Skv (past included; a shorter one, which
               ONNX pads with masked keys, runs on `generic`).
    is_causal  without a mask: a causal *band* in workspace, Sq + Skv - 1 bool flags, band[j] =
               j <= Sq - 1 + past, read as the mask through query stride -1 (flash_attention.StridedMask:
               mask[q][k] = band[Sq - 1 - q + k] keeps k <= q + past), O(Sq + Skv) bytes where `fused`'s
               keep-mask takes Sq * Skv. With a mask (bool, float16, bfloat16 or float32): the mask
               merged with it in workspace, [b | 1, h | 1, Sq, Skv] (its own batch and head dims), keys
               past the diagonal false / -inf (attention_onnx_causal_merge). Either way the causal hint
               mask_causal = past, so the kernels skip the key tiles past each block's diagonal
               (flash_common.cuh, unchanged).
    scale      the node's (default 1/sqrt(D)), applied to the float scores.
Left to `generic` / `fused` (supports() says no, from the stamped shapes and dtypes): softcap,
windows, the qk output, nonpad_kv_seqlen, a short mask, D != Dv, Q, K, V or
past of different dtypes, and whatever the wrapped flash tactic refuses (float64; head sizes it has
no kernel for: multiples of 32 up to 256 on mma.sync, 64 / 128 on sm90 and fp32; fp32 only on the
f32 / tf32 kernels of a layer of that precision).

Semantics: as `fused`, a row whose every key is masked gives 0 (as ONNX says), and so does a row
with a NaN score (ONNX: NaN); the softmax runs in float whatever softmax_precision says (16-bit
types: the spec rounds each stage to T, which the generic kernel reproduces and this route does not;
the tests measure its error against the float64 reference).

Why tactics and not a pass lowering the node to ai.polykit Attention: the lowering would need graph
ops for the present concat and the causal mask (an Sq x Skv constant in the plan at static shapes,
a Range chain at dynamic ones), would change what the cpu target runs, and would lose the generic
and fused kernels as timed alternatives for the same layer. Here the node stays one layer with its
ONNX semantics, and the flash families need no change beyond StridedMask.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from polykit.compiler.ops.models.attention_onnx import (MASK, NONPAD, PAST_KEY, PAST_VALUE, AttentionGeometry,
                                                        attention_geometry)
from polykit.compiler.ops.nn.fused import KV_GROUPS, LAYOUT_ATTRS, MASK_CAUSAL
from polykit.compiler.plan.records import LayerDesc
from polykit.errors import DeviceError
from polykit.kernels.cuda.attention import flash_attention, flash_attention_f32, flash_attention_sm90
from polykit.kernels.cuda.attention.attention_onnx import FILE, MAX_GRID, write_present
from polykit.kernels.cuda.attention.flash_attention import StridedMask, mask_strides
from polykit.kernels.cuda.base import DECLARED, CudaTactic, DeviceTensor, KernelSource, Launcher, cuda_tactic
from polykit.kernels.cuda.movement import movement

#: the flash tactics of ai.polykit Attention this route wraps (their modules declare them on import)
FAMILIES = (flash_attention, flash_attention_sm90, flash_attention_f32)
#: the flash tactic's name -> this route's
PREFIX, ROUTE_PREFIX = "cuda.attention.flash", "cuda.attention_onnx.flash"
CAUSAL_KERNEL = KernelSource("attention_onnx_causal_mask", FILE)
#: mask dtype -> the bits of its "masked" value (false / -inf), for attention_onnx_causal_merge_<bytes>
MERGE_FILL = {"bool": 0, "float16": 0xFC00, "bfloat16": 0xFF80, "float32": 0xFF800000}
#: the flash layer's operand names (inputs, then the output), bound to the node's buffers at enqueue
SLOTS = ("q", "k", "v", "mask", "y")


@dataclass(frozen=True)
class FlashRoute:
    """An ONNX Attention as the ai.polykit Attention `layer` the flash kernels run (inputs q, k, v
    [, mask], output y: SLOTS), over stored shapes `shapes` (one per SLOT, () for no mask)."""

    layer: LayerDesc
    shapes: tuple[tuple[int, ...], ...]
    geo: AttentionGeometry
    #: K and V are read from the present tensors (a past is given)
    present: bool
    #: how is_causal reaches the kernels: "band" (no mask: the causal band), "merged" (the mask with the
    #: keys past the diagonal masked, in workspace), "" (not causal)
    causal: str


def _has(layer: Any, i: int) -> bool:
    return len(layer.inputs) > i and bool(layer.inputs[i])


def _static(shape: Any) -> bool:
    return shape is not None and all(type(d) is int for d in shape)


def _broadcasts(mask: Sequence[int], full: Sequence[int]) -> bool:
    return len(mask) <= len(full) and all(m in (1, f) for m, f in zip(reversed(mask), reversed(full)))


def route(layer: Any, shapes: Sequence[Any], dtypes: Sequence[str], out_dtype: str) -> FlashRoute | None:
    """The flash layer of ONNX Attention `layer` for input shapes and dtypes (numpy names; one per
    input position, None / "" for an absent one) and Y's dtype, or None when the variant is one the
    flash kernels do not compute (the wrapped tactic may still refuse the flash layer)."""
    attrs = layer.attrs
    if layer.domain != "" or len(layer.inputs) < 3 or (len(layer.outputs) > 3 and layer.outputs[3]):
        return None
    if float(attrs.get("softcap", 0.0)) > 0 or _has(layer, NONPAD):
        return None
    if int(attrs.get("left_window_size", -1)) >= 0 or int(attrs.get("right_window_size", -1)) >= 0:
        return None
    shapes = [tuple(shapes[i]) if i < len(shapes) and _has(layer, i) and shapes[i] is not None else None
              for i in range(7)]
    if not all(_static(s) for i, s in enumerate(shapes) if _has(layer, i)):
        return None
    try:
        geo = attention_geometry(shapes, attrs, lambda what, hint=None: ValueError(what))
    except ValueError:
        return None
    dtype = dtypes[0]
    if any(dtypes[i] != dtype for i in (1, 2)) or \
            any(_has(layer, i) and dtypes[i] != dtype for i in (PAST_KEY, PAST_VALUE)):
        return None
    if _has(layer, PAST_KEY) != _has(layer, PAST_VALUE) or geo.head_size != geo.v_head_size:
        return None
    causal = "band" if int(attrs.get("is_causal", 0)) else ""
    mask_shape, mask_dtype = (), ""
    if _has(layer, MASK):
        mask_shape, mask_dtype = shapes[MASK], dtypes[MASK]
        full = (geo.batch, geo.q_heads, geo.q_len, geo.kv_len)
        if mask_dtype not in ("bool", dtype) or not mask_shape or mask_shape[-1] != geo.kv_len \
                or not _broadcasts(mask_shape, full) or (causal and mask_dtype not in MERGE_FILL):
            return None
        if causal:
            causal, mask_shape = "merged", merged_shape(mask_shape, geo)
    elif causal:
        mask_shape, mask_dtype = (geo.q_len, geo.kv_len), "bool"
    B, D = geo.batch, geo.head_size
    present = _has(layer, PAST_KEY)
    if geo.rank == 4:
        q, y, kv, layout = (B, geo.q_heads, geo.q_len, D), (B, geo.q_heads, geo.q_len, D), \
            (B, geo.kv_heads, geo.new_kv_len, D), "bhsd"
    else:
        q, y, kv, layout = (B, geo.q_len, geo.q_heads, D), (B, geo.q_len, geo.q_heads, D), \
            (B, geo.new_kv_len, geo.kv_heads, D), "bshd"
    kv_layout = layout
    if present:
        kv, kv_layout = (B, geo.kv_heads, geo.kv_len, D), "bhsd"
    scale = attrs.get("scale")
    flash_attrs: dict[str, Any] = {"scale": 1.0 / math.sqrt(D) if scale is None else float(scale), "nan_probs_to_zero": 1,
                                   **dict(zip(LAYOUT_ATTRS, (layout, kv_layout, kv_layout, layout)))}
    if geo.group > 1:
        flash_attrs[KV_GROUPS] = geo.group
    if causal:
        flash_attrs[MASK_CAUSAL] = geo.past_len
    masked = bool(mask_shape)
    stored = (q, kv, kv, mask_shape, y)
    flash = LayerDesc(layer.name, "Attention", SLOTS[:4] if masked else SLOTS[:3], SLOTS[4:], flash_attrs,
                      domain="ai.polykit", precision=getattr(layer, "precision", "fp32"),
                      in_dtypes=(dtype, dtype, dtype) + ((mask_dtype,) if masked else ()), out_dtypes=(out_dtype,),
                      in_shapes=stored[:4] if masked else stored[:3], out_shapes=(y,))
    return FlashRoute(flash, stored, geo, present, causal)


def merged_shape(mask: Sequence[int], geo: AttentionGeometry) -> tuple[int, int, int, int]:
    """The merged causal mask's shape: the mask's batch and head dims (1 where it broadcasts), Sq, Skv."""
    b, h = ((1, 1) + tuple(mask))[-4:-2]
    return (b, h, geo.q_len, geo.kv_len)


def stamped_route(layer: Any) -> FlashRoute | None:
    """`route` of a layer with stamped shapes and dtypes (None without them)."""
    shapes, dtypes = getattr(layer, "in_shapes", ()), getattr(layer, "in_dtypes", ())
    if len(shapes) < 3 or len(dtypes) < 3:
        return None
    outs = getattr(layer, "out_dtypes", ())
    dtypes = tuple(dtypes) + ("",) * (7 - len(dtypes))
    return route(layer, shapes, dtypes, outs[0] if outs else dtypes[0])


def _bound_route(layer: Any, tensors: Mapping[str, DeviceTensor]) -> FlashRoute:
    """`route` at the bound shapes; a DeviceError when they leave the flash kernels' variants."""
    ts = [tensors[layer.inputs[i]] if _has(layer, i) else None for i in range(7)]
    found = route(layer, [t.shape if t is not None else None for t in ts],
                  [np.dtype(t.dtype).name if t is not None else "" for t in ts],
                  np.dtype(tensors[layer.outputs[0]].dtype).name)
    if found is None:
        raise DeviceError("the layer's shapes or dtypes at run time are not a variant the flash kernels compute",
                          where=f"layer {layer.name!r}", hint="rebuild the plan (its tactic was chosen for other shapes)")
    return found


def _as(t: DeviceTensor, shape: Sequence[int]) -> DeviceTensor:
    """Contiguous `t` as `shape` (same elements)."""
    return DeviceTensor(t.ptr, tuple(shape), t.dtype)


def _writes_present(layer: Any) -> bool:
    return any(len(layer.outputs) > i and bool(layer.outputs[i]) for i in (1, 2))


def _band(launcher: Launcher, geo: AttentionGeometry) -> StridedMask:
    """The causal band in workspace (attention_onnx_causal_mask over one row of Sq + Skv - 1 keys with
    offset Sq - 1 + past) as the [Sq, Skv] keep-mask k <= q + past."""
    n = geo.q_len + geo.kv_len - 1
    ptr = launcher.workspace(max(n, 1))
    if n > 0:
        launcher.launch(CAUSAL_KERNEL, (max(1, min(-(-n // 256), MAX_GRID)), 1, 1), (256, 1, 1),
                        [DeviceTensor(ptr, (n,), np.dtype(np.bool_)), 1, n, geo.q_len - 1 + geo.past_len])
    return StridedMask(ptr + max(geo.q_len - 1, 0), (geo.q_len, geo.kv_len), np.dtype(np.bool_),
                       strides5=(0, 0, 0, -1, 1))


def bind(layer: Any, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> tuple[FlashRoute, dict]:
    """Write what the flash layer reads that the node does not hold (present K / V, the causal band or
    merged mask) and return the route with its operands by SLOT name."""
    found = _bound_route(layer, tensors)
    geo = found.geo
    local = {"q": _as(tensors[layer.inputs[0]], found.shapes[0]), "y": _as(tensors[layer.outputs[0]], found.shapes[4])}
    if found.present or _writes_present(layer):
        k = write_present(layer, launcher, tensors, geo, 1, PAST_KEY, 1, geo.head_size)
        v = write_present(layer, launcher, tensors, geo, 2, PAST_VALUE, 2, geo.v_head_size)
    if found.present:
        local["k"], local["v"] = k, v
    else:
        local["k"], local["v"] = (_as(tensors[layer.inputs[i]], found.shapes[i]) for i in (1, 2))
    if found.causal == "band":
        local["mask"] = _band(launcher, geo)
    elif found.causal == "merged":
        local["mask"] = _merged(launcher, tensors[layer.inputs[MASK]], found.shapes[3], geo)
    elif _has(layer, MASK):
        local["mask"] = tensors[layer.inputs[MASK]]
    return found, local


def merge_kernel(dtype: str) -> KernelSource:
    return KernelSource(f"attention_onnx_causal_merge_{np.dtype(dtype).itemsize}", FILE)


def _merged(launcher: Launcher, mask: DeviceTensor, shape: tuple[int, ...], geo: AttentionGeometry) -> DeviceTensor:
    """is_causal and-ed into the mask: a contiguous `shape` ([b | 1, h | 1, Sq, Skv]) mask in workspace
    whose keys j > i + past are false / -inf (attention_onnx_causal_merge)."""
    dtype = np.dtype(mask.dtype)
    n = int(np.prod(shape, dtype=np.int64))
    out = DeviceTensor(launcher.workspace(max(n * dtype.itemsize, 1)), shape, dtype)
    if n > 0:
        launcher.launch(merge_kernel(dtype.name), (max(1, min(-(-n // 256), MAX_GRID)), 1, 1), (256, 1, 1),
                        [mask, out, *shape, *mask_strides(mask.shape), geo.past_len, MERGE_FILL[dtype.name]])
    return out


def _workspace(layer: Any, tensors: Mapping[str, Any], sm_count: int) -> int:
    """The present K and V a past needs when the node has no present outputs, and the causal band or
    merged mask (256-byte slots)."""
    found = _bound_route(layer, tensors)
    geo, need = found.geo, []
    if found.present:
        for i in (1, 2):  # K and V; their present outputs are 1 and 2
            if not (len(layer.outputs) > i and layer.outputs[i]):
                itemsize = np.dtype(tensors[layer.inputs[i]].dtype).itemsize
                need.append(geo.batch * geo.kv_heads * geo.kv_len * geo.head_size * itemsize)
    if found.causal == "band":
        need.append(max(geo.q_len + geo.kv_len - 1, 1))
    elif found.causal == "merged":
        need.append(max(int(np.prod(found.shapes[3])) * np.dtype(found.layer.in_dtypes[3]).itemsize, 1))
    return sum(-(-b // 256) * 256 for b in need)


def _wrap(base: CudaTactic) -> None:
    """Declare this route's tactic over flash tactic `base`."""

    def supports(layer: Any) -> bool:
        found = stamped_route(layer)
        return found is not None and base.supports(found.layer)

    def kernels(layer: Any) -> list[KernelSource]:
        found = stamped_route(layer)
        extra = list(movement.copy_kernels(None)) if found.present or _writes_present(layer) else []
        if found.causal:
            extra.append(CAUSAL_KERNEL if found.causal == "band" else merge_kernel(found.layer.in_dtypes[3]))
        return base.kernels(found.layer) + extra

    def enqueue(layer: Any, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
        found, local = bind(layer, launcher, tensors)
        base.enqueue(found.layer, launcher, local)

    cuda_tactic("Attention", ROUTE_PREFIX + base.name[len(PREFIX):], kernels=kernels, supports=supports,
                priority=base.priority, params=base.params, archs=base.archs, workspace=_workspace,
                domain="")(enqueue)


def wrapped() -> list[CudaTactic]:
    """The flash tactics of ai.polykit Attention, in declaration order."""
    return [t for t in DECLARED if t.kind == "Attention" and t.name.startswith(PREFIX)]


for _base in wrapped():
    _wrap(_base)


def compile_variants() -> list[KernelSource]:
    """Its causal merge kernels (the flash, copy and band kernels are their families')."""
    return [merge_kernel(d) for d in ("bool", "float16", "float32")]

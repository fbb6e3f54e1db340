"""ai.polykit Attention on tensor cores (flash_attention.cu): tactics `cuda.attention.flash`, `_q128`, `_kv128`.

Runs float16/bfloat16 attention with Q, K, V of one head size D = Dv, a multiple of 32 up to 256
(key tiles of 64, of 32 above 128: shared memory under 99 KiB), any query and key lengths
(partial tiles masked), rank 3 or 4,
whose batch dims broadcast to [B, H], with an optional additive (Q's dtype) or bool mask
broadcastable to [B, H, S, Skv] that is contiguous or broadcast along the key axis. Reads and
writes through (batch, head, seq) strides and a base offset (kernel arguments: one compiled kernel
serves every view), so inputs and outputs may also be laid out [B, S, H, D] (the layer's
`q_layout` / `k_layout` / `v_layout` / `out_layout` "bshd") and Q, K, V may be strided views of
one packed projection (`q_view` / `k_view` / `v_view`), both set by the fold_attention_layouts
pass: the head transposes and q, k, v copies around attention disappear. A view whose offset or
strides are not whole 16 bytes (the cp.async row loads) is refused (cuda.attention.simple runs it).
Grouped- and multi-query heads (`kv_groups` g: K and V hold H / g heads) are a kernel argument:
query head h reads key/value head h / g, so one compiled kernel serves every g.
Rank-5 attention [B1, B2, H, S, D] (recognize_attention's windowed form: a mask [1, W, H, S, Skv]
broadcast over the batch, Q, K, V views of [B*W, S, 3, H, D]) runs on a grid z of B1 * B2 whose
outer index has strides of its own (`HeadView.outer`, the kernel's last arguments).

Block shapes (SHAPES, one tactic each, the same kernel source through the ROWS and BKV defines):
`cuda.attention.flash` (4 warps of one 16-row m-tile: 64 query rows a block, key tiles of 64 / 32);
`cuda.attention.flash_q128` (two m-tiles a warp: 128 rows a block, so each K and V fragment read from
shared memory feeds two MMAs, half the ldmatrix traffic a FLOP) and `cuda.attention.flash_kv128` (key
tiles of 128: half the barriers, cp.async waits and softmax rescales a key), both for head sizes 32
and 64 only (registers) and one priority below cuda.attention.flash: the builder times them against
it, a plan built without timing keeps it. Their speed is predicted, not yet measured
(docs/CUDA_KERNELS.md, Attention).

The same three tactics run ai.polykit AttentionQuantize (ops/quant/attention_quantize.py: an FP8 model's
attention writing the e4m3 input of its output projection) with flash_attention.cu's FLASH_Q8 output stage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.ops.nn.fused import MASK_CAUSAL, ViewError, kv_groups, operand_view
from polykit.compiler.ops.quant.attention_quantize import KIND as QUANTIZED, Y_SCALE, Y_ZERO
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import ANY, DeviceTensor, KernelSource, cuda_tactic, defines

FILE = "flash_attention.cu"
ELEMS = {"float16": "half_t", "bfloat16": "bf16_t"}
HEAD_SIZES = tuple(range(32, 257, 32))
BQ = 64
#: flash_launch's trailing arguments for rank-5 attention: B2, outer strides of Q, K, V, O, mask
OUTER_ARGS = 6


@dataclass(frozen=True)
class HeadView:
    """How a flash kernel addresses one of Q, K, V (i 0-2) or O (3): element [b][h][s][d] at
    `offset + b sb + h sh + s ss + d` of the stored tensor (strides 0 on size-1 dims)."""

    offset: int
    shape: tuple[int, int, int, int]
    strides: tuple[int, int, int]
    #: (extent, element stride) of an outer batch dim above b (rank-5 views), (1, 0) when none
    outer: tuple[int, int] = (1, 0)

    def aligned(self, elems: int) -> bool:
        """Every row starts on a multiple of `elems` elements (16-byte vector loads)."""
        return self.offset % elems == 0 and all(s % elems == 0 for s in self.strides + self.outer[1:])


def head_view(attrs: Mapping[str, Any], i: int, stored_shape: Sequence[int]) -> HeadView | None:
    """Input i (3: the output) as a HeadView: its q_view / k_view / v_view, else its layout
    (ops/nn/fused.operand_view); None when it is no rank 3, 4 or 5 view of a static tensor."""
    try:
        view = operand_view(attrs, i, tuple(int(d) for d in stored_shape))
    except (ViewError, TypeError, ValueError):
        return None
    if view is None or len(view.shape) not in (3, 4, 5) or (view.shape[-1] > 1 and view.strides[-1] != 1):
        return None
    shape, strides = view.shape, view.strides
    if len(shape) == 3:
        shape, strides = (1,) + shape, (0,) + strides
    outer = (1, 0)
    if len(shape) == 5:
        outer = (shape[0], strides[0] if shape[0] > 1 else 0)
        shape, strides = shape[1:], strides[1:]
    b, h, s, d = shape
    return HeadView(view.offset, (b, h, s, d), tuple(0 if n == 1 else st for n, st in zip(shape[:3], strides[:3])),
                    outer)


def mask_strides(shape: Sequence[int]) -> tuple[int, int, int, int] | None:
    """Element strides (b, h, q, k) of a mask broadcast to rank 4 (0 on size-1 dims)."""
    strides = mask_strides5(shape)
    return None if strides is None or len(shape) > 4 else strides[1:]


def mask_strides5(shape: Sequence[int]) -> tuple[int, int, int, int, int] | None:
    """Element strides (outer, b, h, q, k) of a mask broadcast to rank 5 (0 on size-1 dims)."""
    if len(shape) > 5:
        return None
    shape = (1,) * (5 - len(shape)) + tuple(int(d) for d in shape)
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(0 if d == 1 else acc)
        acc *= d
    return tuple(strides[::-1])


@dataclass(frozen=True)
class StridedMask(DeviceTensor):
    """A mask the kernels read through explicit element strides (outer, b, h, q, k) instead of
    those of its shape (mask_strides5), which may be negative: `ptr` is element [0][0][0][0][0].
    The ONNX Attention route's causal band (attention_onnx_flash.py) is one: Sq + Skv - 1 flags read
    with query stride -1, so mask[q][k] = band[Sq - 1 - q + k] depends on k - q only."""

    strides5: tuple[int, int, int, int, int] = (0, 0, 0, 0, 0)


def has_mask(layer: Any) -> bool:
    """Whether the layer has a mask input (structural: the same at build and at run time)."""
    return len(layer.inputs) > 3 and bool(layer.inputs[3])


def mask_defines(masked: bool) -> dict[str, int]:
    """FLASH_MASKED=0 for a layer without a mask: flash_common.cuh compiles the mask pass out (the sm90
    kernel at head 128: 138 registers instead of 210, so two blocks an SM again); a masked kernel keeps the
    defines (and cache keys) it had."""
    return {} if masked else {"FLASH_MASKED": 0}


def split_batch(layer: Any) -> bool:
    """The layer's Q, K, V or mask has an outer batch dim of more than one (rank-5 attention):
    kernels without the outer strides (flash_sm90's TMA maps) cannot run it."""
    shapes = getattr(layer, "in_shapes", ())
    views = [head_view(layer.attrs, i, shapes[i]) for i in range(min(3, len(shapes)))]
    mask = shapes[3] if len(layer.inputs) > 3 and layer.inputs[3] and len(shapes) > 3 else ()
    return any(v is not None and v.outer[0] > 1 for v in views) or (len(mask) == 5 and int(mask[0]) > 1)


def flash_geometry(layer: Any, elems: Mapping[str, str] = ELEMS,
                   heads: Sequence[int] = HEAD_SIZES) -> tuple[str, int] | None:
    """(storage dtype, head size) when a flash kernel taking the storage dtypes `elems` (numpy
    name -> kernel ELEM) and the head sizes `heads` can run the layer, else None."""
    dtypes, shapes = getattr(layer, "in_dtypes", ()), getattr(layer, "in_shapes", ())
    if len(shapes) < 3 or len(dtypes) < 3 or layer.domain != "ai.polykit":
        return None
    if len({dtypes[0], dtypes[1], dtypes[2]}) != 1 or dtypes[0] not in elems:
        return None
    views = [head_view(layer.attrs, i, shapes[i]) for i in range(3)]
    if any(v is None for v in views):
        return None
    if any(not v.aligned(16 // np.dtype(dtypes[0]).itemsize) for v in views):
        return None  # rows not on 16-byte boundaries: the cp.async loads cannot take them
    q, k, v = (x.shape for x in views)
    D = q[3]
    if D not in heads or k[3] != D or v[3] != D or k[2] != v[2]:
        return None
    g = _groups(layer.attrs)
    if g is None or (g > 1 and (k[1] * g != q[1] or v[1] * g != q[1])):
        return None
    qo = views[0].outer[0]
    # the (outer, batch, heads) each query head reads
    k, v = ((o.outer[0], x[0], q[1] if g > 1 else x[1]) for x, o in ((k, views[1]), (v, views[2])))
    for x in (k, v):
        if any(a != c and a != 1 for a, c in zip(x, (qo,) + q[:2])) and \
                any(a != c and c != 1 for a, c in zip(x, (qo,) + q[:2])):
            return None
    if len(layer.inputs) > 3 and layer.inputs[3]:
        mshape = shapes[3]
        ms = mask_strides5(mshape)
        if ms is None or ms[4] not in (0, 1) or dtypes[3] not in (dtypes[0], "bool"):
            return None
    return dtypes[0], D


def _groups(attrs: Mapping[str, Any]) -> int | None:
    try:
        return kv_groups(attrs)
    except ViewError:
        return None


def block_kv(head: int) -> int:
    """Keys a shared-memory tile of cuda.attention.flash holds: 64, 32 for heads over 128."""
    return 64 if head <= 128 else 32


@dataclass(frozen=True)
class FlashShape:
    """One block shape of flash_attention.cu: 4 warps of `rows` 16-row m-tiles each (BQ = 64 `rows`
    query rows a block), key tiles of `kv` keys (0: block_kv(head)), for the head sizes `heads`."""

    name: str
    rows: int = 1
    kv: int = 0
    heads: tuple[int, ...] = HEAD_SIZES
    priority: int = 20

    @property
    def block_q(self) -> int:
        return 64 * self.rows

    def block_kv(self, head: int) -> int:
        return self.kv or block_kv(head)

    def smem(self, head: int) -> int:
        """Dynamic shared memory: the Q tile and two buffers of the K and V tiles, 2-byte elements."""
        return (self.block_q + 4 * self.block_kv(head)) * head * 2

    @property
    def params(self) -> dict[str, int]:
        if not self.kv:
            return {"block_q": self.block_q, "block_kv": 64, "block_kv_over_128": 32, "warps": 4}
        return {"block_q": self.block_q, "block_kv": self.kv, "warps": 4, "max_head": max(self.heads)}

    def kernel(self, elem: str, head: int, masked: bool = True, q8: bool = False) -> KernelSource:
        """`q8`: AttentionQuantize's e4m3 output stage (FLASH_Q8)."""
        # ROWS only when not 1: the one-m-tile kernels keep the defines (and cache keys' define lines) they had
        rows = {"ROWS": self.rows} if self.rows != 1 else {}
        quantized = {"FLASH_Q8": 1} if q8 else {}
        return KernelSource("flash_attention", file=FILE,
                            defines=defines(ELEM=elem, HD=head, BKV=self.block_kv(head), **rows, **mask_defines(masked),
                                            **quantized))


#: cuda.attention.flash; then the larger tiles the builder times against it (priority below it, so a plan
#: built without timing keeps it): two m-tiles a warp (BQ 128: each K and V fragment loaded from shared
#: memory feeds two MMAs) and key tiles of 128 (half the waits, barriers and rescales a key). Heads up to
#: 64 only: from 96 the two m-tiles' Q fragments, scores and output accumulators outgrow 255 registers a
#: thread, and key tiles of 128 with two m-tiles spill even at head 32 (ptxas -v, docs/CUDA_KERNELS.md).
SHAPES = (FlashShape("cuda.attention.flash"),
          FlashShape("cuda.attention.flash_q128", rows=2, kv=64, heads=(32, 64), priority=19),
          FlashShape("cuda.attention.flash_kv128", rows=1, kv=128, heads=(32, 64), priority=19))


@dataclass(frozen=True)
class FlashLaunch:
    """What every flash kernel takes for one layer: grid, head size and the argument list
    (Q, K, V, O, mask, S, Skv, (batch, head, seq) strides of Q, K, V, O, mask strides, scale,
    mask kind, nan_probs_to_zero, kv_groups, causal offset; then B2 and the outer batch strides of Q, K, V, O and
    the mask: the last OUTER_ARGS, which kernels without an outer batch dim leave off)."""

    grid: tuple[int, int, int]
    head: int
    args: tuple[Any, ...]
    #: how Q, K, V and O are addressed (the pointers in `args` are already at their offsets)
    views: tuple[HeadView, ...] = ()


def flash_launch(layer: Any, tensors: Mapping[str, DeviceTensor], block_q: int = BQ) -> FlashLaunch | None:
    """The layer's flash launch (grid x: blocks of `block_q` query rows), None when its output is empty."""
    mask = tensors[layer.inputs[3]] if len(layer.inputs) > 3 and layer.inputs[3] else None
    names = [*layer.inputs[:3], layer.outputs[0]]
    ts = [tensors[n] for n in names]
    views = [head_view(layer.attrs, i, t.shape) for i, t in enumerate(ts)]
    if any(v is None for v in views):
        raise DeviceError("the layer's Q, K, V or output is no rank 3 or 4 view of its tensor",
                          where=f"layer {layer.name!r}", hint="rebuild the plan")
    (B, H, S, D), kshape, oshape = views[0].shape, views[1].shape, views[3].shape
    g = _groups(layer.attrs)
    if g is None or (g > 1 and kshape[1] * g != H):
        raise DeviceError(f"kv_groups {layer.attrs.get('kv_groups')!r} does not map Q's {H} heads onto K's {kshape[1]}",
                          where=f"layer {layer.name!r}", hint="rebuild the plan")
    B, H = max(B, kshape[0], oshape[0]), max(H, kshape[1], oshape[1])
    Skv = kshape[2]
    if ts[3].size == 0:
        return None
    q, k, v, y = (at_offset(t, x.offset) for t, x in zip(ts, views))
    if mask is None:
        mptr, ms, kind = 0, (0, 0, 0, 0, 0), 0
    else:
        mptr, ms = mask, mask.strides5 if isinstance(mask, StridedMask) else mask_strides5(mask.shape)
        kind = 2 if mask.dtype == np.bool_ else 1
    B1 = max(x.outer[0] for x in views)
    scale = float(layer.attrs.get("scale", 1.0 / math.sqrt(D)))
    args = (q, k, v, y, mptr, np.int32(S), np.int32(Skv), *(s for x in views for s in x.strides), *ms[1:],
            np.float32(scale), np.int32(kind), np.int32(int(layer.attrs.get("nan_probs_to_zero", 0))), np.int32(g),
            np.int32(causal_offset(layer, mask is not None)), np.int32(B), *(x.outer[1] for x in views), ms[0])
    return FlashLaunch((-(-S // block_q), H, B1 * B), D, args, tuple(views))


#: flash_common.cuh's FLASH_NO_CAUSAL: every key tile
NO_CAUSAL = 1 << 30


def causal_offset(layer: Any, masked: bool) -> int:
    """The kernels' causal_off argument: the layer's MASK_CAUSAL hint (every key k > q + offset of its
    mask is -inf / false: mark_causal_masks), so the key tiles past a block's diagonal are skipped;
    NO_CAUSAL without one (or without the mask the hint describes)."""
    hint = layer.attrs.get(MASK_CAUSAL)
    if hint is None or not masked:
        return NO_CAUSAL
    return max(-NO_CAUSAL + 1, min(int(hint), NO_CAUSAL))


def at_offset(t: DeviceTensor, offset: int) -> DeviceTensor:
    """`t` as a kernel argument pointing `offset` elements in (a view's first element)."""
    return t if offset == 0 else replace(t, ptr=t.ptr + offset * np.dtype(t.dtype).itemsize)


def quantized_output(layer: Any) -> bool:
    """An AttentionQuantize layer whose output stage the FLASH_Q8 kernels write: e4m3 out, a float32 scale."""
    return (layer.kind == QUANTIZED and tuple(getattr(layer, "out_dtypes", ()) or ()) == ("float8_e4m3fn",)
            and tuple(getattr(layer, "in_dtypes", ()) or ())[Y_SCALE:Y_ZERO + 1] == ("float32", "float8_e4m3fn"))


def _supports_of(shape: FlashShape):
    def supports(layer: Any) -> bool:
        return flash_geometry(layer, heads=shape.heads) is not None and (layer.kind != QUANTIZED
                                                                         or quantized_output(layer))

    return supports


def _kernels_of(shape: FlashShape):
    def kernels(layer: Any) -> list[KernelSource]:
        dtype, head = flash_geometry(layer, heads=shape.heads)
        return [shape.kernel(ELEMS[dtype], head, has_mask(layer), layer.kind == QUANTIZED)]

    return kernels


def quantized_scale(layer: Any, tensors: Mapping[str, DeviceTensor]) -> list[DeviceTensor]:
    """The FLASH_Q8 kernels' last argument (y_scale) for an AttentionQuantize layer, none for an Attention;
    DeviceError where the tensors are not the e4m3 output and float32 scale those kernels take."""
    if layer.kind != QUANTIZED:
        return []
    if tensors[layer.outputs[0]].dtype.name != "float8_e4m3fn" or tensors[layer.inputs[Y_SCALE]].dtype != np.float32:
        raise DeviceError(f"{layer.kind} writes float8_e4m3fn with a float32 scale here, not "
                          f"{tensors[layer.outputs[0]].dtype}", where=f"layer {layer.name!r}",
                          hint="rebuild the plan (fuse_output_quantize makes only that form) or use --target cpu")
    return [tensors[layer.inputs[Y_SCALE]]]


def _enqueue_of(shape: FlashShape):
    def enqueue(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor]) -> None:
        q8 = layer.kind == QUANTIZED
        y_scale = quantized_scale(layer, tensors)
        run = flash_launch(layer, tensors, shape.block_q)
        if run is None:
            return
        elem = ELEMS[np.dtype(tensors[layer.inputs[0]].dtype).name]
        args = list(run.args) + y_scale
        launcher.launch(shape.kernel(elem, run.head, has_mask(layer), q8), run.grid, (128,), args,
                        shared_mem=shape.smem(run.head))

    return enqueue


_supports = _supports_of(SHAPES[0])  # cuda.attention.flash's


def compile_variants() -> list[KernelSource]:
    """Every masked variant; the unmasked ones differ by one #if (FLASH_MASKED): one a block shape."""
    return [s.kernel(e, d) for s in SHAPES for e in ELEMS.values() for d in s.heads] + \
        [s.kernel("half_t", s.heads[-1], masked=False) for s in SHAPES] + \
        [s.kernel(e, 64, q8=True) for s in SHAPES for e in ELEMS.values()]  # AttentionQuantize (BERT's head 64)


for _shape in SHAPES:
    for _kind in ("Attention", QUANTIZED):
        cuda_tactic(_kind, _shape.name, kernels=_kernels_of(_shape), supports=_supports_of(_shape),
                    priority=_shape.priority, domain=POLYKIT_DOMAIN if _kind == QUANTIZED else ANY,
                    params=_shape.params)(_enqueue_of(_shape))

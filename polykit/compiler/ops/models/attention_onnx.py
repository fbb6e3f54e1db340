"""ONNX Attention (opset 23, 24 and 25 as onnx 1.23.2 defines them): shape rule and geometry.

Inputs Q, K, V (rank 3 [B, S, H*D] with `q_num_heads` / `kv_num_heads`, or rank 4
[B, H, S, D]), optional attn_mask (bool keep-mask or additive float, broadcast to
[B, Hq, Sq, Skv], its last axis may be shorter than Skv: the rest is masked), past_key /
past_value ([B, Hkv, Spast, D]), nonpad_kv_seqlen ([B] int64, opset 24). Outputs Y (Q's
rank), present_key / present_value ([B, Hkv, Spast + Skv, D]) and qk_matmul_output
([B, Hq, Sq, Spast + Skv], `qk_matmul_output_mode` 0-3). Hq must be a multiple of Hkv
(grouped-query attention: query head h reads key/value head h // (Hq / Hkv)).

The ai.polykit Attention of the fused layers is another op (ops/fused.py); this module is
the ONNX one, which keeps its own semantics (causal offsets, windows, softcap, the
fully-masked-row rule) on both targets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from polykit.compiler.ir.graph import Dim
from polykit.compiler.ops.registry import InferContext, shape_rule

#: input positions of the optional inputs
MASK, PAST_KEY, PAST_VALUE, NONPAD = 3, 4, 5, 6


def _mul(a: Dim, b: Dim) -> Dim:
    return a * b if isinstance(a, int) and isinstance(b, int) else None


def _add(a: Dim, b: Dim) -> Dim:
    return a + b if isinstance(a, int) and isinstance(b, int) else None


@dataclass(frozen=True)
class AttentionGeometry:
    """The sizes of one ONNX Attention node (ints, or symbolic/None in shape inference)."""

    rank: int
    batch: Dim
    q_heads: Dim
    kv_heads: Dim
    q_len: Dim
    new_kv_len: Dim
    past_len: Dim
    head_size: Dim
    v_head_size: Dim

    @property
    def kv_len(self) -> Dim:
        """Keys attended: past plus new."""
        return _add(self.past_len, self.new_kv_len)

    @property
    def group(self) -> int:
        """Query heads per key/value head."""
        return self.q_heads // self.kv_heads

    def y_shape(self) -> tuple[Dim, ...]:
        if self.rank == 3:
            return (self.batch, self.q_len, _mul(self.q_heads, self.v_head_size))
        return (self.batch, self.q_heads, self.q_len, self.v_head_size)

    def present_shape(self, head: Dim) -> tuple[Dim, ...]:
        return (self.batch, self.kv_heads, self.kv_len, head)

    def qk_shape(self) -> tuple[Dim, ...]:
        return (self.batch, self.q_heads, self.q_len, self.kv_len)


def _split_heads(hidden: Dim, heads: Any, what: str, fail) -> Dim:
    if not isinstance(hidden, int):
        return None
    if hidden % heads:
        raise fail(f"{what} hidden size {hidden} does not split into {heads} heads")
    return hidden // heads


def attention_geometry(shapes: Sequence[Any], attrs: Mapping[str, Any], fail) -> AttentionGeometry:
    """The geometry of an Attention node from its input shapes (Q, K, V, mask, past_key, ...;
    None for an absent one) and attributes; `fail(what, hint=None)` builds the error to raise."""
    q, k, v = (tuple(s) for s in shapes[:3])
    past = shapes[PAST_KEY] if len(shapes) > PAST_KEY else None
    if not len(q) == len(k) == len(v) or len(q) not in (3, 4):
        raise fail(f"Q, K, V must all be rank 3 or all rank 4, got ranks {len(q)}, {len(k)}, {len(v)}")
    if len(q) == 3:
        hq, hkv = attrs.get("q_num_heads"), attrs.get("kv_num_heads")
        if hq is None or hkv is None or int(hq) <= 0 or int(hkv) <= 0:
            raise fail("3-D Q, K, V need positive q_num_heads and kv_num_heads attributes",
                       hint="set both attributes, or pass 4-D [B, H, S, D] tensors")
        hq, hkv = int(hq), int(hkv)
        d, dk = _split_heads(q[2], hq, "Q", fail), _split_heads(k[2], hkv, "K", fail)
        dv = _split_heads(v[2], hkv, "V", fail)
        batch, sq, skv = q[0], q[1], k[1]
    else:
        batch, hq, sq, d = q
        hkv, skv, dk, dv = k[1], k[2], k[3], v[3]
    geo = AttentionGeometry(len(q), batch, hq, hkv, sq, skv, past[2] if past is not None else 0, d, dv)
    if isinstance(d, int) and isinstance(dk, int) and d != dk:
        raise fail(f"Q and K head sizes differ ({d} vs {dk})")
    if isinstance(hq, int) and isinstance(hkv, int) and (hkv == 0 or hq % hkv):
        raise fail(f"{hq} query heads are not a multiple of {hkv} key/value heads")
    return geo


@shape_rule("Attention")
def _attention(ctx: InferContext):
    shapes = [ctx.shape(i) for i in range(min(ctx.n_inputs, 7))]
    if any(s is None for s in shapes[:3]):
        return [(ctx.dtype(0), None), (ctx.dtype(1), None), (ctx.dtype(2), None), (ctx.dtype(0), None)][: ctx.n_outputs]
    if ctx.has(PAST_KEY) != ctx.has(PAST_VALUE):
        raise ctx.fail("past_key and past_value must be given together")
    if ctx.has(NONPAD) and ctx.has(PAST_KEY):
        raise ctx.fail("nonpad_kv_seqlen cannot be combined with past_key / past_value",
                       hint="nonpad_kv_seqlen describes an external cache passed as K and V")
    mask_dtype = ctx.dtype(MASK)
    if mask_dtype is not None and mask_dtype != np.dtype(np.bool_) and mask_dtype.kind != "f" \
            and mask_dtype.name != "bfloat16":
        raise ctx.fail(f"attn_mask has dtype {mask_dtype}; it must be bool or a float type")
    if int(ctx.attr("qk_matmul_output_mode", 0)) not in (0, 1, 2, 3):
        raise ctx.fail(f"qk_matmul_output_mode {ctx.attr('qk_matmul_output_mode')} is not 0, 1, 2 or 3")
    geo = attention_geometry(shapes, ctx.node.attrs, ctx.fail)
    mask = ctx.shape(MASK)
    if mask is not None and len(mask) > 4:
        raise ctx.fail(f"attn_mask of rank {len(mask)} does not broadcast to [B, Hq, Sq, Skv]")
    outs = [(ctx.dtype(0), geo.y_shape()), (ctx.dtype(1), geo.present_shape(geo.head_size)),
            (ctx.dtype(2), geo.present_shape(geo.v_head_size)), (ctx.dtype(0), geo.qk_shape())]
    return outs[: ctx.n_outputs]

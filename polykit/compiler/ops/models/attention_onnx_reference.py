"""Reference kernel of ONNX Attention (opset 23-25).

float32 / float64 inputs compute in float64 and round once. float16 / bfloat16 inputs
compute stage by stage in their own type, as the spec says (its T; the softmax in
`softmax_precision` when given), with numpy's arithmetic for that type.

Scores are (Q K^T) * scale (scale defaults to 1/sqrt(D)), soft-capped (softcap * tanh(s /
softcap) when softcap > 0), plus one additive bias that combines attn_mask (bool: keep or
-inf; float: added; a last axis shorter than Skv masks the keys after it), the causal rule
(key j is visible to query i when j <= i + offset), the sliding window
(i + offset - left <= j <= i + offset + right for each side >= 0) and nonpad_kv_seqlen
(keys j >= nonpad[b] are masked). offset is past_key's length, or nonpad[b] - Sq with an
external cache, else 0. The softmax runs over keys; a row whose bias is -inf everywhere
(no visible key) gives probabilities 0, so Y = 0 there. qk_matmul_output_mode picks which
stage the fourth output shows: 0/1 the (soft-capped) scores, 2 with the bias, 3 the
probabilities.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from polykit.compiler.ir import dtypes
from polykit.compiler.ops.models.attention_onnx import MASK, NONPAD, PAST_KEY, PAST_VALUE, attention_geometry
from polykit.errors import ShapeError
from polykit.compiler.ops.references import reference


def _to_bhsd(x: np.ndarray, heads: int) -> np.ndarray:
    """[B, S, H*D] -> [B, H, S, D]; rank-4 tensors are already so."""
    if x.ndim == 4:
        return x
    b, s, hidden = x.shape
    return x.reshape(b, s, heads, hidden // heads).transpose(0, 2, 1, 3)


def visible_offsets(geo, past_len: int, nonpad: np.ndarray | None) -> np.ndarray:
    """The causal/window frontier offset of each batch ([B, 1, 1, 1], int64)."""
    if nonpad is not None and past_len == 0:
        return (nonpad.astype(np.int64).reshape(-1) - geo.q_len).reshape(-1, 1, 1, 1)
    return np.full((1, 1, 1, 1), past_len, np.int64)


def attention_bias(node, geo, mask: np.ndarray | None, nonpad: np.ndarray | None) -> np.ndarray:
    """The additive float64 bias, broadcastable to [B, Hq, Sq, Skv] (0 where visible, -inf where not)."""
    skv = geo.kv_len
    bias = np.zeros((1, 1, geo.q_len, skv))
    if mask is not None:
        m = np.where(mask, 0.0, -np.inf) if mask.dtype == np.bool_ else mask.astype(np.float64)
        pad = skv - m.shape[-1]
        if pad > 0:
            m = np.concatenate([m, np.full(m.shape[:-1] + (pad,), -np.inf)], axis=-1)
        bias = bias + m
    i = np.arange(geo.q_len).reshape(1, 1, -1, 1)
    j = np.arange(skv).reshape(1, 1, 1, -1)
    frontier = i + visible_offsets(geo, geo.past_len, nonpad)
    allowed = np.ones(np.broadcast_shapes(frontier.shape, j.shape), bool)
    if int(node.attrs.get("is_causal", 0)):
        allowed &= j <= frontier
    left, right = int(node.attrs.get("left_window_size", -1)), int(node.attrs.get("right_window_size", -1))
    if left >= 0:
        allowed &= frontier - j <= left
    if right >= 0:
        allowed &= j - frontier <= right
    if nonpad is not None:
        allowed &= j < nonpad.astype(np.int64).reshape(-1, 1, 1, 1)
    return bias + np.where(allowed, 0.0, -np.inf)


def _softmax_dtype(node, t: np.dtype) -> np.dtype:
    """softmax_precision for 16-bit inputs (which otherwise compute their softmax in their own
    type); wider inputs compute in float64 whatever it says."""
    precision = node.attrs.get("softmax_precision")
    if precision is None or t.itemsize >= 4:
        return t
    return dtypes.to_numpy(int(precision))


def _fail(what: str, hint: str | None = None) -> ShapeError:
    return ShapeError(what, where="Attention", hint=hint)


@reference("Attention")
def attention(node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    inputs = list(inputs) + [None] * (7 - len(inputs))
    q, k, v = inputs[:3]
    mask, past_k, past_v, nonpad = inputs[MASK], inputs[PAST_KEY], inputs[PAST_VALUE], inputs[NONPAD]
    geo = attention_geometry([x.shape if x is not None else None for x in inputs], node.attrs, _fail)
    kq, vq = _to_bhsd(k, geo.kv_heads), _to_bhsd(v, geo.kv_heads)
    present_k = np.ascontiguousarray(np.concatenate([past_k, kq], axis=2) if past_k is not None else kq)
    present_v = np.ascontiguousarray(np.concatenate([past_v, vq], axis=2) if past_v is not None else vq)
    # float16 / bfloat16 compute in their own precision stage by stage (the spec's T), wider
    # types in float64
    t = q.dtype if q.dtype.itemsize < 4 else np.dtype(np.float64)
    scale = node.attrs.get("scale")
    scale = 1.0 / np.sqrt(geo.head_size) if scale is None else float(scale)
    root = np.asarray(np.sqrt(scale)).astype(t)
    qt = _to_bhsd(q, geo.q_heads).astype(t) * root
    kt = np.repeat(present_k.astype(t), geo.group, axis=1) * root
    vt = np.repeat(present_v.astype(t), geo.group, axis=1)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        scores = np.matmul(qt, np.swapaxes(kt, -1, -2)).astype(t)
        softcap = float(node.attrs.get("softcap", 0.0))
        if softcap > 0:
            cap = np.asarray(softcap).astype(t)
            scores = np.tanh(scores / cap) * cap
        bias = attention_bias(node, geo, mask, nonpad)
        biased = scores + bias.astype(t)
        sm = _softmax_dtype(node, t)
        biased = biased.astype(sm)
        top = np.max(biased, axis=-1, keepdims=True)
        e = np.exp(biased - np.where(np.isneginf(top), np.zeros((), sm), top))
        total = np.sum(e, axis=-1, keepdims=True)
        probs = e / np.where(total == 0, np.ones((), sm), total)
        hidden = np.isneginf(np.max(np.broadcast_to(bias, biased.shape), axis=-1, keepdims=True))
        probs = np.where(hidden, np.zeros((), sm), probs).astype(t)
        y = np.matmul(probs, vt).astype(t)
    if geo.rank == 3:
        y = y.transpose(0, 2, 1, 3).reshape(geo.y_shape())
    mode = int(node.attrs.get("qk_matmul_output_mode", 0))
    qk = {2: biased, 3: probs}.get(mode, scores)
    return [y.astype(q.dtype), present_k, present_v, qk.astype(q.dtype)][: max(len(node.outputs), 1)]

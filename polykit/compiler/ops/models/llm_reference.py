"""Reference kernels of the newest LLM ops: RotaryEmbedding, SwiGLU, TensorScatter,
LinearAttention, CausalConvWithState. Arithmetic in float64, rounded once to the output
type, except where the spec rounds between stages (SwiGLU's Swish)."""

from __future__ import annotations

import numpy as np

from polykit.compiler.ops.models.llm import LINEAR_RULES, text_attr
from polykit.errors import ShapeError
from polykit.compiler.ops.references import reference


@reference("RotaryEmbedding")
def rotary_embedding(node, inputs):
    """X [B, H, S, D] or [B, S, H*D]; the first `rotary_embedding_dim` features of each head
    rotate by the angles whose cos / sin the caches hold ([B, S, rot/2] directly, or
    [max_pos, rot/2] indexed by position_ids [B, S]), as halves or interleaved pairs."""
    x, cos, sin = inputs[:3]
    pos = inputs[3] if len(inputs) > 3 else None
    if x.ndim == 4:
        xs = np.swapaxes(x, 1, 2)  # [B, S, H, D]
    else:
        b, s, hidden = x.shape
        heads = int(node.attrs["num_heads"])
        xs = x.reshape(b, s, heads, hidden // heads)
    xs = xs.astype(np.float64)
    rot = int(node.attrs.get("rotary_embedding_dim", 0)) or xs.shape[-1]
    if pos is not None:
        cos, sin = cos[pos], sin[pos]
    cos, sin = cos.astype(np.float64)[:, :, None, :], sin.astype(np.float64)[:, :, None, :]
    inter = int(node.attrs.get("interleaved", 0))
    part = xs[..., :rot]
    x1, x2 = (part[..., 0::2], part[..., 1::2]) if inter else (part[..., : rot // 2], part[..., rot // 2:])
    real, imag = cos * x1 - sin * x2, sin * x1 + cos * x2
    out = xs.copy()
    if inter:
        out[..., 0:rot:2], out[..., 1:rot:2] = real, imag
    else:
        out[..., : rot // 2], out[..., rot // 2: rot] = real, imag
    out = np.swapaxes(out, 1, 2) if x.ndim == 4 else out.reshape(x.shape)
    return [np.ascontiguousarray(out).astype(x.dtype)]


@reference("SwiGLU")
def swiglu(node, inputs):
    """Swish_alpha(A) * B: the sigmoid rounds to A's type, then the two products do (the spec's body)."""
    a, b = inputs
    alpha = float(node.attrs.get("alpha", 1.0))
    sig = (1.0 / (1.0 + np.exp(-alpha * a.astype(np.float64)))).astype(a.dtype)
    return [((a * sig).astype(a.dtype) * b).astype(a.dtype)]


@reference("TensorScatter")
def tensor_scatter(node, inputs):
    """present = past_cache with update written along `axis` from write_indices[b] (0 when
    omitted), wrapping modulo the cache length in "circular" mode."""
    cache, update = inputs[:2]
    idx = inputs[2] if len(inputs) > 2 and inputs[2] is not None else np.zeros(cache.shape[0], np.int64)
    axis = int(node.attrs.get("axis", -2)) % cache.ndim
    circular = text_attr(node, "mode", "linear") == "circular"
    out = cache.copy()
    n, length = update.shape[axis], cache.shape[axis]
    for b in range(cache.shape[0]):
        dest = int(idx[b]) + np.arange(n)
        if circular:
            dest = dest % length
        if n and (dest.min() < 0 or dest.max() >= length):
            raise ShapeError(f"write_indices[{b}] = {int(idx[b])} writes {n} entries past the cache length {length}",
                             where=node.describe(), hint="use mode='circular' or smaller write indices")
        dst = np.moveaxis(out[b], axis - 1, 0)
        dst[dest] = np.moveaxis(update[b], axis - 1, 0)
    return [out]


def _heads(x: np.ndarray, heads: int) -> np.ndarray:
    """[B, T, H*d] -> [B, H, T, d] in float64."""
    b, t, hd = x.shape
    return x.reshape(b, t, heads, hd // heads).transpose(0, 2, 1, 3).astype(np.float64)


@reference("LinearAttention")
def linear_attention(node, inputs):
    """Recurrent state S [B, Hkv, dk, dv] per step t: S *= exp(decay_t) (gated), v_t =
    beta_t * (v_t - S^T k_t) (delta), S += k_t v_t^T; output_t = scale * S^T q_t, query
    head h reading state h // (Hq / Hkv)."""
    q, k, v = inputs[:3]
    past, decay, beta = (inputs[i] if len(inputs) > i else None for i in (3, 4, 5))
    hq, hkv = int(node.attrs["q_num_heads"]), int(node.attrs["kv_num_heads"])
    gated, delta = LINEAR_RULES[text_attr(node, "update_rule", "gated_delta")]
    q4, k4, v4 = _heads(q, hq), _heads(k, hkv), _heads(v, hkv)
    b, _, t, dk = k4.shape
    dv = v4.shape[-1]
    scale = float(node.attrs.get("scale", 0.0)) or 1.0 / np.sqrt(dk)
    state = past.astype(np.float64) if past is not None else np.zeros((b, hkv, dk, dv))
    g4 = _heads(decay, hkv) if gated else None  # [B, Hkv, T, 1 or dk]
    beta4 = beta.astype(np.float64).reshape(b, t, -1, 1).transpose(0, 2, 1, 3) if delta else None
    out = np.zeros((b, hq, t, dv))
    group = hq // hkv
    for i in range(t):
        kt, vt = k4[:, :, i], v4[:, :, i]
        if gated:
            state = state * np.exp(g4[:, :, i])[..., None]
        if delta:
            vt = beta4[:, :, i] * (vt - np.einsum("bhdm,bhd->bhm", state, kt))
        state = state + kt[..., :, None] * vt[..., None, :]
        out[:, :, i] = scale * np.einsum("bhd,bhdm->bhm", q4[:, :, i], np.repeat(state, group, axis=1))
    y = out.transpose(0, 2, 1, 3).reshape(b, t, hq * dv).astype(q.dtype)
    return [y, state.astype(past.dtype if past is not None else q.dtype)]


@reference("CausalConvWithState")
def causal_conv_with_state(node, inputs):
    """Depthwise causal conv1d: input [B, C, L] after past_state [B, C, k-1] (zeros when
    omitted), weight [C, 1, k], optional bias and SiLU; present_state is the last k-1 steps."""
    x, w = inputs[:2]
    bias, past = (inputs[i] if len(inputs) > i else None for i in (2, 3))
    k = w.shape[2]
    if past is None:
        past = np.zeros(x.shape[:2] + (k - 1,), x.dtype)
    padded = np.concatenate([past, x], axis=2)
    p64, w64 = padded.astype(np.float64), w[:, 0, :].astype(np.float64)
    length = x.shape[2]
    y = sum(p64[:, :, j: j + length] * w64[None, :, j, None] for j in range(k))
    if bias is not None:
        y = y + bias.astype(np.float64)[None, :, None]
    if text_attr(node, "activation", "none") != "none":
        y = y.astype(x.dtype).astype(np.float64)
        y = y / (1.0 + np.exp(-y))
    return [y.astype(x.dtype), np.ascontiguousarray(padded[:, :, padded.shape[2] - (k - 1):])]

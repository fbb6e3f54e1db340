"""The newest opsets' LLM ops: shape rules of RotaryEmbedding (23), TensorScatter (24),
LinearAttention and CausalConvWithState (27), SwiGLU (28). Attention is attention_onnx.py."""

from __future__ import annotations

from polykit.compiler.ops.registry import InferContext, shape_rule

#: LinearAttention update rules -> (uses decay, uses beta)
LINEAR_RULES = {"linear": (False, False), "gated": (True, False), "delta": (False, True), "gated_delta": (True, True)}
#: CausalConvWithState activations ("swish" is an alias of "silu")
CONV_ACTIVATIONS = ("none", "silu", "swish")


def text_attr(ctx_or_node, key: str, default: str) -> str:
    """A string attribute of a node or of the node an InferContext holds."""
    attrs = ctx_or_node.node.attrs if isinstance(ctx_or_node, InferContext) else ctx_or_node.attrs
    return str(attrs.get(key, default))


@shape_rule("RotaryEmbedding")
def _rotary(ctx: InferContext):
    x = ctx.shape(0)
    if x is not None:
        if len(x) not in (3, 4):
            raise ctx.fail(f"RotaryEmbedding needs X of rank 3 [B, S, H*D] or 4 [B, H, S, D], got rank {len(x)}")
        if len(x) == 3 and int(ctx.attr("num_heads", 0)) <= 0:
            raise ctx.fail("a 3-D RotaryEmbedding input needs the num_heads attribute")
        head = x[3] if len(x) == 4 else (x[2] // int(ctx.attr("num_heads")) if isinstance(x[2], int) else None)
        rot = int(ctx.attr("rotary_embedding_dim", 0)) or head
        cos = ctx.shape(1)
        if isinstance(rot, int) and cos is not None and isinstance(cos[-1], int) and cos[-1] * 2 != rot:
            raise ctx.fail(f"cos_cache's last dim {cos[-1]} is not half the rotary dim {rot}")
        if isinstance(head, int) and isinstance(rot, int) and (rot > head or rot % 2):
            raise ctx.fail(f"rotary_embedding_dim {rot} must be even and at most the head size {head}")
    return [(ctx.dtype(0), x)]


@shape_rule("SwiGLU")
def _swiglu(ctx: InferContext):
    a, b = ctx.shape(0), ctx.shape(1)
    if a is not None and b is not None and (len(a) != len(b) or any(
            isinstance(x, int) and isinstance(y, int) and x != y for x, y in zip(a, b))):
        raise ctx.fail(f"SwiGLU needs A and B of one shape (no broadcasting), got {a} and {b}")
    return [(ctx.dtype(0), a)]


@shape_rule("TensorScatter")
def _tensor_scatter(ctx: InferContext):
    cache, update = ctx.shape(0), ctx.shape(1)
    if text_attr(ctx, "mode", "linear") not in ("linear", "circular"):
        raise ctx.fail(f"TensorScatter mode {text_attr(ctx, 'mode', '')!r} is not 'linear' or 'circular'")
    if cache is not None and update is not None:
        if len(cache) != len(update):
            raise ctx.fail(f"past_cache rank {len(cache)} differs from update rank {len(update)}")
        axis = ctx.normalize_axis(int(ctx.attr("axis", -2)), len(cache))
        if axis == 0:
            raise ctx.fail("TensorScatter's axis must not be the batch axis 0")
        for i, (c, u) in enumerate(zip(cache, update)):
            if isinstance(c, int) and isinstance(u, int) and (c < u if i == axis else c != u):
                raise ctx.fail(f"update {update} does not fit past_cache {cache} (dim {i})")
    return [(ctx.dtype(0), cache)]


@shape_rule("LinearAttention")
def _linear_attention(ctx: InferContext):
    rule = text_attr(ctx, "update_rule", "gated_delta")
    if rule not in LINEAR_RULES:
        raise ctx.fail(f"unknown update_rule {rule!r}", hint=f"use one of {sorted(LINEAR_RULES)}")
    gated, delta = LINEAR_RULES[rule]
    if gated != ctx.has(4) or delta != ctx.has(5):
        raise ctx.fail(f"update_rule {rule!r} {'needs' if gated else 'forbids'} decay and "
                       f"{'needs' if delta else 'forbids'} beta")
    hq, hkv = int(ctx.attr("q_num_heads")), int(ctx.attr("kv_num_heads"))
    if hq <= 0 or hkv <= 0 or hq % hkv:
        raise ctx.fail(f"q_num_heads {hq} must be a positive multiple of kv_num_heads {hkv}")
    q, k, v = ctx.shape(0), ctx.shape(1), ctx.shape(2)
    if q is None or k is None or v is None:
        return [(ctx.dtype(0), None), (ctx.dtype(3) or ctx.dtype(0), None)]
    if not len(q) == len(k) == len(v) == 3:
        raise ctx.fail("query, key and value must be rank 3 [B, T, H*D]")
    dk = k[2] // hkv if isinstance(k[2], int) else None
    dv = v[2] // hkv if isinstance(v[2], int) else None
    out = (q[0], q[1], dv * hq if dv is not None else None)
    return [(ctx.dtype(0), out), (ctx.dtype(3) or ctx.dtype(0), (q[0], hkv, dk, dv))]


@shape_rule("CausalConvWithState")
def _causal_conv(ctx: InferContext):
    if text_attr(ctx, "activation", "none") not in CONV_ACTIVATIONS:
        raise ctx.fail(f"unknown activation {text_attr(ctx, 'activation', '')!r}", hint=f"use one of {CONV_ACTIVATIONS}")
    x, w = ctx.shape(0), ctx.shape(1)
    if x is None or w is None:
        return [(ctx.dtype(0), x), (ctx.dtype(0), None)]
    if len(x) != 3 or len(w) != 3:
        raise ctx.fail(f"input [B, C, L] and weight [C, 1, k] must be rank 3, got {x} and {w}")
    k = w[2]
    return [(ctx.dtype(0), x), (ctx.dtype(0), (x[0], x[1], k - 1 if isinstance(k, int) else None))]

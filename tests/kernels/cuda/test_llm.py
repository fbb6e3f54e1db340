"""RotaryEmbedding, SwiGLU, TensorScatter, CausalConvWithState, LinearAttention on cuda against the
reference (outputs poisoned)."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.models import llm

rng = np.random.default_rng(31)


def rand(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def lay(kind, inputs, n_out=1, **attrs):
    return LayerDesc(kind.lower(), kind, tuple(inputs), tuple(f"y{i}" for i in range(n_out)), attrs)


POS = rng.integers(0, 40, (2, 5)).astype(np.int64)
CASES = {
    "rotary_4d": (lay("RotaryEmbedding", "xcsp"), dict(x=rand(2, 3, 5, 16), c=rand(40, 8), s=rand(40, 8), p=POS), {}),
    "rotary_3d_interleaved_partial": (lay("RotaryEmbedding", "xcsp", num_heads=2, interleaved=1, rotary_embedding_dim=8),
                                      dict(x=rand(2, 5, 32), c=rand(40, 4), s=rand(40, 4), p=POS), {}),
    "rotary_fp16_no_positions": (lay("RotaryEmbedding", "xcs"),
                                 dict(x=rand(2, 3, 5, 8, dtype=np.float16), c=rand(2, 5, 4, dtype=np.float16),
                                      s=rand(2, 5, 4, dtype=np.float16)), {"rtol": 2e-3, "atol": 2e-3}),
    "swiglu": (lay("SwiGLU", "ab", alpha=0.6), dict(a=rand(7, 33), b=rand(7, 33)), {}),
    "swiglu_fp16": (lay("SwiGLU", "ab"), dict(a=rand(7, 33, dtype=np.float16), b=rand(7, 33, dtype=np.float16)),
                    {"rtol": 2e-3, "atol": 2e-3}),
    "tensor_scatter_circular": (lay("TensorScatter", "cui", mode="circular"),
                                dict(c=rand(3, 2, 5, 4), u=rand(3, 2, 3, 4), i=np.array([0, 3, 4], np.int64)),
                                {"rtol": 0, "atol": 0}),
    "tensor_scatter_int8_axis1": (lay("TensorScatter", "cui", axis=1),
                                  dict(c=rng.integers(-9, 9, (2, 6, 3)).astype(np.int8),
                                       u=rng.integers(-9, 9, (2, 2, 3)).astype(np.int8), i=np.array([1, 4], np.int64)),
                                  {"rtol": 0, "atol": 0}),
    "causal_conv_silu_past_bias": (lay("CausalConvWithState", "xwbp", 2, activation="silu"),
                                   dict(x=rand(2, 5, 7), w=rand(5, 1, 3), b=rand(5), p=rand(2, 5, 2)), {}),
    "causal_conv_short_input": (lay("CausalConvWithState", "xw", 2), dict(x=rand(1, 3, 2), w=rand(3, 1, 4)), {}),
    "linear_attention_gated_delta_gqa": (lay("LinearAttention", "qkvpdb", 2, q_num_heads=8, kv_num_heads=4),
                                         dict(q=rand(2, 5, 64), k=rand(2, 5, 32), v=rand(2, 5, 24),
                                              p=rand(2, 4, 8, 6) * 0.1, d=-np.abs(rand(2, 5, 32)),
                                              b=np.abs(rand(2, 5, 4))), {"rtol": 1e-4, "atol": 1e-4}),
    "linear_attention_per_head_decay": (lay("LinearAttention", ("q", "k", "v", "", "d"), 2, q_num_heads=2,
                                            kv_num_heads=2, update_rule="gated"),
                                        dict(q=rand(1, 4, 16), k=rand(1, 4, 16), v=rand(1, 4, 16),
                                             d=-np.abs(rand(1, 4, 2))), {"rtol": 1e-4, "atol": 1e-4}),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(CASES))
def test_llm_kernels_match_reference(case):
    from polykit.runtime.cuda.harness import assert_matches_reference

    layer, feeds, tol = CASES[case]
    assert_matches_reference(layer, feeds, **{"rtol": 1e-5, "atol": 1e-5, **tol})


def test_every_llm_op_has_one_cuda_tactic():
    from polykit.kernels.tactics import candidates

    for kind in ("RotaryEmbedding", "SwiGLU", "TensorScatter", "CausalConvWithState", "LinearAttention"):
        assert [t.name for t in candidates("cuda", kind, lay(kind, "ab"))] == [f"cuda.llm.{_short(kind)}"]
    assert {k.name for k in llm.compile_variants() if k.file == llm.FILE} >= {"rotary_bf16", "swiglu_f64"}


def _short(kind: str) -> str:
    return {"RotaryEmbedding": "rotary", "SwiGLU": "swiglu", "TensorScatter": "tensor_scatter",
            "CausalConvWithState": "causal_conv", "LinearAttention": "linear_attention"}[kind]

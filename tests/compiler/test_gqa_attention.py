"""Grouped- and multi-query attention: ai.polykit Attention's `kv_groups` (query head h reads key/value
head h // g; the reference, the shape rule at build and plan load) and fold_attention_layouts reading
K and V un-repeated (tests/compiler/gqa_models.py: HF's repeat_kv, torch's repeat_interleave). The cpu
plan against onnxruntime; the cuda fp16 plan (level 0, no GPU needed) keeps no repeat."""

from __future__ import annotations

import copy
from collections import Counter

import numpy as np
import onnxruntime as ort
import pytest

from polykit.compiler.builder import builder as builder_module
from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.graph.infer import infer_shapes
from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Graph, Node, Value
from polykit.compiler.ops.references import run_reference
from polykit.compiler.plan.file import Plan, decode_plan, encode_plan
from polykit.errors import PlanError, ShapeError
from tests.compiler.gqa_models import FORMS, gqa_block, gqa_feeds

#: the repeat's copies; none may be left between the projections and Attention
REPEAT = {"Unsqueeze", "Expand", "Tile"}


def _attention(g: int, **attrs) -> Node:
    return Node("Attention", ["q", "k", "v"], ["y"], {"kv_groups": g, **attrs}, name="att", domain=POLYKIT_DOMAIN)


def _by_loop(q, k, v, g, scale):
    """softmax(q_h k_{h//g}^T * scale) v_{h//g}, head by head (axis -3)."""
    out = np.empty(q.shape[:-1] + v.shape[-1:], np.float64)
    for h in range(q.shape[-3]):
        s = q[..., h, :, :] @ np.swapaxes(k[..., h // g, :, :], -1, -2) * scale
        p = np.exp(s - s.max(-1, keepdims=True))
        out[..., h, :, :] = (p / p.sum(-1, keepdims=True)) @ v[..., h // g, :, :]
    return out


@pytest.mark.parametrize("shape_q,hkv", [((2, 12, 13, 64), 4), ((1, 8, 77, 128), 1), ((6, 5, 24), 2), ((3, 4, 9, 32), 4)])
def test_reference_reads_key_value_head_h_over_g(shape_q, hkv):
    rng = np.random.default_rng(0)
    hq = shape_q[-3]
    kv_shape = shape_q[:-3] + (hkv,) + shape_q[-2:]
    q, k, v = rng.standard_normal(shape_q), rng.standard_normal(kv_shape), rng.standard_normal(kv_shape)
    (y,) = run_reference(_attention(hq // hkv, scale=0.3), [q, k, v])
    np.testing.assert_allclose(y, _by_loop(q, k, v, hq // hkv, 0.3), rtol=1e-10, atol=1e-12)


def _graph(g: int, hq: int, hkv: int) -> Graph:
    values = {"q": Value("q", np.dtype(np.float32), (2, hq, 5, 8)),
              **{n: Value(n, np.dtype(np.float32), (2, hkv, 7, 8)) for n in "kv"}}
    return Graph([_attention(g)], ["q", "k", "v"], ["y"], {}, values)


def test_shape_rule_gives_q_heads_and_refuses_heads_that_do_not_group():
    g = _graph(3, 12, 4)
    infer_shapes(g)
    assert g.value("y").shape == (2, 12, 5, 8)
    with pytest.raises(ShapeError, match="Q has 12 heads, K 4: with kv_groups 2"):
        infer_shapes(_graph(2, 12, 4))
    with pytest.raises(ShapeError, match="kv_groups 0 is no integer"):
        infer_shapes(_graph(0, 4, 4))

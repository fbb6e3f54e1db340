import numpy as np
import pytest

from .passes_testkit import graph, node

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.ops.nn.fused import rename_fused_tensor
from polykit.errors import ShapeError
from polykit.compiler.ops.references import run_reference

RNG = np.random.default_rng(11)


def _attention(q, k, v, mask=None, scale=None):
    s = q @ np.swapaxes(k, -1, -2) * (scale if scale is not None else 1 / np.sqrt(q.shape[-1]))
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def _attn_node(with_mask=False, **attrs):
    inputs = ["q", "k", "v"] + (["m"] if with_mask else [])
    return node("Attention", inputs, "o", domain=POLYKIT_DOMAIN, **attrs)


def test_pointwise_shape_rule_follows_the_body_dtypes():
    body = [{"op": "Less", "inputs": ["x", "b"], "outputs": ["l"], "attrs": {}},
            {"op": "Cast", "inputs": ["l"], "outputs": ["y"], "attrs": {"to": 7}}]
    g = graph([node("Pointwise", ["x", "b"], "y", domain=POLYKIT_DOMAIN, body=body, fused_from=[])],
              {"x": (2, 3), "b": (3,)}, ["y"])
    assert g.value("y").dtype == np.int64 and g.value("y").shape == (2, 3)


def test_epilogue_shape_rule_runs_the_base_rule_then_the_body():
    epi = {"input": "raw", "body": [{"op": "Add", "inputs": ["raw", "r"], "outputs": ["y"], "attrs": {}}]}
    g = graph([node("MatMul", ["a", "w", "r"], "y", domain=POLYKIT_DOMAIN, epilogue=epi, fused_from=[])],
              {"a": (2, 4, 3), "w": (3, 5), "r": (5,)}, ["y"])
    assert g.value("y").shape == (2, 4, 5)


def test_attention_shape_rule_rejects_mismatched_head_sizes():
    with pytest.raises(ShapeError, match="head sizes"):
        graph([_attn_node()], {"q": (2, 4, 8), "k": (2, 6, 7), "v": (2, 6, 8)}, ["o"])


def test_attention_shape_rule_broadcasts_batch_dims():
    g = graph([_attn_node(True)], {"q": (2, 3, 4, 8), "k": (1, 3, 6, 8), "v": (1, 3, 6, 5), "m": (2, 1, 4, 6)}, ["o"])
    assert g.value("o").shape == (2, 3, 4, 5)


def test_attention_reference_with_additive_mask_and_scale():
    q, k, v = (RNG.standard_normal(s).astype(np.float32) for s in [(2, 4, 8), (2, 6, 8), (2, 6, 5)])
    m = RNG.standard_normal((4, 6)).astype(np.float32)
    (out,) = run_reference(_attn_node(True, scale=0.3), [q, k, v, m])
    np.testing.assert_allclose(out, _attention(q, k, v, m, 0.3), rtol=1e-5, atol=1e-6)


def test_attention_reference_with_bool_keep_mask_and_default_scale():
    q, k, v = (RNG.standard_normal(s).astype(np.float32) for s in [(3, 8), (5, 8), (5, 2)])
    m = RNG.random((3, 5)) > 0.3
    m[:, 0] = True
    (out,) = run_reference(_attn_node(True), [q, k, v, m])
    np.testing.assert_allclose(out, _attention(q, k, v, m), rtol=1e-5, atol=1e-6)


def test_attention_nan_guard_turns_fully_masked_rows_to_zero():
    q, k, v = (RNG.standard_normal(s).astype(np.float32) for s in [(2, 4), (3, 4), (3, 4)])
    m = np.array([[True, True, False], [False, False, False]])
    (plain,) = run_reference(_attn_node(True), [q, k, v, m])
    (guarded,) = run_reference(_attn_node(True, nan_probs_to_zero=1), [q, k, v, m])
    assert np.isnan(plain[1]).all() and (guarded[1] == 0).all()
    np.testing.assert_allclose(guarded[0], plain[0])


def test_rename_fused_tensor_updates_inputs_and_body_and_moves_a_clashing_local():
    body = [{"op": "Neg", "inputs": ["x"], "outputs": ["t"], "attrs": {}},
            {"op": "Exp", "inputs": ["t"], "outputs": ["y"], "attrs": {}}]
    n = node("Pointwise", ["x"], "y", domain=POLYKIT_DOMAIN, body=body, fused_from=[])
    rename_fused_tensor(n, "x", "t")
    assert n.inputs == ["t"]
    assert n.attrs["body"][0]["inputs"] == ["t"]
    assert n.attrs["body"][0]["outputs"] == n.attrs["body"][1]["inputs"] != ["t"]

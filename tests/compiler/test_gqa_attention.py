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
from onnx import TensorProto, helper

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


def _run(plan, f):
    from polykit.runtime.engine import Runtime

    return Runtime().deserialize_engine(plan).create_execution_context().execute(f)["y"]


def _ort(model, f):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, f)[0]


@pytest.mark.parametrize("form,B,S,Hq,Hkv,D,mask", [
    ("expand", 1, 13, 12, 4, 64, "causal"), ("expand", 2, 77, 8, 1, 128, "additive"),
    ("tile", 2, 77, 12, 4, 64, "additive"), ("tile", 1, 13, 8, 1, 128, "causal"),
    ("expand", 2, 13, 12, 4, 128, None), ("tile", 1, 77, 6, 2, 64, "causal"),
    ("expand", 1, 13, 8, 8, 64, "causal"),  # Hq == Hkv: nothing repeated, nothing to fold
])
def test_cpu_plan_reads_k_and_v_un_repeated_and_matches_onnxruntime(form, B, S, Hq, Hkv, D, mask):
    model, f = gqa_block(form, B, S, Hq, Hkv, D, mask), gqa_feeds(B, S, Hq, D, mask)
    plan = build_plan(model, BuilderConfig(target="cpu"))
    np.testing.assert_allclose(_run(plan, f), _ort(model, f), rtol=1e-5, atol=1e-5)
    kinds = Counter(layer.kind for layer in plan.layers)
    assert not REPEAT & set(kinds), kinds
    (att,) = [layer for layer in plan.layers if layer.kind == "Attention"]
    assert att.attrs.get("kv_groups", 1) == Hq // Hkv
    assert plan.tensors[att.inputs[1]].shape[2 if att.attrs.get("k_layout") == "bshd" else 1] == Hkv


def test_a_repeat_that_interleaves_heads_stays_a_copy():
    """Unsqueeze(1) + Expand [B, g, Hkv, S, D]: query head h reads h % Hkv, no kv_groups."""
    model, f = gqa_block("interleaved", 1, 13, 12, 4, 64, "causal"), gqa_feeds(1, 13, 12, 64, "causal")
    plan = build_plan(model, BuilderConfig(target="cpu"))
    np.testing.assert_allclose(_run(plan, f), _ort(model, f), rtol=1e-5, atol=1e-5)
    (att,) = [layer for layer in plan.layers if layer.kind == "Attention"]
    assert "kv_groups" not in att.attrs
    assert Counter(layer.kind for layer in plan.layers)["Expand"] == 2


def test_a_repeat_read_elsewhere_stays_for_that_reader():
    model = gqa_block("expand", 1, 13, 12, 4, 64, "causal")
    model.graph.output.append(helper.make_tensor_value_info("kg", TensorProto.FLOAT, [1, 12, 13, 64]))
    f = gqa_feeds(1, 13, 12, 64, "causal")
    plan = build_plan(model, BuilderConfig(target="cpu"))
    (att,) = [layer for layer in plan.layers if layer.kind == "Attention"]
    assert att.attrs["kv_groups"] == 3 and "kg" not in att.inputs
    assert Counter(layer.kind for layer in plan.layers)["Expand"] == 1  # K's, for the output kg
    from polykit.runtime.engine import Runtime

    got = Runtime().deserialize_engine(plan).create_execution_context().execute(f)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(["y", "kg"], f)
    np.testing.assert_allclose(got["y"], want[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["kg"], want[1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("arch", [None, "sm_90"])
@pytest.mark.parametrize("Hq,Hkv,D", [(12, 4, 64), (8, 1, 128)])
def test_cuda_fp16_plan_keeps_no_repeat_and_runs_flash(form, arch, Hq, Hkv, D, monkeypatch):
    from polykit.runtime.cuda.driver import DeviceInfo

    gpu = None if arch is None else DeviceInfo(0, f"test GPU {arch}", arch, 132, 80 << 30, 227 * 1024)
    monkeypatch.setattr(builder_module, "build_device", lambda target, device=None: gpu)
    plan = build_plan(gqa_block(form, 1, 128, Hq, Hkv, D, "causal"),
                      BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0))
    kinds = Counter(layer.kind for layer in plan.layers)
    assert not REPEAT & set(kinds), kinds
    (att,) = [layer for layer in plan.layers if layer.kind == "Attention"]
    assert att.attrs["kv_groups"] == Hq // Hkv and att.tactic.startswith("cuda.attention.flash")


def test_kv_groups_that_do_not_fit_the_heads_are_a_plan_error_at_load():
    plan = build_plan(gqa_block("expand", 1, 13, 12, 4, 64, "causal"), BuilderConfig(target="cpu"))
    header, doc, blob = decode_plan(plan.serialize())
    for g, match in ((2, "Q has 12 heads, K 4: with kv_groups 2"), (-1, "kv_groups -1 is no integer")):
        edited = copy.deepcopy(doc)
        att = next(entry for entry in edited["layers"] if entry["kind"] == "Attention")
        att["attrs"]["kv_groups"] = g
        data = encode_plan(edited, bytes(blob), header["target"], header["gpu_arch"])
        with pytest.raises(PlanError, match=f"fails its op's shape rule: {match}"):
            Plan.deserialize(data, where="m.plan")


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("Hq,Hkv", [(12, 4), (8, 1)])
def test_dynamic_batch_and_sequence_fold_too_and_run_at_every_shape(form, Hq, Hkv):
    """B and S named dims (every shape constant 0 / -1): the heads and g are static, so the repeat
    still folds; the plan runs at shapes across its profile."""
    from polykit.compiler.plan.profiles import Profile

    D = 64
    model = gqa_block(form, 0, 0, Hq, Hkv, D, "additive", dynamic=True)
    profile = Profile({"x": ((1, 1, Hq * D), (2, 64, Hq * D), (3, 80, Hq * D)),
                       "m": ((1, 1, 1, 1), (2, 1, 1, 64), (3, 1, 1, 80))})
    plan = build_plan(model, BuilderConfig(target="cpu", profiles=[profile]))
    assert not REPEAT & {layer.kind for layer in plan.layers}
    (att,) = [layer for layer in plan.layers if layer.kind == "Attention"]
    assert att.attrs["kv_groups"] == Hq // Hkv
    from polykit.runtime.engine import Runtime

    ctx = Runtime().deserialize_engine(plan).create_execution_context()
    for B, S in ((1, 13), (3, 77)):
        f = gqa_feeds(B, S, Hq, D, "additive")
        np.testing.assert_allclose(ctx.execute(f)["y"], _ort(model, f), rtol=1e-5, atol=1e-5)
    cuda = build_plan(model, BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0, profiles=[profile]))
    assert not REPEAT & {layer.kind for layer in cuda.layers}
    assert [layer.tactic for layer in cuda.layers if layer.kind == "Attention"] == ["cuda.attention.flash"]

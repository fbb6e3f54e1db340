"""q, k, v selected out of one packed projection become strided views of it (fold_attention_layouts):
the four exporter forms of tests/compiler/packed_qkv_models.py, odd sequence lengths and head sizes,
causal and additive masks. The cpu plan against onnxruntime; the cuda fp16 plan (level 0, no GPU
needed) keeps no q/k/v copy; views are checked at plan load; the view algebra's corner cases."""

from __future__ import annotations

import copy
from collections import Counter

import numpy as np
import onnxruntime as ort
import pytest

from polykit.compiler.builder import builder as builder_module
from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Graph, Node, Value
from polykit.compiler.ops.nn.fused import OperandView, ViewError, operand_view
from polykit.compiler.passes import fold_attention_layouts
from polykit.compiler.passes.fold_attention_layouts import _reshape_strides
from polykit.compiler.plan.file import Plan, decode_plan, encode_plan
from polykit.errors import PlanError
from tests.compiler.packed_qkv_models import FORMS, feeds, packed_block

#: what may still sit between the projection and Attention: views only
COPIES = {"Transpose", "Gather", "Split", "Slice", "PermutedCopy"}


def _run(plan, f):
    from polykit.runtime.engine import Runtime

    return Runtime().deserialize_engine(plan).create_execution_context().execute(f)["y"]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("B,S,H,D,mask", [(1, 13, 3, 24, "causal"), (2, 13, 3, 24, "additive"),
                                          (1, 197, 2, 20, None), (2, 7, 5, 8, "causal")])
def test_cpu_plan_reads_q_k_v_from_the_packed_projection_and_matches_onnxruntime(form, B, S, H, D, mask):
    model, f = packed_block(form, B, S, H, D, mask), feeds(form, B, S, H, D, mask)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, f)[0]
    plan = build_plan(model, BuilderConfig(target="cpu"))
    got = _run(plan, f)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    kinds = Counter(layer.kind for layer in plan.layers)
    (att,) = [layer for layer in plan.layers if layer.kind == "Attention"]
    assert len(set(att.inputs[:3])) == 1, "Q, K and V read one packed tensor"
    assert all(att.attrs.get(a) is not None for a in ("q_view", "k_view", "v_view"))
    # torchvision at batch > 1 keeps its output's [B, H, S, D] -> [S, B, H, D] transpose (no out view)
    assert sum(kinds[k] for k in COPIES) == (1 if form == "torchvision" and B > 1 else 0), kinds


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("arch", [None, "sm_90"])
@pytest.mark.parametrize("B", [1, 2])
def test_cuda_fp16_plan_keeps_no_q_k_v_copy(form, arch, B, monkeypatch):
    from polykit.runtime.cuda.driver import DeviceInfo

    gpu = None if arch is None else DeviceInfo(0, f"test GPU {arch}", arch, 132, 80 << 30, 227 * 1024)
    monkeypatch.setattr(builder_module, "build_device", lambda target, device=None: gpu)
    S, H, D = 197, 3, 64
    plan = build_plan(packed_block(form, B, S, H, D, "causal"),
                      BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0))
    kinds = Counter(layer.kind for layer in plan.layers)
    assert sum(kinds[k] for k in COPIES) == 0, kinds
    if form == "torchvision" and B > 1:  # its output transpose is read by the closing Cast: a view there
        (cast,) = [layer for layer in plan.layers if layer.kind == "Pointwise"]
        assert cast.attrs.get("view"), cast.attrs
    (att,) = [layer for layer in plan.layers if layer.kind == "Attention"]
    assert att.tactic.startswith("cuda.attention.flash")
    if form == "torchvision" and B > 1:  # its views do not nest as a TMA map wants: the mma.sync kernel
        assert att.tactic == "cuda.attention.flash"


def test_a_view_past_its_tensor_is_a_plan_error_at_load():
    plan = build_plan(packed_block("vit", 1, 13, 3, 24, "causal"), BuilderConfig(target="cpu"))
    header, doc, blob = decode_plan(plan.serialize())
    doc = copy.deepcopy(doc)
    att = next(entry for entry in doc["layers"] if entry["kind"] == "Attention")
    att["attrs"]["v_view"][0] += 72  # V's offset one third further: past the projection's end
    data = encode_plan(doc, bytes(blob), header["target"], header["gpu_arch"])
    with pytest.raises(PlanError, match=r"fails its op's shape rule: v_view of input 2: .*past the"):
        Plan.deserialize(data, where="m.plan")


@pytest.mark.parametrize("raw,match", [
    ([0, 2, 8, 1, 8], "last .* axis must be contiguous"),
    ([0, 2, 8], "a view is"),
    ([-1, 2, 8, 8, 1], "offset -1"),
    ([0, 2, 8, 8, True], "not a list of integers"),
])
def test_malformed_views_are_refused(raw, match):
    with pytest.raises(ViewError, match=match):
        operand_view({"q_view": raw}, 0, (64,))


def test_a_view_and_a_layout_on_one_input_are_refused():
    with pytest.raises(ViewError, match="both a view and layout"):
        operand_view({"k_view": [0, 2, 4, 8, 1], "k_layout": "bshd"}, 1, (2, 4, 1, 8))
    assert operand_view({"k_layout": "bshd"}, 1, (2, 5, 3, 8)) == OperandView(0, (2, 3, 5, 8), (120, 8, 24, 1))


@pytest.mark.parametrize("old,strides,new,want", [
    ((6, 4), (4, 1), (2, 3, 4), (12, 4, 1)),           # split a contiguous axis
    ((2, 3, 4), (12, 4, 1), (6, 4), (4, 1)),           # merge contiguous axes
    ((2, 3, 4), (1, 8, 2), (6, 4), None),              # merge axes that are not contiguous together
    ((3, 8), (24, 1), (3, 2, 4), (24, 4, 1)),          # a row of a wider tensor: split its inner axis
    ((1, 5, 1, 8), (0, 8, 0, 1), (5, 1, 8, 1), (8, 0, 1, 0)),  # size-1 dims anywhere
])
def test_reshape_of_a_strided_view(old, strides, new, want):
    assert _reshape_strides(list(old), list(strides), list(new)) == want


def _attention_graph(index_const: bool) -> Graph:
    """qkv [3, 2, 5, 8] -> Gather(i) -> q, k, v; the index a constant or a graph input."""
    nodes = [Node("Gather", ["qkv", f"i{n}"], [n], {"axis": 0}, name=f"g{n}") for n in "qkv"]
    nodes.append(Node("Attention", ["q", "k", "v"], ["y"], {}, name="att", domain=POLYKIT_DOMAIN))
    inits = {f"i{n}": np.array(i, np.int64) for i, n in enumerate("qkv")} if index_const else {}
    values = {"qkv": Value("qkv", np.dtype(np.float32), (3, 2, 5, 8)),
              **{n: Value(n, np.dtype(np.float32), (2, 5, 8)) for n in "qkv"},
              "y": Value("y", np.dtype(np.float32), (2, 5, 8))}
    inputs = ["qkv"] + ([] if index_const else [f"i{n}" for n in "qkv"])
    for n in "qkv":
        values.setdefault(f"i{n}", Value(f"i{n}", np.dtype(np.int64), ()))
    return Graph(nodes, inputs, ["y"], inits, values)


def test_a_gather_by_a_constant_becomes_a_view_and_by_a_tensor_stays():
    g = _attention_graph(True)
    assert fold_attention_layouts(g)
    att = g.nodes[-1]
    assert att.inputs == ["qkv"] * 3
    assert [att.attrs[a] for a in ("q_view", "k_view", "v_view")] == [[i * 80, 2, 5, 8, 40, 8, 1] for i in range(3)]
    g = _attention_graph(False)
    assert not fold_attention_layouts(g)
    assert g.nodes[-1].inputs == ["q", "k", "v"]

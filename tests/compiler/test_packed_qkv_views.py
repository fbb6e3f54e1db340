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
from polykit.compiler.passes.fold_attention_layouts import _reshape_strides, view_of_transposed
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


def _random_view(rng, shape):
    """A view of a tensor of `shape`: per axis a strided window (sometimes split in two view axes),
    the view axes shuffled, the last one contiguous; or (one in four) random strides."""
    full = [int(np.prod(shape[a + 1:])) for a in range(len(shape))]
    if rng.random() < 0.25:
        dims = tuple(int(d) for d in rng.integers(1, 4, size=3))
        strides = tuple(int(s) for s in rng.integers(0, int(np.prod(shape)), size=2)) + (1,)
        return OperandView(0, dims, strides)
    offset, axes = 0, []
    for a, n in enumerate(shape):
        count = int(rng.integers(1, n + 1))
        step = int(rng.integers(1, max(1, (n - 1) // max(count - 1, 1)) + 1))
        start = int(rng.integers(0, n - step * (count - 1)))
        offset += start * full[a]
        if count % 2 == 0 and rng.random() < 0.5:  # split: [2, count / 2]
            axes += [(2, step * count // 2 * full[a]), (count // 2, step * full[a])]
        else:
            axes.append((count, step * full[a]))
    last = axes.pop()
    order = rng.permutation(len(axes))
    axes = [axes[i] for i in order] + [(last[0], 1) if last[1] == 1 else (1, 0)]
    return OperandView(offset, tuple(d for d, _ in axes), tuple(s for _, s in axes))


def test_view_of_a_transpose_reads_the_same_elements_of_its_source():
    rng = np.random.default_rng(11)
    answered = refused = 0
    for _ in range(400):
        src_shape = tuple(int(d) for d in rng.integers(1, 6, size=int(rng.integers(2, 5))))
        perm = [int(p) for p in rng.permutation(len(src_shape))]
        src = np.arange(int(np.prod(src_shape))).reshape(src_shape)
        old = src.transpose(perm)
        view = _random_view(rng, old.shape)
        if view.last_element() >= old.size:
            continue
        moved = view_of_transposed(view, old.shape, perm)
        if moved is None:
            refused += 1
            continue
        answered += 1
        want = np.lib.stride_tricks.as_strided(old.ravel()[view.offset:], view.shape,
                                               [s * old.itemsize for s in view.strides])
        got = np.lib.stride_tricks.as_strided(src.ravel()[moved.offset:], moved.shape,
                                              [s * src.itemsize for s in moved.strides])
        np.testing.assert_array_equal(got, want)
        assert moved.shape[-1] == 1 or moved.strides[-1] == 1
    assert answered > 150 and refused > 20  # both sides exercised


def test_view_of_torchvisions_transposed_projection():
    """q of a [S, B, 3E] projection (B = 8, S = 197, E = 768, 12 heads) that is transpose([B, S, 3E])."""
    q = OperandView(0, (8, 12, 197, 64), (2304, 64, 18432, 1))
    assert view_of_transposed(q, (197, 8, 2304), [1, 0, 2]) == OperandView(0, (8, 12, 197, 64),
                                                                            (453888, 64, 2304, 1))
    k = OperandView(768, (8, 12, 197, 64), (2304, 64, 18432, 1))
    assert view_of_transposed(k, (197, 8, 2304), [1, 0, 2]).offset == 768
    # a head axis that steps across two rows of [S, B, 3E] is no single view of [B, S, 3E]
    assert view_of_transposed(OperandView(0, (8, 4, 64), (2304, 1152, 1)), (197, 8, 2304), [1, 0, 2]) is None


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

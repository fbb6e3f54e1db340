"""absorb_views: a Transpose / PermutedCopy read only by elementwise layers becomes a view in each
reader; the rewritten graph computes what the original did (reference evaluator), the cpu plans
what onnxruntime does, and the cuda fp16 plan (level 0) has no copy left where every reader is
elementwise (and keeps it where one is not, or where the view would read the innermost dim
strided)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnxruntime as ort
import pytest

from .passes_testkit import graph, node, op_counts, run_and_compare
from .view_models import MODELS, STAYS

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.graph.infer import infer_shapes
from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.ops.nn.view_operands import fit_view, view_index, view_operands
from polykit.compiler.passes import absorb_views, fuse_pointwise
from polykit.compiler.plan.check import check_layers
from polykit.errors import NodeAttributeError, PlanError
from polykit.runtime.engine import Runtime

PW = f"{POLYKIT_DOMAIN}:Pointwise"
COPY = f"{POLYKIT_DOMAIN}:PermutedCopy"


def _fuse_and_absorb(g):
    return fuse_pointwise(g) | absorb_views(g)


# ---- graph level ------------------------------------------------------------------------------
def test_a_transpose_read_by_one_add_becomes_a_one_step_pointwise_view_in_the_documented_format():
    g = graph([node("Transpose", ["x"], "t", perm=[0, 2, 1, 3]), node("Add", ["t", "r"], "y")],
              {"x": (2, 3, 5, 4), "r": (2, 5, 3, 4)}, ["y"])
    out, changed = run_and_compare(g, absorb_views)
    (pw,) = out.nodes
    assert changed and op_counts(out) == {PW: 1}
    assert pw.inputs == ["x", "r"] and pw.attrs["body"][0]["inputs"] == ["t", "r"]  # the body reads the view by name
    assert pw.attrs["view"] == [{"name": "t", "input": 0, "offset": 0, "dims": [
        {"shift": 0, "pieces": [[2, 60]]}, {"shift": 0, "pieces": [[5, 4]]}, {"shift": 0, "pieces": [[3, 20]]},
        {"shift": 0, "pieces": [[4, 1]]}]}]


def _merge_nodes(nh, nw, wh, ww, c):
    return [node("Reshape", ["win", "s6"], "w6"), node("Transpose", ["w6"], "wt", perm=[0, 1, 3, 2, 4, 5]),
            node("Reshape", ["wt", "s4"], "merged")], {"s6": np.array([1, nh, nw, wh, ww, c], np.int64),
                                                        "s4": np.array([1, nh * wh, nw * ww, c], np.int64)}


def test_a_window_merge_splits_each_spatial_dim_into_window_and_position_pieces():
    nh, nw, wh, ww, c = 2, 3, 3, 5, 6
    nodes, consts = _merge_nodes(nh, nw, wh, ww, c)
    g = graph(nodes + [node("Add", ["res", "merged"], "y")],
              {"win": (nh * nw, wh, ww, c), "res": (1, nh * wh, nw * ww, c)}, ["y"], consts)
    out, _ = run_and_compare(g, absorb_views)
    (pw,) = [n for n in out.nodes if n.op_type == "Pointwise"]
    assert "Transpose" not in op_counts(out)
    (entry,) = pw.attrs["view"]
    assert pw.inputs[entry["input"]] == "win"  # read above the first Reshape: the same elements
    assert [d["pieces"] for d in entry["dims"][1:3]] == [[[nh, nw * wh * ww * c], [wh, ww * c]],
                                                        [[nw, wh * ww * c], [ww, c]]]


def test_a_shifted_window_merge_shifts_before_it_splits():
    """A PermutedCopy doing the merge and the roll back (fuse_movement's form): the shift wraps the
    whole spatial dim, then the dim splits into window and position."""
    nh, nw, wh, ww, c = 2, 2, 3, 3, 4
    h, w = nh * wh, nw * ww
    copy = node("PermutedCopy", ["win"], "merged", domain=POLYKIT_DOMAIN, view=[1, nh, nw, wh, ww, c],
                perm=[0, 1, 3, 2, 4, 5], shape=[1, h, w, c], out_shifts=[0, 1, 1, 0])
    g = graph([copy, node("Add", ["res", "merged"], "y")], {"win": (nh * nw, wh, ww, c), "res": (1, h, w, c)}, ["y"])
    out, _ = run_and_compare(g, absorb_views)
    assert op_counts(out) == {PW: 1}
    dims = out.nodes[0].attrs["view"][0]["dims"]
    assert [d["shift"] for d in dims] == [0, h - 1, w - 1, 0]  # out[i] = merged[i - 1]: index i + (n - 1)
    assert dims[1]["pieces"] == [[nh, nw * wh * ww * c], [wh, ww * c]]


def test_rotate_half_of_a_transposed_query_composes_with_the_transpose():
    """RoPE: a Pointwise node reads the transposed query and its roll on the last axis (a
    PermutedCopy of the Transpose); both copies go, the node reads x through two views."""
    s, h, d = 5, 3, 8
    nodes = [node("Transpose", ["x"], "q", perm=[0, 2, 1, 3]),
             node("PermutedCopy", ["q"], "rot", domain=POLYKIT_DOMAIN, starts=[0, 0, 0, d // 2], shape=[1, h, s, d]),
             node("Mul", ["q", "cos"], "a"), node("Mul", ["rot", "sin"], "b"), node("Add", ["a", "b"], "y")]
    g = graph(nodes, {"x": (1, s, h, d), "cos": (1, 1, s, d), "sin": (1, 1, s, d)}, ["y"])
    out, _ = run_and_compare(g, _fuse_and_absorb)
    (pw,) = out.nodes
    assert op_counts(out) == {PW: 1}
    views = {e["name"]: e for e in pw.attrs["view"]}
    assert set(views) == {"q", "rot"} and all(pw.inputs[e["input"]] == "x" for e in views.values())
    assert [dim["shift"] for dim in views["rot"]["dims"]] == [0, 0, 0, d // 2]
    assert [dim["pieces"] for dim in views["q"]["dims"]] == [[[1, 0]], [[h, d]], [[s, h * d]], [[d, 1]]]


def test_a_copy_behind_a_reshape_is_read_through_it():
    g = graph([node("Transpose", ["x"], "t", perm=[1, 0, 2]), node("Reshape", ["t", "s"], "flat"),
               node("Mul", ["flat", "r"], "y")], {"x": (3, 4, 5), "r": (4, 15)}, ["y"],
              {"s": np.array([4, 15], np.int64)})
    out, _ = run_and_compare(g, absorb_views)
    assert op_counts(out) == {PW: 1}
    (entry,) = out.nodes[0].attrs["view"]
    assert entry["name"] == "flat" and entry["dims"][1]["pieces"] == [[3, 20], [5, 1]]


@pytest.mark.parametrize("why", ["second_reader", "output", "strided_inner", "int"])
def test_copies_that_stay(why):
    dtype = np.int64 if why == "int" else np.float32
    perm = [0, 2, 1] if why == "strided_inner" else [1, 0, 2]
    nodes = [node("Transpose", ["x"], "t", perm=perm), node("Add", ["t", "t"], "y")]
    outputs = ["y", "t"] if why == "output" else ["y"]
    if why == "second_reader":
        nodes.append(node("ReduceSum", ["t"], "z", keepdims=1))
        outputs = ["y", "z"]
    g = graph(nodes, {"x": ((3, 4, 5), dtype)}, outputs)
    out, changed = run_and_compare(g, absorb_views)
    assert not changed and op_counts(out)["Transpose"] == 1 and PW not in op_counts(out)


def test_a_repeated_plain_read_keeps_one_position():
    g = graph([node("Transpose", ["x"], "t", perm=[1, 0, 2]), node("Mul", ["t", "t"], "m"), node("Sub", ["m", "x2"], "y")],
              {"x": (3, 4, 5), "x2": (4, 3, 5)}, ["y"])
    out, _ = run_and_compare(g, _fuse_and_absorb)
    (pw,) = out.nodes
    assert pw.inputs == ["x", "x2"] and len(pw.attrs["view"]) == 1


# ---- the attribute: fitting, validation ---------------------------------------------------------
def test_fit_view_refuses_what_no_shift_and_pieces_give():
    assert fit_view(np.array([[0, 2], [1, 3]]), "v", 0) is None  # innermost stride 2 (a transpose)
    assert fit_view(np.array([0, 2, 1, 3]), "v", 0) is None  # no mixed radix
    rolled = np.roll(np.arange(12).reshape(3, 4), 1, axis=1)
    entry = fit_view(rolled, "v", 0)
    assert entry["dims"][1] == {"shift": 3, "pieces": [[4, 1]]} and np.array_equal(view_index(entry), rolled)


def _entry(**change):
    e = {"name": "v", "input": 0, "offset": 0, "dims": [{"shift": 0, "pieces": [[3, 4]]}, {"shift": 0, "pieces": [[4, 1]]}]}
    return dict(e, **change)


@pytest.mark.parametrize("bad", [
    [_entry(input=2)], [_entry(offset=-1)], [_entry(dims=[])],
    [_entry(dims=[{"shift": 3, "pieces": [[3, 4]]}, {"shift": 0, "pieces": [[4, 1]]}])],  # shift past the extent
    [_entry(dims=[{"shift": 0, "pieces": [[4, 3]]}, {"shift": 0, "pieces": [[3, 4]]}])],  # innermost strided
    [_entry(dims=[{"shift": 1, "pieces": [[2, 30], [2, 12], [3, 4]]}, {"shift": 0, "pieces": [[4, 1]]}])],
    [_entry(), _entry()], "nope"])
def test_malformed_view_attributes_are_node_attribute_errors(bad):
    with pytest.raises(NodeAttributeError):
        view_operands({"view": bad}, 2, "node x")


def test_a_view_past_its_source_fails_the_shape_rule():
    g = graph([node("Transpose", ["x"], "t", perm=[1, 0, 2]), node("Add", ["t", "r"], "y")],
              {"x": (3, 4, 5), "r": (4, 3, 5)}, ["y"])
    absorb_views(g)
    g.nodes[0].attrs["view"][0]["offset"] = 1  # its last element is now 60, past x's 60
    with pytest.raises(NodeAttributeError, match="past the 60 elements"):
        infer_shapes(g, strict=True)


def test_a_plan_whose_view_reads_past_its_source_does_not_load():
    plan = build_plan(MODELS["transpose_add"](), BuilderConfig(target="cpu"))
    (layer,) = [l for l in plan.layers if l.attrs.get("view")]
    check_layers(plan)  # as built: valid
    layer.attrs["view"][0]["dims"][0]["pieces"][0][1] += 1  # a stride one too large
    with pytest.raises(PlanError, match="past the"):
        check_layers(plan)


# ---- models: cpu plans vs onnxruntime, the cuda plans' layers -----------------------------------
def _feeds(model):
    rng = np.random.default_rng(7)
    return {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
            for i in model.graph.input}


@pytest.mark.parametrize("name", sorted(MODELS) + sorted(STAYS))
def test_cpu_plan_matches_onnxruntime(name):
    model = {**MODELS, **STAYS}[name]()
    feeds = _feeds(model)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    plan = build_plan(model, BuilderConfig(target="cpu"))
    assert any(l.attrs.get("view") for l in plan.layers) == (name in MODELS)
    ctx = Runtime().deserialize_engine(plan.serialize()).create_execution_context()  # views survive the file
    got = ctx.execute(feeds)
    np.testing.assert_allclose(got[plan.outputs[0]], want[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_cuda_plans_keep_no_copy_where_every_reader_is_elementwise(name):
    plan = build_plan(MODELS[name](), BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0))
    kinds = Counter(l.kind for l in plan.layers)
    assert not {"Transpose", "PermutedCopy", "Reshape", "Concat", "Slice"} & set(kinds)
    (pw,) = [l for l in plan.layers if l.attrs.get("view")]
    assert pw.tactic == "cuda.pointwise"  # the row tactic refuses views


@pytest.mark.parametrize("name", sorted(STAYS))
def test_cuda_plans_keep_the_copy_a_reduction_or_a_strided_view_needs(name):
    plan = build_plan(STAYS[name](), BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0))
    assert Counter(l.kind for l in plan.layers)["Transpose"] == 1
    assert not any(l.attrs.get("view") for l in plan.layers)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(MODELS))
def test_cuda_fp16_plan_matches_the_cpu(name):
    model = MODELS[name]()
    feeds = _feeds(model)

    def run(plan):
        return Runtime().deserialize_engine(plan.serialize()).create_execution_context().execute(feeds)

    want = run(build_plan(model, BuilderConfig(target="cpu")))
    got = run(build_plan(model, BuilderConfig(target="cuda", fp16=True)))
    for key, w in want.items():
        assert np.linalg.norm(got[key] - w) / np.linalg.norm(w) < 1e-2, key


# ---- Split (pack_gemms' packed projections) -----------------------------------------------------
def _split_graph(reader: str = "Mul"):
    """p [2, 5, 20] -> Split(last axis: 6, 6, 8) -> SiLU-like Mul(a, Sigmoid(a)) * b over the first two
    pieces (one through a Reshape and back), the third unread; a dead Reshape of a on the side."""
    nodes = [node("Split", ["p", "sizes"], ["a", "b", "c"], axis=2), node("Reshape", ["a", "s3"], "a3"),
             node("Reshape", ["a3", "s1"], "a1"), node("Reshape", ["a", "s3"], "dead"),
             node("Sigmoid", ["a1"], "sa"), node("Mul", ["a1", "sa"], "silu")]
    if reader == "MatMul":  # b read by a GEMM (its A operand): no view there
        nodes += [node("MatMul", ["b", "w"], "bw"), node("Mul", ["silu", "bw"], "y")]
    else:
        nodes.append(node("Mul", ["silu", "b"], "y"))
    consts = {"sizes": np.array([6, 6, 8], np.int64), "s3": np.array([2, 5, 2, 3], np.int64),
              "s1": np.array([2, 5, 6], np.int64), "w": np.ones((6, 6), np.float32)}
    return graph(nodes, {"p": (2, 5, 20)}, ["y"], consts)


def test_a_split_read_only_by_elementwise_layers_becomes_column_views_of_its_source():
    out, changed = run_and_compare(_split_graph(), _fuse_and_absorb)
    assert changed and op_counts(out) == {PW: 1}, op_counts(out)
    (pw,) = out.nodes
    assert set(pw.inputs) == {"p"}
    offsets = sorted(e["offset"] for e in pw.attrs["view"])
    assert offsets == [0, 6]  # piece a at column 0, piece b at column 6, rows of 20
    assert all(e["dims"][-1]["pieces"] == [[6, 1]] and e["dims"][-2]["pieces"] == [[5, 20]] for e in pw.attrs["view"])


def test_a_split_with_a_reader_that_is_not_elementwise_stays():
    out, _ = run_and_compare(_split_graph("MatMul"), _fuse_and_absorb)
    assert op_counts(out)["Split"] == 1

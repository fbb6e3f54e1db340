"""Data-dependent dims (NonZero, NonMaxSuppression, TopK over a filtered count) in the patterns
detectors export: nested filters bound in order, dims one count decides broadcasting together
(in the graph and inside an If body), slices and TopK k of a filtered count, and comparisons of a
filtered count left to the run. Each model is a small onnx.helper graph built for the cpu target
and checked against onnxruntime on inputs that keep none, some and all elements."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.ir.symbolic import Expr
from polykit.compiler.plan.file import Plan
from polykit.errors import BuildError, PlanError
from polykit.runtime.engine import Runtime

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _const(name, values, dtype=F, dims=None):
    values = np.asarray(values).reshape(-1).tolist()
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(name, dtype, dims or [], values))


def _model(nodes, inputs, outputs):
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [helper.make_tensor_value_info(n, t, None) for n, t in outputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _filter(x, threshold, out, tag):
    """Nodes keeping the elements of 1-D float `x` above `threshold` as `out` (NonZero -> Gather)."""
    return [_const(f"{tag}_t", threshold), helper.make_node("Greater", [x, f"{tag}_t"], [f"{tag}_m"]),
            helper.make_node("NonZero", [f"{tag}_m"], [f"{tag}_nz"]), _const(f"{tag}_ax", [0], I64, [1]),
            helper.make_node("Squeeze", [f"{tag}_nz", f"{tag}_ax"], [f"{tag}_idx"]),
            helper.make_node("Gather", [x, f"{tag}_idx"], [out], axis=0)]


def _check(model, feeds_list, target="cpu"):
    """Build `model` for `target` (once), run every feed set twice, compare with onnxruntime
    (same shapes, same values); the plan."""
    plan = Plan.deserialize(build_plan(model, BuilderConfig(target=target)).serialize())
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    with Runtime().deserialize_engine(plan) as engine, engine.create_execution_context() as ctx:
        for _ in range(2):
            for feeds in feeds_list:
                want = dict(zip(names, sess.run(None, feeds)))
                got = ctx.execute(feeds)
                for name, ref in want.items():
                    assert got[name].shape == ref.shape, (name, got[name].shape, ref.shape)
                    np.testing.assert_allclose(got[name], ref, rtol=1e-6, atol=1e-6, err_msg=name)
    return plan


def _vectors(n, seed=0):
    """1-D inputs with no, some and every element above 0 and above 0.5."""
    rng = np.random.default_rng(seed)
    return [np.full(n, -1.0, np.float32), rng.standard_normal(n).astype(np.float32),
            rng.uniform(1.0, 2.0, n).astype(np.float32)]


# ---- cause 4: a filter over a filtered tensor --------------------------------------------------------
def nested_filter():
    """x -> keep x > 0 -> of those keep > 0.5 -> y; Shape(y) as a second output."""
    nodes = _filter("x", 0.0, "pos", "a") + _filter("pos", 0.5, "y", "b") + [helper.make_node("Shape", ["y"], ["n"])]
    return _model(nodes, [("x", F, [12])], [("y", F), ("n", I64)])


def test_a_filter_over_a_filtered_tensor_is_bound_in_order():
    plan = _check(nested_filter(), [{"x": x} for x in _vectors(12)])
    outer, inner = "data(a_nz)[1]", "data(b_nz)[1]"
    assert plan.profiles.data[outer] == 12
    assert isinstance(plan.profiles.data[inner], Expr) and outer in plan.profiles.data[inner].symbols()


def test_a_nested_bound_reserves_the_outer_bound():
    plan = build_plan(nested_filter(), BuilderConfig(target="cpu"))
    assert plan.tensors["y"].nbytes == 12 * 4  # the inner count is at most the outer one, at most 12


@pytest.mark.parametrize("bound, what", [("data(b_nz)[1]", "names itself through other data symbols"),
                                          ("data(c)[0]", "is not a dim of an engine input")])
def test_a_crafted_nested_bound_is_refused(bound, what):
    """A plan whose data bounds name each other in a cycle, or a data symbol it does not have, is
    refused by the plan check."""
    from tests.compiler.test_plan_check import edited

    def edit(doc):
        doc["profiles"]["data"]["data(a_nz)[1]"] = bound

    with pytest.raises(PlanError) as err:
        Plan.deserialize(edited(build_plan(nested_filter(), BuilderConfig(target="cpu")).serialize(), edit))
    assert "profiles.data" in err.value.what and what in err.value.what


# ---- cause 5: dims one filtered count decides ------------------------------------------------------
def boxes_and_offsets(inside_if, most=100):
    """torchvision's batched_nms coordinate trick over the boxes whose score passes a threshold:
    boxes (n, 4) + (labels * (max + 1))[:, None], NonMaxSuppression, boxes[keep]; `inside_if`:
    under `if boxes.numel() == 0: empty else: ...` as the exporter writes it; `most`: NMS's
    max_output_boxes_per_class."""
    nodes = _filter("scores", 0.3, "kept_scores", "s") + [
        helper.make_node("Gather", ["boxes", "s_idx"], ["kept_boxes"], axis=0),
        helper.make_node("Gather", ["labels", "s_idx"], ["kept_labels"], axis=0)]
    body = [helper.make_node("ReduceMax", ["kept_boxes"], ["top"], keepdims=0), _const("one", 1.0),
            helper.make_node("Add", ["top", "one"], ["span"]), helper.make_node("Cast", ["kept_labels"], ["lf"], to=F),
            helper.make_node("Mul", ["lf", "span"], ["offsets"]), _const("ax1", [1], I64, [1]),
            helper.make_node("Unsqueeze", ["offsets", "ax1"], ["col"]),
            helper.make_node("Add", ["kept_boxes", "col"], ["shifted"]), _const("ax0", [0], I64, [1]),
            helper.make_node("Unsqueeze", ["shifted", "ax0"], ["b3"]),
            helper.make_node("Unsqueeze", ["kept_scores", "ax0"], ["s2"]),
            helper.make_node("Unsqueeze", ["s2", "ax0"], ["s3"]), _const("most", [most], I64, [1]),
            _const("iou", [0.5], F, [1]),
            helper.make_node("NonMaxSuppression", ["b3", "s3", "most", "iou"], ["sel"]), _const("col2", 2, I64),
            helper.make_node("Gather", ["sel", "col2"], ["keep"], axis=1)]
    if inside_if:
        then = helper.make_graph([_const("empty", [], I64, [0])], "then", [],
                                 [helper.make_tensor_value_info("empty", I64, None)])
        other = helper.make_graph(body, "else", [], [helper.make_tensor_value_info("keep", I64, None)])
        body = [helper.make_node("Shape", ["kept_boxes"], ["shape"]),
                helper.make_node("ReduceProd", ["shape"], ["numel"], keepdims=0), _const("zero", 0, I64),
                helper.make_node("Equal", ["numel", "zero"], ["none"]),
                helper.make_node("If", ["none"], ["keep_if"], then_branch=then, else_branch=other)]
    keep = "keep_if" if inside_if else "keep"
    nodes += body + [helper.make_node("Gather", ["kept_boxes", keep], ["out_boxes"], axis=0),
                     helper.make_node("Gather", ["kept_labels", keep], ["out_labels"], axis=0)]
    return _model(nodes, [("boxes", F, [16, 4]), ("scores", F, [16]), ("labels", I64, [16])],
                  [("out_boxes", F), ("out_labels", I64)])


def _detections(kept, seed):
    """16 boxes in 3 classes, about `kept` of them scoring above 0.3, several overlapping."""
    rng = np.random.default_rng(seed)
    corner = rng.uniform(0, 20, (16, 2)).astype(np.float32)
    boxes = np.concatenate([corner, corner + rng.uniform(4, 10, (16, 2)).astype(np.float32)], axis=1)
    scores = np.where(rng.random(16) < kept, rng.uniform(0.35, 1.0, 16), rng.uniform(0, 0.25, 16)).astype(np.float32)
    return {"boxes": boxes, "scores": scores, "labels": rng.integers(0, 3, 16).astype(np.int64)}


@pytest.mark.parametrize("inside_if", [False, True], ids=["graph", "if_body"])
def test_dims_one_filtered_count_decides_broadcast_together(inside_if):
    _check(boxes_and_offsets(inside_if), [_detections(k, s) for s, k in enumerate((0.0, 0.3, 0.7, 1.0))])


def test_nms_without_a_box_limit_bounds_its_count_by_the_boxes_and_the_plan_loads():
    """torchvision's batched_nms passes max_output_boxes_per_class = sys.maxsize: the count's bound is
    the kept boxes' count, not min(count, 2**63 - 1), a constant no plan holds (the plan failed to load)."""
    plan = _check(boxes_and_offsets(True, most=2 ** 63 - 1), [_detections(k, s) for s, k in enumerate((0.0, 0.7))])
    bounds = [str(b) for layer in plan.layers if layer.kind == "If"
              for branch in ("then_branch", "else_branch") if getattr(layer.attrs.get(branch), "profiles", None)
              for b in layer.attrs[branch].profiles.data.values()]
    assert bounds and not any("9223372036854775807" in b for b in bounds)


def test_a_filtered_count_compared_to_zero_is_left_to_the_run():
    """`numel == 0` of a filtered tensor is not decided at the count's bound: the then branch
    (no boxes kept) runs when the count is 0."""
    plan = _check(boxes_and_offsets(True), [_detections(0.0, 9), _detections(1.0, 9)])
    assert any(layer.kind == "If" for layer in plan.layers)


def test_a_body_whose_inputs_cannot_broadcast_names_no_profile():
    """Two counts that are not one (boxes kept by one threshold, offsets by another) cannot be
    added: the static build's error speaks of the sizes the If may give its body, not of a
    profile nobody gave."""
    nodes = _filter("scores", 0.3, "a", "s") + _filter("scores", 0.6, "b", "t") + [
        helper.make_node("Gather", ["boxes", "s_idx"], ["kept_boxes"], axis=0), _const("ax1", [1], I64, [1]),
        helper.make_node("Unsqueeze", ["b", "ax1"], ["col"])]
    other = helper.make_graph([helper.make_node("Add", ["kept_boxes", "col"], ["sum"])], "else", [],
                              [helper.make_tensor_value_info("sum", F, None)])
    then = helper.make_graph([helper.make_node("Identity", ["kept_boxes"], ["same"])], "then", [],
                             [helper.make_tensor_value_info("same", F, None)])
    nodes += [helper.make_node("If", ["flag"], ["out"], then_branch=then, else_branch=other)]
    model = _model(nodes, [("boxes", F, [16, 4]), ("scores", F, [16]), ("flag", B, [])], [("out", F)])
    with pytest.raises(BuildError) as info:
        build_plan(model, BuilderConfig(target="cpu"))
    assert "profile" not in info.value.what and "when the body's inputs have the sizes" in info.value.what
    assert "cannot broadcast" in info.value.what


def unknown_count_in_two_shapes():
    """A NonZero over a vector whose length no expression gives (a Resize by a scale computed in floats
    from the input's size, as detectors' transforms do): its count is a named dim. It reaches an If
    body as the length of the kept values (n,) and of their boxes (n, 4), whose element budgets give
    them different bounds."""
    nodes = [helper.make_node("Shape", ["x"], ["xs"]), _const("last", [2], I64, [1]),
             helper.make_node("Gather", ["xs", "last"], ["n"], axis=0), helper.make_node("Cast", ["n"], ["nf"], to=F),
             _const("sixteen", [16.0], F, [1]), helper.make_node("Div", ["sixteen", "nf"], ["q"]),
             helper.make_node("Ceil", ["q"], ["s"]), _const("ones", [1.0, 1.0], F, [2]),
             helper.make_node("Concat", ["ones", "s"], ["scales"], axis=0),
             helper.make_node("Resize", ["x", "", "scales"], ["xr"], mode="nearest"), _const("flat", [-1], I64, [1]),
             helper.make_node("Reshape", ["xr", "flat"], ["rf"]), _const("ax1", [1], I64, [1]),
             helper.make_node("Unsqueeze", ["rf", "ax1"], ["col"]), _const("four", np.arange(4), F, [1, 4]),
             helper.make_node("Add", ["col", "four"], ["boxes"])] + _filter("rf", 0.5, "kept", "k") + [
             helper.make_node("Gather", ["boxes", "k_idx"], ["kept_boxes"], axis=0)]
    other = helper.make_graph([helper.make_node("Unsqueeze", ["kept", "ax1"], ["kcol"]),
                               helper.make_node("Add", ["kept_boxes", "kcol"], ["sum"])], "else", [],
                              [helper.make_tensor_value_info("sum", F, None)])
    then = helper.make_graph([helper.make_node("Identity", ["kept_boxes"], ["same"])], "then", [],
                             [helper.make_tensor_value_info("same", F, None)])
    nodes += [helper.make_node("If", ["flag"], ["out"], then_branch=then, else_branch=other)]
    return _model(nodes, [("x", F, [1, 1, 6]), ("flag", B, [])], [("out", F)])


def test_a_named_count_reaching_a_body_twice_gets_one_range():
    """The body's profile gives the two inputs' count one symbol over the narrower range (it was
    (0, 1, 2**20) for one and (0, 1, 2**18) for the other, a BuildError speaking of "profile 0")."""
    from polykit.compiler.builder.bodies import body_profile
    from polykit.compiler.graph.infer import infer_shapes
    from polykit.compiler.graph.onnx_import import load_onnx
    from polykit.compiler.plan.profiles import profile_set

    g = load_onnx(unknown_count_in_two_shapes())
    infer_shapes(g, strict=False)
    node = next(n for n in g.nodes if n.op_type == "If")
    body = node.attrs["else_branch"]
    count = body.value("kept").shape[0]
    assert isinstance(count, str) and body.value("kept_boxes").shape == (count, 4)
    static, profiles = body_profile(body, node, "else_branch", {})
    bound = (1 << 20) // 4
    assert profiles[0].shapes == {"kept": ((0,), (1,), (bound,)), "kept_boxes": ((0, 4), (1, 4), (bound, 4))}
    made = profile_set(body, profiles, static)
    assert made.ranges == ({count: (0, 1, bound)},)
    assert made.inputs["kept"] == (count,) and made.inputs["kept_boxes"] == (count, None)


# ---- slices and TopK of a filtered count -----------------------------------------------------------
def top_of_filtered():
    """The kept scores' top min(5, n) (k = ReduceMin(Concat([5], Shape(kept)[0])) as torchvision's
    _topk_min exports it) and the first 3 of the kept ones (a Slice past the count clamps)."""
    nodes = _filter("x", 0.0, "kept", "a") + [
        helper.make_node("Shape", ["kept"], ["shape"]), _const("zero", 0, I64),
        helper.make_node("Gather", ["shape", "zero"], ["count"], axis=0), _const("ax", [0], I64, [1]),
        helper.make_node("Unsqueeze", ["count", "ax"], ["count1"]), _const("most", [5], I64, [1]),
        helper.make_node("Concat", ["most", "count1"], ["both"], axis=0),
        helper.make_node("ReduceMin", ["both"], ["k0"], keepdims=0), _const("one", [1], I64, [1]),
        helper.make_node("Reshape", ["k0", "one"], ["k"]),
        helper.make_node("TopK", ["kept", "k"], ["top", "top_idx"], axis=0),
        _const("s0", [0], I64, [1]), _const("s3", [3], I64, [1]),
        helper.make_node("Slice", ["kept", "s0", "s3"], ["head"])]
    return _model(nodes, [("x", F, [12])], [("top", F), ("top_idx", I64), ("head", F)])


def test_topk_and_slice_of_a_filtered_count_follow_the_count():
    rng = np.random.default_rng(3)
    feeds = [{"x": x} for x in _vectors(12)]
    feeds.append({"x": np.where(np.arange(12) < 2, rng.uniform(1, 2, 12), -1.0).astype(np.float32)})  # 2 < 3 < 5
    plan = _check(top_of_filtered(), feeds)
    assert plan.tensors["top"].dims and plan.tensors["head"].dims  # expressions of the count, not decided at its bound


def expand_as_filtered():
    """torchvision's MultiScaleRoIAlign: `idx.view(-1, 1, 1).expand(-1, 3, 2)` of a filtered index,
    whose target the exporter writes as Where(target == -1, 1, target)."""
    nodes = _filter("x", 0.0, "kept", "a") + [
        _const("col", [-1, 1, 1], I64, [3]), helper.make_node("Reshape", ["kept", "col"], ["kept3"]),
        helper.make_node("Shape", ["kept"], ["n"]), _const("rest", [3, 2], I64, [2]),
        helper.make_node("Concat", ["n", "rest"], ["target"], axis=0), _const("neg", [-1, -1, -1], I64, [3]),
        helper.make_node("Equal", ["target", "neg"], ["unset"]), _const("ones", [1, 1, 1], I64, [3]),
        helper.make_node("Where", ["unset", "ones", "target"], ["shape"]),
        helper.make_node("Expand", ["kept3", "shape"], ["y"])]
    return _model(nodes, [("x", F, [12])], [("y", F)])


def test_expand_to_a_filtered_count_compares_it_only_with_what_no_size_equals():
    plan = _check(expand_as_filtered(), [{"x": x} for x in _vectors(12)])
    assert plan.tensors["y"].dims  # (count, 3, 2): an expression, not decided at the bound


def filter_over_a_branch(whole):
    """A NonZero over an If output whose size only the branch taken decides (a sized dim): the
    first 5 elements (`whole`: all 12, the filter's bound) or those above 0 (as torchvision's
    batched_nms: empty or NMS's)."""
    then = helper.make_graph([_const("s", [0], I64, [1]), _const("e", [12 if whole else 5], I64, [1]),
                              helper.make_node("Slice", ["x", "s", "e"], ["head"])], "then", [],
                             [helper.make_tensor_value_info("head", F, None)])
    other = helper.make_graph(_filter("x", 0.0, "part", "e"), "else", [],
                              [helper.make_tensor_value_info("part", F, None)])
    nodes = [helper.make_node("If", ["flag"], ["chosen"], then_branch=then, else_branch=other)]
    nodes += _filter("chosen", 0.5, "y", "b")
    return _model(nodes, [("x", F, [12]), ("flag", B, [])], [("y", F)])


@pytest.mark.parametrize("whole", [False, True], ids=["head_or_kept", "all_or_kept"])
def test_a_filter_over_a_tensor_only_the_run_sizes(whole):
    feeds = [{"x": x, "flag": np.array(flag)} for x in _vectors(12) for flag in (True, False)]
    plan = _check(filter_over_a_branch(whole), feeds)
    assert plan.profiles.sized  # the If's output


def branches_over_top_counts():
    """SSDLite's postprocess: per class the top min(5, n) of the kept scores (x's above 0, z's above 0.5),
    concatenated (a length of min(count, 5) + min(count, 5), whose bound 10 the plan records) and read by
    both branches of an If (torchvision's batched_nms: `if boxes.numel() == 0`): each branch's plan is built
    for a profile of that length (builder.bodies.body_profile) and stamped at its opt, 1."""
    def top(x, tag):
        return [helper.make_node("Shape", [x], [f"{tag}_n"]), helper.make_node("Min", [f"{tag}_n", "most"], [f"{tag}_k"]),
                helper.make_node("TopK", [x, f"{tag}_k"], [f"{tag}_top", f"{tag}_i"])]

    then = helper.make_graph([helper.make_node("Add", ["both", "both"], ["twice"])], "then", [],
                             [helper.make_tensor_value_info("twice", F, None)])
    other = helper.make_graph([_const("one", 1.0), helper.make_node("Add", ["both", "one"], ["plus"])], "else", [],
                              [helper.make_tensor_value_info("plus", F, None)])
    nodes = _filter("x", 0.0, "a", "a") + _filter("z", 0.5, "b", "b") + [_const("most", [5], I64, [1])]
    nodes += top("a", "ta") + top("b", "tb") + [
        helper.make_node("Concat", ["ta_top", "tb_top"], ["both"], axis=0),
        helper.make_node("If", ["flag"], ["y"], then_branch=then, else_branch=other)]
    return _model(nodes, [("x", F, [12]), ("z", F, [12]), ("flag", B, [])], [("y", F)])


def _two_vectors():
    return [{"x": x, "z": z, "flag": np.array(flag)} for x, z in zip(_vectors(12, 1), _vectors(12, 2)[::-1])
            for flag in (True, False)]


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_a_branch_built_for_a_profile_loads_where_the_node_gives_it_the_length_s_bound(target):
    """The load check re-infers the node at the plan's stored sizes (10 here): a branch input's dim and a
    branch output's dim the branch's profile decides are not the opt (1) they were stamped at. SSDLite's plans
    failed to load so (issue 33, benchmarks/dynamic_screen.py); the cuda plan is built here without a GPU."""
    plan = build_plan(branches_over_top_counts(), BuilderConfig(target=target, builder_optimization_level=0))
    (branch,) = [layer for layer in plan.layers if layer.kind == "If"]
    body = branch.attrs["then_branch"]
    assert body.profiles is not None and body.tensors["both"].shape == (1,) and plan.tensors["both"].shape == (10,)
    loaded = Plan.deserialize(plan.serialize())
    assert [layer.name for layer in loaded.layers] == [layer.name for layer in plan.layers]


def test_a_branch_built_for_a_profile_runs_at_the_length_the_run_gives_it():
    _check(branches_over_top_counts(), _two_vectors())


# ---- the same models on the cuda target (a GPU machine) ---------------------------------------------
def _cuda_cases():
    vectors = [{"x": x} for x in _vectors(12)]
    return {"nested_filter": (nested_filter(), vectors),
            "boxes_and_offsets": (boxes_and_offsets(False), [_detections(k, s) for s, k in enumerate((0.0, 0.5, 1.0))]),
            "boxes_and_offsets_in_if": (boxes_and_offsets(True), [_detections(k, s) for s, k in enumerate((0.0, 0.5, 1.0))]),
            "top_of_filtered": (top_of_filtered(), vectors), "expand_as_filtered": (expand_as_filtered(), vectors),
            "filter_over_a_branch": (filter_over_a_branch(False),
                                     [{**f, "flag": np.array(flag)} for f in vectors for flag in (True, False)]),
            "branches_over_top_counts": (branches_over_top_counts(), _two_vectors())}


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(_cuda_cases()))
def test_data_dependent_patterns_on_cuda(case):
    model, feeds = _cuda_cases()[case]
    _check(model, feeds, target="cuda")

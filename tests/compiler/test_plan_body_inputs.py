"""A saved plan whose control-flow body reads a tensor of run-time size (issue 33: SSDLite's batched_nms
`If` reads the boxes a NonZero kept and TopK cut): the body plan's input dim is a symbol of its profile,
and loading checks the size the node gives there against the symbol's range, not against the body's
opt shape; a static body's input is still checked exactly (polykit.compiler.plan.body_inputs)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.plan.body_inputs import infer_body_plan
from polykit.compiler.plan.file import Plan
from polykit.compiler.plan.profiles import Profile
from polykit.errors import ShapeError
from polykit.runtime.engine import Runtime
from tests.compiler.control_flow.models import branchy

F, I64 = TensorProto.FLOAT, TensorProto.INT64
#: x's length: (min, opt, max) of the profile, and the lengths each run feeds
PROFILE = Profile({"x": ((4,), (8,), (12,))})
LENGTHS = (4, 7, 8, 12)
TOP = 5


def _const(name, values, dtype=F, dims=None):
    values = np.asarray(values).reshape(-1).tolist()
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(name, dtype, dims or [], values))


def kept_top_if():
    """x (n,) with n dynamic: kept = x[x > 0] (NonZero -> Squeeze -> Gather), top = its largest min(5, count)
    (TopK of k = ReduceMin(Concat([5], Shape(kept))), as torchvision's _topk_min exports it) and their ranks
    (float); an If on sum(x) > 0 reads them and x from the outer graph: then (top + ranks + 10, x * 2), else
    (top, x) by Identity. In the then_branch's plan, top and ranks share one dim."""
    then = helper.make_graph([_const("offset", 10.0), helper.make_node("Add", ["top", "ranks"], ["t_r"]),
                              helper.make_node("Add", ["t_r", "offset"], ["t_y"]),
                              _const("two", 2.0), helper.make_node("Mul", ["x", "two"], ["t_z"])], "then", [],
                             [helper.make_tensor_value_info("t_y", F, None), helper.make_tensor_value_info("t_z", F, None)])
    other = helper.make_graph([helper.make_node("Identity", ["top"], ["e_y"]),
                               helper.make_node("Identity", ["x"], ["e_z"])], "else", [],
                              [helper.make_tensor_value_info("e_y", F, None), helper.make_tensor_value_info("e_z", F, None)])
    nodes = [_const("zero", 0.0), helper.make_node("Greater", ["x", "zero"], ["mask"]),
             helper.make_node("NonZero", ["mask"], ["nz"]), _const("ax0", [0], I64, [1]),
             helper.make_node("Squeeze", ["nz", "ax0"], ["idx"]), helper.make_node("Gather", ["x", "idx"], ["kept"]),
             helper.make_node("Shape", ["kept"], ["count"]), _const("most", [TOP], I64, [1]),
             helper.make_node("Concat", ["most", "count"], ["both"], axis=0),
             helper.make_node("ReduceMin", ["both"], ["k"], keepdims=1),
             helper.make_node("TopK", ["kept", "k"], ["top", "top_i"]), helper.make_node("Cast", ["top_i"], ["ranks"], to=F),
             helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
             helper.make_node("Greater", ["total", "zero"], ["cond"]),
             helper.make_node("If", ["cond"], ["y", "z"], then_branch=then, else_branch=other)]
    graph = helper.make_graph(nodes, "kept_top_if", [helper.make_tensor_value_info("x", F, ["n"])],
                              [helper.make_tensor_value_info("y", F, None), helper.make_tensor_value_info("z", F, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _feeds():
    """x of each length in LENGTHS: mostly positive (then, more kept than TOP), all negative (else, none
    kept), mixed."""
    rng = np.random.default_rng(0)
    for n in LENGTHS:
        base = rng.uniform(0.1, 1.0, n).astype(np.float32)
        yield {"x": base}
        yield {"x": -base}
        yield {"x": np.where(rng.random(n) < 0.4, base, -base).astype(np.float32)}


def _saved(target):
    model = kept_top_if()
    plan = Plan.deserialize(build_plan(model, BuilderConfig(target=target, profiles=[PROFILE])).serialize())
    return model, plan


def _bodies(plan):
    return [v for layer in plan.layers if layer.kind == "If" for v in layer.attrs.values() if isinstance(v, Plan)]


def _runs_like_onnxruntime(model, plan):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with Runtime().deserialize_engine(plan) as engine, engine.create_execution_context() as ctx:
        for feeds in _feeds():
            want = dict(zip(("y", "z"), sess.run(None, feeds)))
            got = ctx.execute(feeds)
            for name, ref in want.items():
                assert got[name].shape == ref.shape, (name, feeds["x"].shape, got[name].shape, ref.shape)
                np.testing.assert_allclose(got[name], ref, rtol=1e-6, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_a_plan_whose_if_reads_run_time_sizes_loads_again_byte_for_byte(target):
    data = build_plan(kept_top_if(), BuilderConfig(target=target, profiles=[PROFILE])).serialize()
    loaded = Plan.deserialize(data, expect_target=target)
    assert loaded.serialize() == data
    assert len(_bodies(loaded)) == 2 and all(body.profiles is not None for body in _bodies(loaded))


def test_a_saved_plan_whose_if_reads_run_time_sizes_matches_onnxruntime():
    _runs_like_onnxruntime(*_saved("cpu"))


@pytest.mark.gpu
def test_a_saved_cuda_plan_whose_if_reads_run_time_sizes_matches_onnxruntime():
    _runs_like_onnxruntime(*_saved("cuda"))


def _dynamic_body():
    """The then_branch plan of the saved kept_top_if plan, and the symbol of each input's (one) dim."""
    body = next(b for b in _bodies(_saved("cpu")[1]) if "t_y" in b.metadata["body_outputs"])
    return body, {name: body.profiles.inputs[name][0] for name in body.inputs}


def test_a_dynamic_body_input_takes_any_size_in_its_range():
    body, symbols = _dynamic_body()
    sizes = {name: body.profiles.ranges[0][s][2] for name, s in symbols.items()}
    infer_body_plan(body, [(np.float32, (sizes[name],)) for name in body.inputs])
    infer_body_plan(body, [(np.float32, (0,)) for _ in body.inputs])


def test_a_body_plans_outputs_have_its_dims_at_the_nodes_sizes():
    body, _ = _dynamic_body()
    outputs = infer_body_plan(body, [(np.float32, (7 if n == "x" else 3,)) for n in body.inputs])
    assert [(v.name, v.shape) for v in outputs] == [("t_y", (3,)), ("t_z", (7,))]
    unknown = infer_body_plan(body, [(np.float32, (None,)) for _ in body.inputs])
    assert [v.shape for v in unknown] == [(None,), (None,)]


def test_a_dynamic_body_input_beyond_its_range_is_refused_naming_the_range():
    body, symbols = _dynamic_body()
    high = body.profiles.ranges[0][symbols["x"]][2]
    values = [(np.float32, (high + 1 if n == "x" else 1,)) for n in body.inputs]
    with pytest.raises(ShapeError, match=rf"size {high + 1} at body dim .*outside the body plan's range \[0, {high}\]"):
        infer_body_plan(body, values)


def test_a_dynamic_body_input_of_another_rank_or_dtype_is_refused():
    body, _ = _dynamic_body()
    with pytest.raises(ShapeError, match="in the body's plan, the node gives"):
        infer_body_plan(body, [(np.float32, (3, 1)) for _ in body.inputs])
    with pytest.raises(ShapeError, match="in the body's plan, the node gives int64"):
        infer_body_plan(body, [(np.int64, (3,)) for _ in body.inputs])


def test_body_inputs_that_share_one_dim_must_get_one_size():
    body, symbols = _dynamic_body()
    assert symbols["top"] == symbols["ranks"] != symbols["x"]
    infer_body_plan(body, [(np.float32, (3 if n == "x" else 2,)) for n in body.inputs])
    values = [(np.float32, (3 if n == "ranks" else 2,)) for n in body.inputs]
    with pytest.raises(ShapeError, match="'ranks' dim 0 is 3, but body input 'top' gives 2 for the same body dim"):
        infer_body_plan(body, values)


def test_a_static_body_input_must_have_the_nodes_shape_exactly():
    plan = build_plan(branchy(), BuilderConfig(target="cpu"))
    body = next(v for layer in plan.layers if layer.kind == "If" for v in layer.attrs.values() if isinstance(v, Plan))
    assert body.profiles is None or not any(s for dims in body.profiles.inputs.values() for s in dims)
    infer_body_plan(body, [(np.float32, (2, 3))])
    with pytest.raises(ShapeError, match=r"float32\[2, 3\] in the body's plan, the node gives float32\[2, 4\]"):
        infer_body_plan(body, [(np.float32, (2, 4))])

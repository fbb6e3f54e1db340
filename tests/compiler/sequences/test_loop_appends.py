"""A Loop of run-time trip count that only appends to its carried sequence (test_loop13_seq,
test_loop16_seq_none's forms, random data): one engine for every trip count, its sequence a ragged
output (polykit.compiler.passes.control.sequence_loop) that the engine cuts into elements."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import polykit.backends.onnx_backend as backend
from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.plan.file import Plan
from polykit.errors import BuildError, PlanError, RuntimeInputError
from polykit.runtime.engine import Engine, Runtime
from polykit.runtime.sequences import pack_outputs

RNG = np.random.default_rng(16)
X = RNG.uniform(0.5, 2.0, 5).astype(np.float32)
F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
SEQ = helper.make_sequence_type_proto(helper.make_tensor_type_proto(F, None))
OPT_SEQ = helper.make_optional_type_proto(SEQ)


def _slice_nodes() -> list:
    """piece = x[0:i+1] (an element whose shape the iteration number decides)."""
    return [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Add", ["i", "one"], ["end"]),
            helper.make_node("Unsqueeze", ["end", "axes"], ["stop"]),
            helper.make_node("Slice", ["x", "zero", "stop"], ["piece"])]


def _inits() -> list:
    return [numpy_helper.from_array(X, "x"), numpy_helper.from_array(np.array(1, np.int64), "one"),
            numpy_helper.from_array(np.array([0], np.int64), "zero"),
            numpy_helper.from_array(np.array([0], np.int64), "axes")]


def _model(body_nodes: list, state_type, inits: list, opset: int):
    body = helper.make_graph(body_nodes, "body",
                             [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("cond_in", B, []),
                              helper.make_value_info("s_in", state_type)],
                             [helper.make_tensor_value_info("cond_out", B, []), helper.make_value_info("s_out", SEQ)],
                             inits)
    g = helper.make_graph([helper.make_node("Loop", ["n", "cond", "s"], ["res"], body=body)], "m",
                          [helper.make_tensor_value_info("n", I64, []), helper.make_tensor_value_info("cond", B, []),
                           helper.make_value_info("s", state_type)], [helper.make_value_info("res", SEQ)])
    return helper.make_model(g, ir_version=10, opset_imports=[helper.make_opsetid("", opset)])


def appending_model():
    """test_loop13_seq's form: s_out = SequenceInsert(s_in, x[0:i+1])."""
    return _model(_slice_nodes() + [helper.make_node("SequenceInsert", ["s_in", "piece"], ["s_out"])], SEQ, _inits(), 13)


def optional_start_model():
    """test_loop16_seq_none's form: the carried optional sequence, when empty, starts as [c]; then appends."""
    c = numpy_helper.from_array(np.array(RNG.uniform(1, 2), np.float32), "c")
    then = helper.make_graph([helper.make_node("SequenceConstruct", ["c"], ["fresh"])], "then", [],
                             [helper.make_value_info("fresh", SEQ)], [c])
    orelse = helper.make_graph([helper.make_node("OptionalGetElement", ["s_in"], ["held"])], "else", [],
                               [helper.make_value_info("held", SEQ)])
    nodes = _slice_nodes() + [helper.make_node("OptionalHasElement", ["s_in"], ["has"]),
                              helper.make_node("Not", ["has"], ["empty"]),
                              helper.make_node("If", ["empty"], ["seq"], then_branch=then, else_branch=orelse),
                              helper.make_node("SequenceInsert", ["seq", "piece"], ["s_out"])]
    return _model(nodes, OPT_SEQ, _inits(), 16)


def reading_model():
    """The body reads its carried sequence (SequenceLength): not an append-only loop."""
    nodes = _slice_nodes() + [helper.make_node("SequenceLength", ["s_in"], ["k"]),
                              helper.make_node("Cast", ["k"], ["kf"], to=F),
                              helper.make_node("Add", ["piece", "kf"], ["shifted"]),
                              helper.make_node("SequenceInsert", ["s_in", "shifted"], ["s_out"])]
    return _model(nodes, SEQ, _inits(), 13)


def _feed(n: int, start) -> dict:
    return {"n": np.array(n, np.int64), "cond": np.array(True), "s": start}


def _assert_sequences_equal(got, want, what: str) -> None:
    assert len(got) == len(want), f"{what}: {len(got)} elements, onnxruntime {len(want)}"
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape, f"{what}: element {k} has shape {g.shape}, onnxruntime {w.shape}"
        np.testing.assert_array_equal(g, w, err_msg=f"{what}: element {k}")


@pytest.mark.parametrize("make, start", [
    (appending_model, []),
    (appending_model, [RNG.standard_normal((2, 3)).astype(np.float32)]),
    (optional_start_model, [RNG.standard_normal(()).astype(np.float32)]),
    (optional_start_model, [RNG.standard_normal((2,)).astype(np.float32), RNG.standard_normal(4).astype(np.float32)]),
], ids=["empty", "prefix", "optional-scalar", "optional-two"])
def test_an_appending_loop_builds_once_for_every_trip_count_and_matches_onnxruntime(make, start):
    model = make()
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rep = backend.prepare(model, "CPU")
    for n in (0, 1, 3, 5, 2):
        (got,), (want,) = rep.run(dict(_feed(n, start))), session.run(None, _feed(n, start))
        _assert_sequences_equal(got, want, f"trip count {n}")
    assert rep.builds == 1, f"{rep.builds} engines built for 5 trip counts (one expected)"


def test_the_loop_stopping_on_its_condition_packs_only_the_iterations_it_ran():
    model = appending_model()
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rep = backend.prepare(model, "CPU")
    feed = {"n": np.array(4, np.int64), "cond": np.array(False), "s": []}
    (got,), (want,) = rep.run(dict(feed)), session.run(None, feed)
    assert got == [] and want == []


def _plan(model, shapes: dict) -> Plan:
    return build_plan(model, BuilderConfig(target="cpu", input_shapes={"n": (), "cond": (), **shapes}))


def test_the_plan_holds_a_ragged_layout_and_survives_serialization():
    plan = _plan(appending_model(), {"s/0": (2, 3)})
    layout = plan.metadata["sequence_io"]["outputs"]["res"]
    assert set(layout) == {"ragged", "shapes", "prefix"} and layout["prefix"] == ["res/0"], layout
    start = [RNG.standard_normal((2, 3)).astype(np.float32)]
    loaded = Plan.deserialize(plan.serialize())
    with Engine(plan) as a, a.create_execution_context() as ca, Engine(loaded) as b, b.create_execution_context() as cb:
        want, got = ca.execute(_feed(4, start))["res"], cb.execute(_feed(4, start))["res"]
    _assert_sequences_equal(got, want, "deserialized plan")
    assert [w.shape for w in want] == [(2, 3), (1,), (2,), (3,), (4,)]
    np.testing.assert_array_equal(want[4], X[:4])


def test_a_plan_built_for_a_present_optional_refuses_an_empty_one():
    plan = _plan(optional_start_model(), {"s/0/0": ()})
    with Engine(plan) as engine, engine.create_execution_context() as ctx:
        with pytest.raises(RuntimeInputError, match="'s'.*no element"):
            ctx.execute(_feed(2, None))


def test_a_loop_that_reads_its_carried_sequence_still_needs_a_constant_trip_count():
    with pytest.raises(BuildError, match="trip count"):
        _plan(reading_model(), {})


@pytest.mark.parametrize("layout", [{"ragged": "res/ragged", "shapes": "res/shapes"},
                                    {"ragged": "res/ragged", "shapes": 3, "prefix": []},
                                    {"ragged": "res/ragged", "shapes": "res/shapes", "prefix": "res/0"},
                                    {"ragged": "nowhere", "shapes": "res/shapes", "prefix": []}])
def test_a_plan_whose_ragged_layout_is_malformed_is_refused(layout):
    plan = _plan(appending_model(), {})
    plan.metadata["sequence_io"]["outputs"]["res"] = layout
    with pytest.raises(PlanError, match="sequence"):
        Runtime("cpu").deserialize_engine(plan.serialize())


def test_ragged_values_that_disagree_with_their_shapes_are_a_plan_error():
    io = {"inputs": {}, "outputs": {"res": {"ragged": "v", "shapes": "r", "prefix": []}}}
    ok = pack_outputs(io, {"v": np.arange(5, dtype=np.float32), "r": np.array([[2], [3]], np.int64)})
    _assert_sequences_equal(ok["res"], [np.arange(2, dtype=np.float32), np.arange(2, 5, dtype=np.float32)], "cut")
    with pytest.raises(PlanError, match="do not match its shapes"):
        pack_outputs(io, {"v": np.arange(4, dtype=np.float32), "r": np.array([[2], [3]], np.int64)})

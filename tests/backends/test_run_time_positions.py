"""SequenceInsert / SequenceErase / SequenceAt at a position fed as an input (issue 13): one engine
serves every position of ONNX's range over elements of three shapes (a CheckRange of the position,
a SelectByIndex whose outputs take the chosen element's shape), equal to onnxruntime; a position out
of the range stops the run with a RuntimeInputError naming the input, the value and the range. The
cuda variants are gpu-marked; tests/kernels/cuda/test_selection.py runs the cuda tactics' host side
on emulated memory."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import polykit.backends.onnx_backend as backend
from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.plan.file import Plan
from polykit.errors import PlanError, RuntimeInputError
from polykit.runtime.engine import Runtime
from tests.backends.test_one_engine_per_shape import TARGETS, _model, _run_values
from tests.compiler.test_plan_check import edited, layer

#: the sequence's elements (three shapes) and the tensor an insert adds
SHAPES = {"a": (2, 3), "b": (1, 3), "c": (4, 3), "t": (3, 3)}
N = 3


def _positional_model(op: str, out_seq: bool = True, pos_type: int = TensorProto.INT64):
    """SequenceConstruct(a, b, c) then `op` at the input position `pos` (SequenceInsert adds t)."""
    inputs = ["s", "t", "pos"] if op == "SequenceInsert" else ["s", "pos"]
    out = (helper.make_tensor_sequence_value_info("out", TensorProto.FLOAT, None) if out_seq
           else helper.make_tensor_value_info("out", TensorProto.FLOAT, None))
    return _model([helper.make_node("SequenceConstruct", ["a", "b", "c"], ["s"]), helper.make_node(op, inputs, ["out"])],
                  [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in SHAPES.items()
                   if n in "abc" or op == "SequenceInsert"] +
                  [helper.make_tensor_value_info("pos", pos_type, [])], [out])


def _feeds(op: str, pos: int, dtype=np.int64) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(13)
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}
    if op != "SequenceInsert":
        del feeds["t"]
    return {**feeds, "pos": np.array(pos, dtype)}


#: op -> (whether it gives a sequence, ONNX's position range over N elements)
OPS = {"SequenceInsert": (True, (-N, N)), "SequenceErase": (True, (-N, N - 1)), "SequenceAt": (False, (-N, N - 1))}


@pytest.mark.parametrize("device", TARGETS)
@pytest.mark.parametrize("op", sorted(OPS))
def test_every_position_in_range_runs_through_one_engine_as_onnxruntime(op, device):
    seq, (lo, hi) = OPS[op]
    positions = [hi, lo, 0, *range(lo + 1, hi)]  # each run changes the elements' shapes (stale buffers differ)
    _run_values(_positional_model(op, seq), device, [_feeds(op, p) for p in positions], f"{op} at a fed position")


def test_an_int32_position_is_checked_and_widened():
    model = _positional_model("SequenceInsert", pos_type=TensorProto.INT32)
    _run_values(model, "CPU", [_feeds("SequenceInsert", p, np.int32) for p in (3, -3, 1)], "int32 position")
    with pytest.raises(RuntimeInputError, match=r"is -4, outside its range \[-3, 3\]"):
        backend.prepare(model, "CPU").run(_feeds("SequenceInsert", -4, np.int32))


@pytest.mark.parametrize("device", TARGETS)
@pytest.mark.parametrize("op", sorted(OPS))
def test_a_position_out_of_range_is_a_runtime_input_error_naming_input_value_and_range(op, device):
    seq, (lo, hi) = OPS[op]
    rep = backend.prepare(_positional_model(op, seq), device)
    rep.run(_feeds(op, 0))
    for bad in (hi + 1, lo - 1, 1 << 40):
        with pytest.raises(RuntimeInputError, match=rf"input 'pos'.*{op}.* is {bad}, outside its range \[{lo}, {hi}\]"):
            rep.run(_feeds(op, bad))
    assert rep.builds == 1, "the bad positions were refused by the one engine, not rebuilt for"


def test_the_build_checks_the_position_then_selects_with_the_elements_of_other_shapes_sized():
    plan = build_plan(_positional_model("SequenceInsert"), BuilderConfig(target="cpu", input_shapes=_shapes()))
    kinds = [lay.kind for lay in plan.layers]
    assert kinds[0] == "CheckRange" and kinds[-1] == "SelectByIndex", kinds
    assert len(plan.profiles.sized) == N + 1, "every output element may take a shape the position decides"
    check = plan.layers[0]
    assert (check.attrs["lo"], check.attrs["hi"], check.attrs["wrap"]) == (-N, N, N)


def test_an_output_whose_candidates_share_a_shape_stays_static():
    model = _positional_model("SequenceErase")
    shapes = {"a": (2, 3), "b": (2, 3), "c": (4, 3), "pos": ()}  # erase's output 0 is a or b: one shape
    plan = build_plan(model, BuilderConfig(target="cpu", input_shapes=shapes))
    assert plan.tensors["out/0"].shape == (2, 3) and not plan.tensors["out/0"].dims
    first = plan.tensors["out/1"].dims[0]  # b or c: its rows are decided by the position
    assert first.op == "sym" and first.args[0] in plan.profiles.sized, (first, plan.profiles.sized)


def _shapes() -> dict[str, tuple[int, ...]]:
    return {**SHAPES, "pos": ()}


def test_a_plan_with_check_and_select_layers_round_trips_and_runs_the_same():
    plan = build_plan(_positional_model("SequenceInsert"), BuilderConfig(target="cpu", input_shapes=_shapes()))
    data = plan.serialize()
    again = Plan.deserialize(data)
    assert again.serialize() == data
    feeds = _feeds("SequenceInsert", -2)
    outs = []
    for p in (plan, again):
        with Runtime("cpu").deserialize_engine(p) as engine, engine.create_execution_context() as ctx:
            outs.append(ctx.execute(feeds)["out"])
    assert [o.shape for o in outs[0]] == [(2, 3), (3, 3), (1, 3), (4, 3)]
    for x, y in zip(*outs):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("field,value", [("lo", 5), ("hi", "3"), ("what", 7), ("wrap", 1.5), ("lo", None)])
def test_a_plan_whose_check_layer_is_malformed_is_refused(field, value):
    plan = build_plan(_positional_model("SequenceInsert"), BuilderConfig(target="cpu", input_shapes=_shapes()))
    name = next(lay.name for lay in plan.layers if lay.kind == "CheckRange")

    def edit(doc):
        attrs = layer(doc, name)["attrs"]
        if value is None:
            del attrs[field]
        else:
            attrs[field] = value

    with pytest.raises(PlanError, match=field if value is not None else "lo"):
        Plan.deserialize(edited(plan.serialize(), edit))


@pytest.mark.parametrize("choices", [[0, 1, 2], [9] * 12, [-1] * 12])
def test_a_plan_whose_select_layer_is_malformed_is_refused(choices):
    plan = build_plan(_positional_model("SequenceInsert"), BuilderConfig(target="cpu", input_shapes=_shapes()))
    name = next(lay.name for lay in plan.layers if lay.kind == "SelectByIndex")
    with pytest.raises(PlanError, match="choices|candidate"):
        Plan.deserialize(edited(plan.serialize(), lambda doc: layer(doc, name)["attrs"].update(choices=choices)))


def test_polykit_run_with_a_position_out_of_range_exits_2_naming_it(tmp_path, capsys):
    import onnx

    from polykit.tools.cli.app import main

    path = tmp_path / "at.onnx"
    onnx.save(_positional_model("SequenceAt", out_seq=False), path)
    feeds = tmp_path / "feeds.npz"
    np.savez(feeds, **_feeds("SequenceAt", 7))
    code = main(["run", str(path), "--trt", "--target", "cpu", "--load-inputs", str(feeds)])
    captured = capsys.readouterr()
    assert code == 2, captured.out + captured.err
    assert "input 'pos'" in captured.out + captured.err and "is 7, outside its range [-3, 2]" in captured.out + captured.err

"""Plan format: deterministic bytes, round trips, and a PlanError for every kind of bad file."""

from __future__ import annotations

import struct
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.plan.memory import MemoryPlan
from polykit.compiler.plan.file import BUILD_REPORT_KEYS, FORMAT_VERSION, MAGIC, Plan
from polykit.errors import PlanError


def _model(seed: int = 0):
    rng = np.random.default_rng(seed)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    w = numpy_helper.from_array(rng.standard_normal((2, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "b")
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["t0"], name="mul"),
        helper.make_node("Add", ["t0", "b"], ["t1"], name="add"),
        helper.make_node("Abs", ["t1"], ["y"], name="abs"),
    ]
    graph = helper.make_graph(nodes, "plan_test", [x], [y], [w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


@pytest.fixture(scope="module")
def plan() -> Plan:
    return build_plan(_model(), BuilderConfig(target="cpu"))


def test_same_model_and_config_give_byte_identical_plans():
    a = build_plan(_model(), BuilderConfig(target="cpu")).serialize()
    b = build_plan(_model(), BuilderConfig(target="cpu")).serialize()
    assert a == b


def test_different_weights_give_different_plan_bytes():
    assert build_plan(_model(0), BuilderConfig(target="cpu")).serialize() != \
        build_plan(_model(1), BuilderConfig(target="cpu")).serialize()


def test_serialized_plan_starts_with_magic_and_format_version(plan):
    data = plan.serialize()
    assert data[:8] == MAGIC
    assert struct.unpack_from("<I", data, 8)[0] == FORMAT_VERSION


def test_round_trip_keeps_layers_tensors_io_memory_and_weights(plan):
    back = Plan.deserialize(plan.serialize())
    assert back.target == plan.target
    assert [(l.name, l.kind, l.inputs, l.outputs, l.tactic) for l in back.layers] == \
        [(l.name, l.kind, l.inputs, l.outputs, l.tactic) for l in plan.layers]
    assert back.tensors == plan.tensors
    assert (back.inputs, back.outputs) == (plan.inputs, plan.outputs)
    assert back.memory == plan.memory
    assert back.metadata == {k: v for k, v in plan.metadata.items() if k not in BUILD_REPORT_KEYS}
    assert set(back.weights) == set(plan.weights)
    for name, w in plan.weights.items():
        np.testing.assert_array_equal(back.weights[name], w)
        assert back.weights[name].dtype == w.dtype


def test_layers_carry_their_tensor_dtypes_through_the_round_trip():
    m = _model()
    cast = helper.make_node("Cast", ["y"], ["z"], name="cast", to=TensorProto.INT64)
    m.graph.node.append(cast)
    m.graph.output[0].CopyFrom(helper.make_tensor_value_info("z", TensorProto.INT64, [2, 3]))
    plan = build_plan(m, BuilderConfig(target="cpu", fuse=False))
    by_kind = {l.kind: l for l in Plan.deserialize(plan.serialize()).layers}
    assert by_kind["Cast"].in_dtypes == ("float32",)
    assert by_kind["Cast"].out_dtypes == ("int64",)
    assert by_kind["Mul"].in_dtypes == ("float32", "float32")


def test_round_trip_is_byte_stable(plan):
    data = plan.serialize()
    assert Plan.deserialize(data).serialize() == data


def test_weights_sit_at_256_byte_aligned_file_offsets(plan):
    data = plan.serialize()
    for name, w in plan.weights.items():
        raw = np.ascontiguousarray(w).tobytes()
        pos = data.find(raw)
        assert pos >= 0 and pos % 256 == 0, name


def test_save_and_load_through_a_file(plan, tmp_path):
    path = plan.save(tmp_path / "m.plan")
    assert Plan.load(path).serialize() == plan.serialize()


def test_array_attributes_survive_the_round_trip():
    s = helper.make_tensor_value_info("s", TensorProto.INT64, [1])
    o = helper.make_tensor_value_info("o", TensorProto.FLOAT, None)
    node = helper.make_node("ConstantOfShape", ["s"], ["o"], name="c",
                            value=numpy_helper.from_array(np.array([1.5], np.float32)))
    model = helper.make_model(helper.make_graph([node], "cos", [s], [o]), opset_imports=[helper.make_opsetid("", 21)])
    built = build_plan(model, BuilderConfig(target="cpu", input_values={"s": np.array([3])}))
    value = np.array([-2.25], dtype=np.float32)
    built.layers[0] = replace(built.layers[0], attrs={"value": value, "axes": [0, 1], "mode": "x"})
    back = Plan.deserialize(built.serialize()).layers[0]
    np.testing.assert_array_equal(back.attrs["value"], value)
    assert back.attrs["value"].dtype == np.float32
    assert back.attrs["axes"] == [0, 1] and back.attrs["mode"] == "x"


@settings(max_examples=40, deadline=None)
@given(
    dtype=st.sampled_from(["float32", "float16", "float64", "int8", "int32", "int64", "uint8", "bool"]),
    shape=st.lists(st.integers(0, 5), min_size=0, max_size=3),
    seed=st.integers(0, 2**16),
)
def test_any_weight_round_trips_exactly(dtype, shape, seed):
    rng = np.random.default_rng(seed)
    w = np.asarray(rng.standard_normal(shape) * 50).astype(dtype)
    plan = Plan("cpu", [], {}, [], [], weights={"w": w, "v": w.reshape(-1)[:1].copy()}, memory=MemoryPlan())
    back = Plan.deserialize(plan.serialize())
    np.testing.assert_array_equal(back.weights["w"], w)
    assert back.weights["w"].dtype == w.dtype and back.weights["w"].shape == w.shape


def test_truncated_plan_says_it_is_truncated(plan):
    data = plan.serialize()
    for cut in (4, 20, len(data) // 2, len(data) - 1):
        with pytest.raises(PlanError, match="truncated"):
            Plan.deserialize(data[:cut])


def test_flipped_byte_in_body_fails_the_checksum(plan):
    data = bytearray(plan.serialize())
    data[-5] ^= 0xFF
    with pytest.raises(PlanError, match="checksum"):
        Plan.deserialize(bytes(data))


def test_flipped_byte_in_json_fails_the_checksum(plan):
    data = bytearray(plan.serialize())
    pos = data.find(b'"layers"')
    data[pos + 2] ^= 0x01
    with pytest.raises(PlanError, match="checksum"):
        Plan.deserialize(bytes(data))


def test_foreign_format_version_is_named(plan):
    data = bytearray(plan.serialize())
    struct.pack_into("<I", data, 8, FORMAT_VERSION + 7)
    with pytest.raises(PlanError, match=f"format version {FORMAT_VERSION + 7}"):
        Plan.deserialize(bytes(data))


def test_wrong_target_is_named(plan):
    with pytest.raises(PlanError, match="built for target 'cpu', not 'cuda'"):
        Plan.deserialize(plan.serialize(), expect_target="cuda")


def test_onnx_bytes_are_not_a_plan():
    with pytest.raises(PlanError, match="not a polykit plan"):
        Plan.deserialize(_model().SerializeToString())


def test_trailing_garbage_is_rejected(plan):
    with pytest.raises(PlanError, match="trailing"):
        Plan.deserialize(plan.serialize() + b"xx")


def test_missing_plan_file_is_a_plan_error(tmp_path):
    with pytest.raises(PlanError, match="does not exist"):
        Plan.load(tmp_path / "nope.plan")

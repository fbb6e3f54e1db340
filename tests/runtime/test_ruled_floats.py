"""Float shape operands (Resize's scales, OneHot's depth, Range's operands) range over float
domains: one plan serves every value, each consumer's shape rule runs at bind time on the
run's floats (polykit.compiler.graph.shape_rules.RuledFloat); and records keep small tensor
attributes (ConstantOfShape's fill). Outputs match onnxruntime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.compiler.plan.file import Plan
from polykit.compiler.builder.value_ranges import ruled_profile
from polykit.errors import PlanError, RuntimeInputError
from polykit.runtime.engine import Runtime
from tests.compiler.test_plan_check import edited


def _model(nodes, inputs, outputs, opset=18):
    g = helper.make_graph(nodes, "ruled_floats", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                          [helper.make_tensor_value_info(n, t, None) for n, t in outputs])
    return helper.make_model(g, ir_version=10, opset_imports=[helper.make_opsetid("", opset)])


def _plan(model, feeds) -> bytes:
    graph = load_onnx(model)
    shapes = {k: v.shape for k, v in feeds.items()}
    profile = ruled_profile(graph, shapes, feeds)
    assert profile is not None and profile.ruled, "the float shape operand got no domain"
    plan = build_plan(graph, BuilderConfig(target="cpu", input_shapes=shapes, profiles=[profile]))
    assert plan.profiles.rules, "no shape rule was recorded: the plan bakes the opt values"
    return plan.serialize()


def _check_all(model, feeds_list, exact=True):
    """One plan (built at the first feeds, saved and loaded) runs every feed like onnxruntime."""
    engine = Runtime("cpu").deserialize_engine(Plan.deserialize(_plan(model, feeds_list[0])))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for feeds in feeds_list:
        with engine.create_execution_context() as ctx:
            got = ctx.execute(feeds)
        for out, want in zip(model.graph.output, session.run(None, feeds)):
            assert got[out.name].shape == want.shape, f"{out.name} for {feeds}: shape"
            if exact:
                np.testing.assert_array_equal(got[out.name], want, err_msg=f"{out.name} for {feeds}")
            else:
                np.testing.assert_allclose(got[out.name], want, rtol=1e-5, atol=1e-5, err_msg=f"{out.name} {feeds}")


RESIZE = _model([helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest")],
                [("x", TensorProto.FLOAT, [1, 2, 4, 6]), ("scales", TensorProto.FLOAT, [4])],
                [("y", TensorProto.FLOAT)])


def test_resize_scales_serve_every_value_from_one_plan():
    x = np.random.default_rng(1).standard_normal((1, 2, 4, 6)).astype(np.float32)
    scales = [[1, 1, 2, 2], [1, 1, 0.5, 0.5], [1, 1, 1.5, 3], [1, 2, 0.75, 1], [1, 1, 0.6, 1.7]]
    _check_all(RESIZE, [{"x": x, "scales": np.array(s, np.float32)} for s in scales])


def test_linear_resize_scales_serve_every_value_from_one_plan():
    model = _model([helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear")],
                   [("x", TensorProto.FLOAT, [1, 1, 5, 3]), ("scales", TensorProto.FLOAT, [4])],
                   [("y", TensorProto.FLOAT)])
    x = np.random.default_rng(2).standard_normal((1, 1, 5, 3)).astype(np.float32)
    scales = [[1, 1, 2, 2], [1, 1, 0.8, 2.5], [1, 1, 1.3, 0.7]]
    _check_all(model, [{"x": x, "scales": np.array(s, np.float32)} for s in scales], exact=False)


def test_onehot_float_depth_serves_every_depth():
    model = _model([helper.make_node("OneHot", ["i", "depth", "values"], ["y"], axis=1)],
                   [("i", TensorProto.INT64, [2, 3]), ("depth", TensorProto.FLOAT, []),
                    ("values", TensorProto.FLOAT, [2])], [("y", TensorProto.FLOAT)])
    i = np.array([[0, 3, 1], [2, 5, -1]], np.int64)
    values = np.array([0.25, 3.5], np.float32)
    _check_all(model, [{"i": i, "depth": np.array(d, np.float32), "values": values} for d in (4.0, 7.0, 2.5, 1.0)])


def test_float_range_serves_every_start_limit_and_delta():
    model = _model([helper.make_node("Range", ["start", "limit", "delta"], ["y"])],
                   [(n, TensorProto.FLOAT, []) for n in ("start", "limit", "delta")], [("y", TensorProto.FLOAT)])
    triples = [(0.0, 5.0, 1.0), (1.5, 9.0, 0.5), (10.0, 2.0, -3.0), (3.0, 3.0, 1.0), (-2.0, 2.5, 0.7)]
    _check_all(model, [{"start": np.array(s, np.float32), "limit": np.array(lim, np.float32),
                        "delta": np.array(d, np.float32)} for s, lim, d in triples], exact=False)  # ort accumulates


def test_constant_of_shape_keeps_its_fill_tensor_in_the_rule_record():
    fill = numpy_helper.from_array(np.array([2.5], np.float32))
    model = _model([helper.make_node("ConstantOfShape", ["shape"], ["y"], value=fill)],
                   [("shape", TensorProto.INT64, [2])], [("y", TensorProto.FLOAT)])
    _check_all(model, [{"shape": np.array(s, np.int64)} for s in ([2, 3], [4, 1], [0, 5], [7, 7])])


def test_reshape_of_empty_data_serves_any_target_with_a_zero():
    model = _model([helper.make_node("Reshape", ["x", "shape"], ["y"], allowzero=1)],
                   [("x", TensorProto.FLOAT, [0, 3, 4]), ("shape", TensorProto.INT64, [3])], [("y", TensorProto.FLOAT)])
    x = np.zeros((0, 3, 4), np.float32)
    _check_all(model, [{"x": x, "shape": np.array(s, np.int64)} for s in ([3, 4, 0], [0, 12, 5], [9, 0, 2])])


@pytest.mark.parametrize("scales, what", [
    ([1, 1, -2, 2], "shape-tensor input 'scales' has element 2 = -2.0, outside"),
    ([1, 1, 0, 2], "must be positive"),
])
def test_a_scale_outside_the_domain_is_a_runtime_input_error(scales, what):
    x = np.ones((1, 2, 4, 6), np.float32)
    engine = Runtime("cpu").deserialize_engine(Plan.deserialize(
        _plan(RESIZE, {"x": x, "scales": np.array([1, 1, 2, 2], np.float32)})))
    with engine.create_execution_context() as ctx, pytest.raises(RuntimeInputError) as err:
        ctx.execute({"x": x, "scales": np.array(scales, np.float32)})
    assert what in err.value.what, err.value.what


def test_crafted_float_values_and_tensor_attributes_are_refused_naming_the_field():
    x = np.ones((1, 2, 4, 6), np.float32)
    scaled = _plan(RESIZE, {"x": x, "scales": np.array([1, 1, 2, 2], np.float32)})
    fill = numpy_helper.from_array(np.array([1], np.int32))
    filled = _plan(_model([helper.make_node("ConstantOfShape", ["shape"], ["y"], value=fill)],
                          [("shape", TensorProto.INT64, [2])], [("y", TensorProto.INT32)]),
                   {"shape": np.array([2, 3], np.int64)})

    def unruled_float(doc):
        doc["profiles"]["ruled"] = []

    def long_tensor(doc):
        doc["profiles"]["rules"][0]["attrs"]["value"] = {"dtype": "int32", "shape": [100], "values": [1] * 100}

    def short_tensor(doc):
        doc["profiles"]["rules"][0]["attrs"]["value"] = {"dtype": "int32", "shape": [2], "values": [1]}

    for data, edit, field, what in ((scaled, unruled_float, "profiles.values['scales']", "float one"),
                                    (filled, long_tensor, "profiles.rules[0]", "at most 64"),
                                    (filled, short_tensor, "profiles.rules[0]", "as many values")):
        with pytest.raises(PlanError) as err:
            Plan.deserialize(edited(data, edit))
        assert field in err.value.what and what in err.value.what, err.value.what

"""BuilderConfig.input_values: build-time values of inputs whose data decides shapes (shape-tensor inputs)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.errors import BuildError, RuntimeInputError
from polykit.runtime.engine import Runtime

RNG = np.random.default_rng(7)


def _model(nodes, inputs, outputs):
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [helper.make_tensor_value_info(n, t, None) for n, t in outputs])
    return load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))


def _reshape_graph():
    return _model([helper.make_node("Reshape", ["x", "shape"], ["y"])],
                  [("x", TensorProto.FLOAT, [2, 6]), ("shape", TensorProto.INT64, [2])], [("y", TensorProto.FLOAT)])


def test_a_shape_input_value_makes_the_reshaped_output_static():
    shape = np.array([3, 4], np.int64)
    plan = build_plan(_reshape_graph(), BuilderConfig(target="cpu", input_values={"shape": shape}))
    assert plan.tensors["y"].shape == (3, 4)
    x = RNG.standard_normal((2, 6)).astype(np.float32)
    with Runtime("cpu").deserialize_engine(plan).create_execution_context() as ctx:
        np.testing.assert_array_equal(ctx.execute({"x": x, "shape": shape})["y"], x.reshape(3, 4))


def test_the_engine_refuses_a_feed_that_differs_from_the_bound_value():
    plan = build_plan(_reshape_graph(), BuilderConfig(target="cpu", input_values={"shape": np.array([3, 4])}))
    x = RNG.standard_normal((2, 6)).astype(np.float32)
    with Runtime("cpu").deserialize_engine(plan).create_execution_context() as ctx:
        with pytest.raises(RuntimeInputError, match="shape"):
            ctx.execute({"x": x, "shape": np.array([4, 3])})


def test_without_a_value_the_shape_tensor_input_is_a_build_error_naming_it_and_the_flag():
    with pytest.raises(BuildError, match="(?s)input 'shape' is a shape-tensor input .*--trt-opt-shape-values"):
        build_plan(_reshape_graph(), BuilderConfig(target="cpu"))


def test_a_value_for_a_tensor_that_is_not_an_input_is_a_build_error():
    with pytest.raises(BuildError, match="not a graph input"):
        build_plan(_reshape_graph(), BuilderConfig(target="cpu", input_values={"y": np.array([1])}))


def test_nonzero_of_a_bound_input_gets_its_count_as_a_static_dim():
    graph = _model([helper.make_node("NonZero", ["x"], ["y"])], [("x", TensorProto.FLOAT, [3, 4])],
                   [("y", TensorProto.INT64)])
    x = (RNG.standard_normal((3, 4)) > 0).astype(np.float32)
    plan = build_plan(graph, BuilderConfig(target="cpu", input_values={"x": x}))
    assert plan.tensors["y"].shape == (2, int(np.count_nonzero(x)))


def test_input_values_round_trip_through_the_config_json():
    cfg = BuilderConfig(input_values={"shape": np.array([[3, 4]], np.int32)})
    back = BuilderConfig.from_json(cfg.to_json())
    assert back.input_values["shape"].dtype == np.int32
    np.testing.assert_array_equal(back.input_values["shape"], [[3, 4]])

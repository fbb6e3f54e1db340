"""Shape chains of real exports under optimization profiles (issue 33): each pattern, written with
onnx.helper, builds one cpu plan that matches onnxruntime at the profile's min, an odd shape and max."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.plan.profiles import Profile
from polykit.errors import BuildError, ShapeError
from polykit.runtime.engine import Runtime
from tests.dynamic_models import convnet

NCHW = ["b", "c", "h", "w"]


def _model(nodes, consts=None, x_dims=NCHW, x_type=TensorProto.FLOAT, out_type=TensorProto.FLOAT,
           opset=17) -> onnx.ModelProto:
    """One input "x" (dims `x_dims`, named dims dynamic), one output "y" of unknown shape."""
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in (consts or {}).items()]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", x_type, x_dims)],
                              [helper.make_tensor_value_info("y", out_type, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _feed(shape, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    if np.issubdtype(dtype, np.integer):
        return rng.integers(-9, 10, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _serves(model, profile, shapes, dtype=np.float32, atol=1e-5):
    """Build `model` on cpu for Profile `profile` of input "x" and run it at each of `shapes`
    against onnxruntime (shape and values)."""
    plan = build_plan(model, BuilderConfig(target="cpu", profiles=[Profile({"x": profile})],
                                           builder_optimization_level=0))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with Runtime().deserialize_engine(plan.serialize()) as engine, engine.create_execution_context() as ctx:
        for shape in shapes:
            feeds = {"x": _feed(shape, dtype)}
            got = ctx.execute(feeds)["y"]
            want = session.run(["y"], feeds)[0]
            assert got.shape == want.shape, (shape, got.shape, want.shape)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=atol, err_msg=str(shape))


# ---- cause 6: a dim the profile keeps fixed is that value ------------------------------------------
def test_model_dims_a_batch_only_profile_keeps_fixed_take_the_profile_value():
    model = _model([helper.make_node("Relu", ["x"], ["y"])])
    _serves(model, ((1, 4, 8, 8), (2, 4, 8, 8), (3, 4, 8, 8)), [(1, 4, 8, 8), (2, 4, 8, 8), (3, 4, 8, 8)])


def test_resnet_with_dynamic_image_dims_builds_for_a_batch_only_profile():
    model = convnet()
    plan = build_plan(model, BuilderConfig(target="cpu", builder_optimization_level=0,
                                           profiles=[Profile({"image": ((1, 3, 32, 32), (2, 3, 32, 32),
                                                                        (4, 3, 32, 32))})]))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with Runtime().deserialize_engine(plan.serialize()) as engine, engine.create_execution_context() as ctx:
        for batch in (1, 3, 4):
            feeds = {"image": _feed((batch, 3, 32, 32))}
            got = ctx.execute(feeds)["logits"]
            np.testing.assert_allclose(got, session.run(["logits"], feeds)[0], rtol=1e-4, atol=1e-4)


# ---- cause 1: Resize output dims are expressions of its input dims ------------------------------------
IMAGE_PROFILE = ((1, 3, 8, 8), (2, 3, 16, 16), (3, 3, 20, 20))
IMAGE_SHAPES = [(1, 3, 8, 8), (2, 3, 11, 13), (3, 3, 20, 20)]


@pytest.mark.parametrize("scale,mode", [(2.0, "nearest"), (0.5, "linear"), (1.5, "nearest"), (0.7, "linear")])
def test_resize_with_constant_scales_gives_floor_of_dim_times_scale(scale, mode):
    model = _model([helper.make_node("Resize", ["x", "", "scales"], ["y"], mode=mode)],
                   {"scales": np.array([1, 1, scale, scale], np.float32)})
    _serves(model, IMAGE_PROFILE, IMAGE_SHAPES)


def test_resize_of_chosen_axes_scales_only_those():
    model = _model([helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest", axes=[3, 2])],
                   {"scales": np.array([3.0, 2.0], np.float32)}, opset=18)
    _serves(model, IMAGE_PROFILE, IMAGE_SHAPES)


def test_resize_to_sizes_computed_from_shape_takes_their_expressions():
    # F.interpolate(x, size=(2h, w + 3)): Shape -> Slice -> Mul/Add -> Concat -> Resize(sizes)
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Slice", ["s", "zero", "two"], ["nc"]),
             helper.make_node("Gather", ["s", "two"], ["h"]), helper.make_node("Mul", ["h", "two"], ["h2"]),
             helper.make_node("Gather", ["s", "three"], ["w"]), helper.make_node("Add", ["w", "three"], ["w3"]),
             helper.make_node("Concat", ["nc", "h2", "w3"], ["sizes"], axis=0),
             helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="linear")]
    model = _model(nodes, {"zero": np.array([0]), "two": np.array([2]), "three": np.array([3])})
    _serves(model, IMAGE_PROFILE, IMAGE_SHAPES)


def test_resize_that_keeps_the_aspect_ratio_of_dynamic_dims_is_an_error_naming_the_resize():
    nodes = [helper.make_node("Resize", ["x", "", "", "sizes"], ["r"], mode="nearest", axes=[2, 3],
                              keep_aspect_ratio_policy="not_larger"),
             helper.make_node("Relu", ["r"], ["y"], name="after")]
    model = _model(nodes, {"sizes": np.array([32, 32])}, opset=18)
    with pytest.raises(ShapeError) as info:
        build_plan(model, BuilderConfig(target="cpu", profiles=[Profile({"x": IMAGE_PROFILE})]))
    assert "Resize" in info.value.where and "keep_aspect_ratio_policy" in info.value.what

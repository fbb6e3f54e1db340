"""Resize reference kernel (and the Upsample / Resize-10 import), checked against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.graph.evaluator import evaluate_graph
from polykit.compiler.ir.graph import Node
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.errors import ShapeError
from polykit.compiler.ops.references import run_reference

RNG = np.random.default_rng(9)


def _model(op, inputs, opset, **attrs):
    import onnx
    from onnx import helper, numpy_helper

    x = inputs[0]
    names = ["x"] + [f"c{i}" if v is not None else "" for i, v in enumerate(inputs[1:], 1)]
    inits = [numpy_helper.from_array(v, n) for n, v in zip(names[1:], inputs[1:]) if v is not None]
    node = helper.make_node(op, names, ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x.shape)],
                              [onnx.ValueInfoProto(name="y")], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def ort(op, inputs, opset=19, **attrs):
    import onnxruntime

    model = _model(op, inputs, opset, **attrs)
    sess = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": inputs[0]})[0]


def ours(op, inputs, opset=19, **attrs):
    """Import the one-node model (importers run) and evaluate it with the reference kernels."""
    graph = load_onnx(_model(op, inputs, opset, **attrs))
    (y,) = evaluate_graph(graph, {"x": inputs[0]}).values()
    assert graph.value(graph.outputs[0]).shape == y.shape
    return y


def run(inputs, **attrs):
    node = Node("Resize", [f"x{i}" if v is not None else "" for i, v in enumerate(inputs)], ["y"], attrs, "n")
    return run_reference(node, list(inputs))[0]


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def scales(*values):
    return np.array(values, np.float32)


def assert_close(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


COORDINATES = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "half_pixel_symmetric"]


@pytest.mark.parametrize("coordinates", COORDINATES)
@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("factors", [(1, 1, 1.7, 2.5), (1, 1, 0.6, 0.45)])
def test_resize_by_scales_matches_onnxruntime(mode, coordinates, factors):
    x = rand(1, 2, 6, 7)
    inputs = [x, None, scales(*factors)]
    attrs = {"mode": mode, "coordinate_transformation_mode": coordinates}
    assert_close(ours("Resize", inputs, **attrs), ort("Resize", inputs, **attrs))


@pytest.mark.parametrize("nearest_mode", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
def test_resize_nearest_modes_by_sizes_match_onnxruntime(nearest_mode):
    x = rand(1, 1, 5, 6)
    inputs = [x, None, None, np.array([1, 1, 8, 4], np.int64)]
    attrs = {"mode": "nearest", "nearest_mode": nearest_mode}
    assert_close(ours("Resize", inputs, **attrs), ort("Resize", inputs, **attrs))


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_antialias_downsampling_matches_onnxruntime(mode):
    x = rand(1, 2, 12, 10)
    inputs = [x, None, scales(1, 1, 0.4, 0.7)]
    assert_close(ours("Resize", inputs, mode=mode, antialias=1), ort("Resize", inputs, mode=mode, antialias=1))


def test_resize_cubic_exclude_outside_with_its_own_coefficient_matches_onnxruntime():
    x = rand(1, 1, 6, 6)
    inputs = [x, None, scales(1, 1, 1.6, 0.7)]
    attrs = {"mode": "cubic", "cubic_coeff_a": -0.5, "exclude_outside": 1}
    assert_close(ours("Resize", inputs, **attrs), ort("Resize", inputs, **attrs))


def test_resize_tf_crop_and_resize_fills_outside_the_roi_with_the_extrapolation_value():
    x = rand(1, 1, 6, 6)
    roi = np.array([0, 0, -0.2, 0.3, 1, 1, 0.6, 1.3], np.float32)
    inputs = [x, roi, None, np.array([1, 1, 5, 4], np.int64)]
    attrs = {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize", "extrapolation_value": 7.0}
    y = ours("Resize", inputs, **attrs)
    assert_close(y, ort("Resize", inputs, **attrs))
    assert (y == 7.0).any()


def test_resize_of_selected_axes_with_keep_aspect_ratio_matches_onnxruntime():
    x = rand(1, 2, 6, 9)
    inputs = [x, None, None, np.array([4, 12], np.int64)]
    attrs = {"mode": "linear", "axes": [3, 2], "keep_aspect_ratio_policy": "not_larger"}
    assert_close(ours("Resize", inputs, **attrs), ort("Resize", inputs, **attrs))


def test_resize_rounds_and_saturates_integer_outputs():
    x = np.array([[[[0, 255], [255, 0]]]], np.uint8)
    y = run([x, None, scales(1, 1, 2, 2)], mode="cubic")
    assert y.dtype == np.uint8
    assert_close(y.astype(np.float32), ort("Resize", [x.astype(np.float32), None, scales(1, 1, 2, 2)], mode="cubic")
                 .round().clip(0, 255))


def test_resize_with_both_scales_and_sizes_is_a_shape_error():
    with pytest.raises(ShapeError, match="exactly one"):
        run([rand(1, 1, 2, 2), None, scales(1, 1, 2, 2), np.array([1, 1, 4, 4], np.int64)])


@pytest.mark.parametrize("factors", [(1, 1, 2, 3), (1, 1, 0.6, 0.5), (1, 1, 0.6, 1.5)])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_10_imports_to_the_same_results_as_onnxruntime(factors, mode):
    x = rand(1, 2, 5, 7)
    inputs = [x, scales(*factors)]
    assert_close(ours("Resize", inputs, opset=10, mode=mode), ort("Resize", inputs, opset=10, mode=mode))


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_upsample_9_imports_to_the_same_results_as_onnxruntime(mode):
    x = rand(1, 2, 4, 3)
    inputs = [x, scales(1, 1, 1.5, 2.5)]
    assert_close(ours("Upsample", inputs, opset=9, mode=mode), ort("Upsample", inputs, opset=9, mode=mode))


def test_upsample_7_scales_attribute_imports_to_the_same_results_as_onnxruntime():
    x = rand(1, 2, 4, 3)
    attrs = {"mode": "nearest", "scales": [1.0, 1.0, 2.0, 3.0]}
    assert_close(ours("Upsample", [x], opset=7, **attrs), ort("Upsample", [x], opset=7, **attrs))

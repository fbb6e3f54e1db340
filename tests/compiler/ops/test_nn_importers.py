"""Importers of the nn family (old opsets -> the canonical form) and the light_* model zoo
models, which must import with exact shapes through these ops."""

from __future__ import annotations

import glob
import os

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from polykit.compiler.graph.onnx_import import load_onnx
from polykit.errors import NodeAttributeError

LIGHT_DIR = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
LIGHT_MODELS = sorted(os.path.basename(p)[len("light_"):-len(".onnx")] for p in glob.glob(f"{LIGHT_DIR}/light_*.onnx"))


def one_node_model(op, inputs, opset, inits=(), **attrs):
    """A model of one `op` node over float inputs {name: shape} and initializers."""
    node = helper.make_node(op, [*inputs, *(i.name for i in inits)], ["y"], **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, s) for n, s in inputs.items()],
        [onnx.ValueInfoProto(name="y")], list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7
    return model


def test_gemm_6_drops_the_broadcast_attribute():
    c = numpy_helper.from_array(np.ones(4, np.float32), "c")
    graph = load_onnx(one_node_model("Gemm", {"a": (2, 3), "b": (3, 4)}, 6, [c], broadcast=1))
    (node,) = graph.nodes
    assert "broadcast" not in node.attrs
    assert graph.value("y").shape == (2, 4)


def test_lp_pool_1_float_p_becomes_an_int():
    graph = load_onnx(one_node_model("LpPool", {"x": (1, 1, 4, 4)}, 1, kernel_shape=[2, 2], p=3.0))
    assert graph.nodes[0].attrs["p"] == 3


def test_upsample_7_becomes_an_asymmetric_floor_resize_with_a_constant_scales_input():
    graph = load_onnx(one_node_model("Upsample", {"x": ("N", 2, 3, 4)}, 7, mode="nearest", scales=[1.0, 1.0, 2.0, 3.0]))
    (node,) = graph.nodes
    assert node.op_type == "Resize" and node.inputs[1] == ""
    assert node.attrs == {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
    np.testing.assert_array_equal(graph.initializers[node.inputs[2]], [1, 1, 2, 3])
    assert graph.value("y").shape == ("N", 2, 6, 12)


def test_upsample_9_bilinear_mode_becomes_linear():
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "s")
    graph = load_onnx(one_node_model("Upsample", {"x": (1, 1, 2, 2)}, 9, [scales], mode="bilinear"))
    assert graph.nodes[0].attrs["mode"] == "linear"


def test_upsample_with_an_unknown_mode_is_an_attribute_error():
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "s")
    with pytest.raises(NodeAttributeError, match="mode"):
        load_onnx(one_node_model("Upsample", {"x": (1, 1, 2, 2)}, 9, [scales], mode="cubic"))


def test_resize_10_nearest_shrinking_and_growing_axes_split_into_ceil_then_floor_resizes():
    scales = numpy_helper.from_array(np.array([1, 1, 0.5, 2], np.float32), "s")
    graph = load_onnx(one_node_model("Resize", {"x": (1, 1, 4, 4)}, 10, [scales], mode="nearest"))
    first, second = graph.nodes
    assert (first.attrs["nearest_mode"], first.attrs["axes"]) == ("ceil", [2])
    assert (second.attrs["nearest_mode"], second.attrs["axes"]) == ("floor", [0, 1, 3])
    assert graph.value("y").shape == (1, 1, 2, 8)


def test_resize_11_empty_roi_and_scales_become_omitted_inputs():
    inits = [numpy_helper.from_array(np.zeros(0, np.float32), "roi"),
             numpy_helper.from_array(np.zeros(0, np.float32), "scales"),
             numpy_helper.from_array(np.array([1, 1, 6, 2], np.int64), "sizes")]
    graph = load_onnx(one_node_model("Resize", {"x": (1, 1, 3, 4)}, 11, inits, mode="linear"))
    assert graph.nodes[0].inputs == ["x", "", "", "sizes"]
    assert graph.value("y").shape == (1, 1, 6, 2)


def _expected_output(name: str) -> np.ndarray:
    return numpy_helper.to_array(onnx.load_tensor(os.path.join(LIGHT_DIR, f"light_{name}_output_0.pb")))


def test_the_light_model_zoo_is_present():
    assert len(LIGHT_MODELS) >= 9


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_model_imports_with_the_expected_output_shape(name):
    graph = load_onnx(os.path.join(LIGHT_DIR, f"light_{name}.onnx"))
    out = graph.value(graph.outputs[0])
    assert out.shape == _expected_output(name).shape
    assert out.dtype == np.float32


def test_light_squeezenet_runs_on_the_reference_kernels_to_its_expected_output():
    import time

    from polykit.compiler.graph.evaluator import evaluate_graph

    graph = load_onnx(os.path.join(LIGHT_DIR, "light_squeezenet.onnx"))
    shape = graph.value(graph.inputs[0]).shape
    n = int(np.prod(shape))
    feeds = {graph.inputs[0]: (np.arange(n).reshape(shape) / n).astype(np.float32)}  # the onnx runner's input
    start = time.process_time()  # this process's CPU time: a loaded machine stretches wall time
    (got,) = evaluate_graph(graph, feeds).values()
    assert time.process_time() - start < 10
    np.testing.assert_allclose(got, _expected_output("squeezenet"), rtol=1e-3, atol=1e-6)

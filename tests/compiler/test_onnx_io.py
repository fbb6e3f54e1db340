"""Import -> export round trips: checker-valid models with identical onnxruntime outputs."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.graph.onnx_export import save_onnx, to_onnx
from polykit.compiler.graph.onnx_import import load_onnx


def _run_ort(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _elementwise_model(opset=13):
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((1, 8)).astype(np.float32), "w")
    nodes = [
        helper.make_node("Add", ["x", "w"], ["a"], name="add"),
        helper.make_node("Erf", ["a"], ["b"], name="erf"),
        helper.make_node("Mul", ["b", "x"], ["c"], name="mul"),
        helper.make_node("Greater", ["c", "w"], ["y_mask"], name="gt"),
        helper.make_node("Where", ["y_mask", "c", "a"], ["y"], name="where"),
    ]
    g = helper.make_graph(
        nodes, "elementwise",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
        [w],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def test_import_keeps_symbolic_dims_and_infers_intermediate_shapes():
    g = load_onnx(_elementwise_model())
    assert g.value("x").shape == ("batch", 8)
    assert g.value("a").shape == ("batch", 8)
    assert g.value("y_mask").dtype == np.dtype(bool)


@pytest.mark.parametrize("opset", [9, 13, 17, 21])
def test_export_passes_checker_and_matches_onnxruntime(opset):
    model = _elementwise_model(opset)
    exported = to_onnx(load_onnx(model))
    onnx.checker.check_model(exported, full_check=True)
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    for a, b in zip(_run_ort(model, {"x": x}), _run_ort(exported, {"x": x})):
        np.testing.assert_array_equal(a, b)


def test_round_trip_keeps_names_initializers_and_metadata():
    model = _elementwise_model()
    model.producer_name = "unit-test"
    model.metadata_props.add(key="origin", value="tests")
    exported = to_onnx(load_onnx(model))
    assert [n.name for n in exported.graph.node] == [n.name for n in model.graph.node]
    assert {i.name for i in exported.graph.initializer} == {"w"}
    assert exported.producer_name == "unit-test"
    assert {p.key: p.value for p in exported.metadata_props} == {"origin": "tests"}


def test_external_data_round_trip(tmp_path):
    rng = np.random.default_rng(2)
    w = numpy_helper.from_array(rng.standard_normal((128, 128)).astype(np.float32), "big_w")
    g = helper.make_graph(
        [helper.make_node("Add", ["x", "big_w"], ["y"])], "ext",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [128, 128])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [128, 128])], [w],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    src = tmp_path / "src.onnx"
    onnx.save_model(model, str(src), save_as_external_data=True, location="src.data", size_threshold=0)
    graph = load_onnx(src)
    np.testing.assert_array_equal(graph.initializers["big_w"], numpy_helper.to_array(w))
    out = save_onnx(graph, tmp_path / "out.onnx", external_data=True, size_threshold=0)
    assert (tmp_path / "out.onnx.data").stat().st_size >= 128 * 128 * 4
    reloaded = onnx.load(str(out))
    onnx.checker.check_model(str(out))
    x = rng.standard_normal((128, 128)).astype(np.float32)
    np.testing.assert_array_equal(_run_ort(reloaded, {"x": x})[0], x + numpy_helper.to_array(w))


def test_unsorted_nodes_are_put_in_topological_order():
    model = _elementwise_model()
    nodes = list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(reversed(nodes))
    g = load_onnx(model)
    assert [n.name for n in g.nodes] == ["add", "erf", "mul", "gt", "where"]


def test_channels_last_graph_round_trips_through_onnx():
    from polykit.compiler.graph.evaluator import evaluate_graph
    from polykit.compiler.passes import optimize
    from tests.conv_models import resnet

    g = optimize(load_onnx(resnet(depths=(1, 1))), channels_last=True)
    exported = to_onnx(g)
    onnx.checker.check_model(exported)
    back = load_onnx(exported)
    assert [(n.domain, n.op_type) for n in back.nodes] == [(n.domain, n.op_type) for n in g.nodes]
    assert {"ConvNHWC", "MaxPoolNHWC"} <= {n.op_type for n in back.nodes}
    feeds = {"image": np.random.default_rng(2).standard_normal((2, 3, 32, 32)).astype(np.float32)}
    np.testing.assert_array_equal(evaluate_graph(back, feeds)["logits"], evaluate_graph(g, feeds)["logits"])

"""Bad models give a PolykitError that names the node or file -- never a bare Python error."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.onnx_import import load_onnx
from polykit.errors import (
    GraphError,
    ModelLoadError,
    NodeAttributeError,
    PolykitError,
    ShapeError,
    UnsupportedModelError,
)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name, shape=(2, 3), elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def test_malformed_protobuf_file_is_a_model_load_error_naming_the_file(tmp_path):
    path = tmp_path / "broken.onnx"
    path.write_bytes(b"\x08\x07\x12\xff\xff\xff garbage that is not a protobuf" * 3)
    with pytest.raises(ModelLoadError) as err:
        load_onnx(path)
    assert "broken.onnx" in str(err.value)


def test_missing_model_file_is_a_model_load_error(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_onnx(tmp_path / "nope.onnx")


def test_dangling_input_name_is_a_graph_error_naming_the_node():
    m = _model([helper.make_node("Add", ["x", "ghost"], ["y"], name="add0")], [_vi("x")], [_vi("y")])
    with pytest.raises(GraphError) as err:
        load_onnx(m)
    assert "add0" in str(err.value) and "ghost" in str(err.value)


def test_cycle_is_a_graph_error_naming_the_nodes():
    nodes = [
        helper.make_node("Add", ["x", "b"], ["a"], name="n_a"),
        helper.make_node("Relu", ["a"], ["b"], name="n_b"),
        helper.make_node("Identity", ["a"], ["y"], name="n_y"),
    ]
    with pytest.raises(GraphError, match="cycle") as err:
        load_onnx(_model(nodes, [_vi("x")], [_vi("y")]))
    assert "n_a" in str(err.value)


def test_duplicate_producer_is_a_graph_error():
    nodes = [
        helper.make_node("Neg", ["x"], ["t"], name="first"),
        helper.make_node("Abs", ["x"], ["t"], name="second"),
        helper.make_node("Identity", ["t"], ["y"], name="out"),
    ]
    with pytest.raises(GraphError, match="also by"):
        load_onnx(_model(nodes, [_vi("x")], [_vi("y")]))


def test_wrong_attribute_type_is_an_attribute_error_naming_the_node():
    node = helper.make_node("Mod", ["x", "x"], ["y"], name="modnode")
    node.attribute.append(helper.make_attribute("fmod", 1.5))  # schema wants INT
    with pytest.raises(NodeAttributeError) as err:
        load_onnx(_model([node], [_vi("x")], [_vi("y")]))
    assert "modnode" in str(err.value) and "fmod" in str(err.value)


def test_broadcast_mismatch_is_a_shape_error_naming_the_node():
    node = helper.make_node("Add", ["x", "w"], ["y"], name="bad_add")
    m = _model([node], [_vi("x", (2, 3)), _vi("w", (4, 5))], [_vi("y", None)])
    with pytest.raises(ShapeError) as err:
        load_onnx(m)
    assert "bad_add" in str(err.value)


def test_unsupported_model_lists_every_unsupported_node():
    nodes = [
        helper.make_node("Add", ["x", "x"], ["a"], name="fine"),
        helper.make_node("FancyOp", ["a"], ["b"], name="first_bad", domain="com.example"),
        helper.make_node("OtherOp", ["b"], ["y"], name="second_bad", domain="com.example"),
    ]
    m = helper.make_model(
        helper.make_graph(nodes, "g", [_vi("x")], [_vi("y", None)]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)],
    )
    with pytest.raises(UnsupportedModelError) as err:
        load_onnx(m)
    text = str(err.value)
    assert "first_bad" in text and "second_bad" in text and "FancyOp" in text and "OtherOp" in text
    assert "fine" not in text
    assert len(err.value.unsupported) == 2


def test_missing_external_data_is_a_model_load_error_naming_the_file(tmp_path):
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32), "w")
    m = _model([helper.make_node("Add", ["x", "w"], ["y"])], [_vi("x", (64, 64))], [_vi("y", (64, 64))], [w])
    path = tmp_path / "m.onnx"
    onnx.save_model(m, str(path), save_as_external_data=True, location="m.weights", size_threshold=0)
    (tmp_path / "m.weights").unlink()
    with pytest.raises(ModelLoadError) as err:
        load_onnx(path)
    assert "m.weights" in str(err.value)


def test_truncated_external_data_is_a_model_load_error(tmp_path):
    w = numpy_helper.from_array(np.random.default_rng(1).standard_normal((64, 64)).astype(np.float32), "w")
    m = _model([helper.make_node("Add", ["x", "w"], ["y"])], [_vi("x", (64, 64))], [_vi("y", (64, 64))], [w])
    path = tmp_path / "m.onnx"
    onnx.save_model(m, str(path), save_as_external_data=True, location="m.weights", size_threshold=0)
    data = (tmp_path / "m.weights").read_bytes()
    (tmp_path / "m.weights").write_bytes(data[:100])
    with pytest.raises(ModelLoadError, match="truncated"):
        load_onnx(path)


def test_every_import_error_is_a_polykit_error_with_a_hint():
    node = helper.make_node("Add", ["x", "missing"], ["y"])
    with pytest.raises(PolykitError) as err:
        load_onnx(_model([node], [_vi("x")], [_vi("y")]))
    assert err.value.hint

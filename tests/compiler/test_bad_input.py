"""Bad models give a PolykitError that names the node or file -- never a bare Python error."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.graph.onnx_import import load_onnx
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


@pytest.mark.parametrize("content, message", [
    (b"", "does not have an ir_version set properly"),
    (b"\x08\x07", "must specify opset_import"),
])
def test_a_file_onnx_checker_rejects_is_a_model_load_error_with_its_message(tmp_path, content, message):
    path = tmp_path / "tiny.onnx"
    path.write_bytes(content)
    with pytest.raises(ModelLoadError, match=f"tiny.onnx: the model is not valid ONNX: .*{message}"):
        load_onnx(path)


def test_a_model_without_a_graph_is_rejected_with_the_checkers_message():
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x")], [_vi("y")])
    m.ClearField("graph")
    with pytest.raises(ModelLoadError, match="Field 'name' of 'graph' is required"):
        load_onnx(m)


def test_a_model_without_outputs_is_rejected():
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x")], [])
    with pytest.raises(ModelLoadError, match="the model's graph has no outputs"):
        load_onnx(m)


def test_a_directory_given_as_the_model_is_named_a_directory(tmp_path):
    with pytest.raises(ModelLoadError, match="is a directory, not a file"):
        load_onnx(tmp_path)


def test_external_data_outside_the_model_folder_is_refused(tmp_path):
    w = numpy_helper.from_array(np.random.default_rng(2).standard_normal((4, 4)).astype(np.float32), "w")
    m = _model([helper.make_node("Add", ["x", "w"], ["y"])], [_vi("x", (4, 4))], [_vi("y", (4, 4))], [w])
    (tmp_path / "models").mkdir()
    path = tmp_path / "models" / "m.onnx"
    onnx.save_model(m, str(path), save_as_external_data=True, location="m.weights", size_threshold=0)
    (tmp_path / "models" / "m.weights").rename(tmp_path / "secret.bin")
    model = onnx.load(str(path), load_external_data=False)
    for entry in model.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = "../secret.bin"
    onnx.save_model(model, str(path))
    with pytest.raises(ModelLoadError, match="lies outside the model's folder"):
        load_onnx(path)


def test_a_non_numeric_external_data_offset_is_a_model_load_error(tmp_path):
    w = numpy_helper.from_array(np.random.default_rng(3).standard_normal((4, 4)).astype(np.float32), "w")
    m = _model([helper.make_node("Add", ["x", "w"], ["y"])], [_vi("x", (4, 4))], [_vi("y", (4, 4))], [w])
    path = tmp_path / "m.onnx"
    onnx.save_model(m, str(path), save_as_external_data=True, location="m.weights", size_threshold=0)
    model = onnx.load(str(path), load_external_data=False)
    model.graph.initializer[0].external_data.add(key="offset", value="-5")
    onnx.save_model(model, str(path))
    with pytest.raises(ModelLoadError, match="external data offset '-5' of tensor 'w' is not a non-negative integer"):
        load_onnx(path)


def test_a_graph_input_listed_twice_is_a_graph_error():
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x"), _vi("x")], [_vi("y")])
    with pytest.raises(GraphError, match="graph input 'x' is listed more than once"):
        load_onnx(m)


def test_a_node_output_that_is_also_an_initializer_is_a_graph_error():
    c = numpy_helper.from_array(np.ones((2, 3), np.float32), "r")
    m = _model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"])], [_vi("x")], [_vi("y")], [c])
    with pytest.raises(GraphError, match="tensor 'r' is both an initializer and the output of a node"):
        load_onnx(m)


def test_a_negative_dim_value_is_an_unknown_dim():
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", (-1, 3))], [_vi("y", (-1, 3))])
    assert load_onnx(m).value("x").shape == (None, 3)


def test_an_initializers_array_wins_over_a_conflicting_value_info():
    c = numpy_helper.from_array(np.ones((5, 4), np.float32), "c")
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", (5, 4))], [_vi("y", (5, 4)), _vi("c", (3, 4))], [c])
    assert load_onnx(m).value("c").shape == (5, 4)


def test_a_name_that_is_not_utf8_is_a_model_load_error(tmp_path):
    m = _model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [_vi("x")], [_vi("y")])
    data = m.SerializeToString().replace(b"relu", b"r\xe5lu")
    path = tmp_path / "bad_text.onnx"
    path.write_bytes(data)
    with pytest.raises(ModelLoadError, match=r"model.graph.node\[0\].name is not valid UTF-8"):
        load_onnx(path)


def test_every_import_error_is_a_polykit_error_with_a_hint():
    node = helper.make_node("Add", ["x", "missing"], ["y"])
    with pytest.raises(PolykitError) as err:
        load_onnx(_model([node], [_vi("x")], [_vi("y")]))
    assert err.value.hint

"""Old-opset forms of the tensor ops are imported into the one canonical form (opset 21),
compute what the old model computed, and export as valid ONNX."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from polykit.compiler.ir import dtypes
from polykit.compiler.graph.evaluator import evaluate_graph
from polykit.compiler.graph.onnx_export import to_onnx
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.errors import NodeAttributeError, PolykitError

RNG = np.random.default_rng(21)


def make_model(nodes, feeds: dict, outputs, opset: int, initializers: dict | None = None):
    inputs = [helper.make_tensor_value_info(k, dtypes.to_onnx(v.dtype), v.shape) for k, v in feeds.items()]
    graph = helper.make_graph(
        nodes, "g", inputs, [onnx.ValueInfoProto(name=o) for o in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in (initializers or {}).items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7
    return model


def run_polykit(model, feeds: dict):
    graph = load_onnx(model)
    return graph, list(evaluate_graph(graph, feeds).values())


def run_ort(model, feeds: dict):
    import onnxruntime

    sess = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def assert_same(ours, theirs):
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)


def check_against_ort(model, feeds):
    graph, ours = run_polykit(model, feeds)
    assert_same(ours, run_ort(model, feeds))
    return graph


def only_node(graph, op_type):
    nodes = [n for n in graph.nodes if n.op_type == op_type]
    assert len(nodes) == 1
    return nodes[0]


def test_reshape_v4_shape_attribute_becomes_an_input():
    x = RNG.standard_normal((2, 6)).astype(np.float32)
    model = make_model([helper.make_node("Reshape", ["x"], ["y"], shape=[3, -1])], {"x": x}, ["y"], opset=4)
    graph, (y,) = run_polykit(model, {"x": x})
    node = only_node(graph, "Reshape")
    assert "shape" not in node.attrs and len(node.inputs) == 2
    np.testing.assert_array_equal(y, x.reshape(3, 4))
    assert graph.value("y").shape == (3, 4)


@pytest.mark.parametrize("op,axes,shape", [("Squeeze", [0, -1], (1, 3, 1)), ("Unsqueeze", [-1, 0], (3, 2))])
def test_axes_attribute_before_opset_13_becomes_an_input(op, axes, shape):
    x = RNG.standard_normal(shape).astype(np.float32)
    model = make_model([helper.make_node(op, ["x"], ["y"], axes=axes)], {"x": x}, ["y"], opset=11)
    graph = check_against_ort(model, {"x": x})
    assert "axes" not in only_node(graph, op).attrs


def test_split_v11_split_attribute_becomes_an_input():
    x = RNG.standard_normal((2, 7)).astype(np.float32)
    node = helper.make_node("Split", ["x"], ["a", "b"], axis=-1, split=[3, 4])
    graph = check_against_ort(make_model([node], {"x": x}, ["a", "b"], opset=11), {"x": x})
    assert [graph.value(o).shape for o in ("a", "b")] == [(2, 3), (2, 4)]


def test_split_v13_without_sizes_splits_equally():
    x = RNG.standard_normal((6, 2)).astype(np.float32)
    node = helper.make_node("Split", ["x"], ["a", "b", "c"])
    check_against_ort(make_model([node], {"x": x}, ["a", "b", "c"], opset=13), {"x": x})


def test_slice_v9_attributes_become_inputs():
    x = RNG.standard_normal((4, 5, 6)).astype(np.float32)
    node = helper.make_node("Slice", ["x"], ["y"], starts=[1, -4], ends=[100, -1], axes=[0, 2])
    graph = check_against_ort(make_model([node], {"x": x}, ["y"], opset=9), {"x": x})
    assert graph.value("y").shape == (3, 5, 3)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad_v2_attributes_become_inputs(mode):
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    node = helper.make_node("Pad", ["x"], ["y"], pads=[1, 0, 2, 3], mode=mode, value=1.5)
    graph = check_against_ort(make_model([node], {"x": x}, ["y"], opset=10), {"x": x})
    assert graph.value("y").shape == (6, 7)


def test_pad_v2_value_on_a_tensor_of_unknown_dtype_goes_through_cast_like():
    x = RNG.standard_normal((2, 3))  # float64: a dtype the importer cannot see behind the Identity
    nodes = [helper.make_node("Identity", ["x"], ["t"]), helper.make_node("Pad", ["t"], ["y"], pads=[0, 1, 0, 1], value=7.0)]
    graph = check_against_ort(make_model(nodes, {"x": x}, ["y"], opset=10), {"x": x})
    assert only_node(graph, "CastLike").inputs[1] == "t"


def test_scatter_becomes_scatter_elements():
    x = np.zeros((3, 3), np.float32)
    idx, upd = np.array([[1, 0, 2]], np.int64), RNG.standard_normal((1, 3)).astype(np.float32)
    node = helper.make_node("Scatter", ["x", "i", "u"], ["y"], axis=0)
    graph = check_against_ort(make_model([node], {"x": x, "i": idx, "u": upd}, ["y"], opset=9), {"x": x, "i": idx, "u": upd})
    assert [n.op_type for n in graph.nodes] == ["ScatterElements"]


def test_dropout_v7_ratio_attribute_and_float_mask():
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    node = helper.make_node("Dropout", ["x"], ["y", "mask"], ratio=0.3)
    graph, (y, mask) = run_polykit(make_model([node], {"x": x}, ["y", "mask"], opset=7), {"x": x})
    np.testing.assert_array_equal(y, x)
    # every element is kept in inference; (onnxruntime fills old-opset masks with 0 instead)
    assert mask.dtype == np.float32 and (mask == 1).all()
    assert graph.value("mask").dtype == np.float32


def test_dropout_v10_bool_mask_needs_no_cast():
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    node = helper.make_node("Dropout", ["x"], ["y", "mask"], ratio=0.3)
    graph, (y, mask) = run_polykit(make_model([node], {"x": x}, ["y", "mask"], opset=10), {"x": x})
    assert [n.op_type for n in graph.nodes] == ["Dropout"]
    assert mask.dtype == np.bool_ and mask.all()


def test_dropout_v6_is_test_attribute_is_dropped():
    x = RNG.standard_normal((2, 2)).astype(np.float32)
    node = helper.make_node("Dropout", ["x"], ["y"], is_test=1, ratio=0.5)
    graph, (y,) = run_polykit(make_model([node], {"x": x}, ["y"], opset=6), {"x": x})
    np.testing.assert_array_equal(y, x)
    assert "is_test" not in only_node(graph, "Dropout").attrs


def test_cast_v5_type_name_becomes_the_type_code():
    x = np.array([1.7, -2.2], np.float32)
    node = helper.make_node("Cast", ["x"], ["y"], to="INT32")
    graph, (y,) = run_polykit(make_model([node], {"x": x}, ["y"], opset=5), {"x": x})
    assert only_node(graph, "Cast").attrs["to"] == onnx.TensorProto.INT32
    np.testing.assert_array_equal(y, np.array([1, -2], np.int32))


def test_cast_to_an_unknown_type_name_is_an_attribute_error():
    x = np.ones(2, np.float32)
    model = make_model([helper.make_node("Cast", ["x"], ["y"], to="QUATERNION")], {"x": x}, ["y"], opset=5)
    with pytest.raises(NodeAttributeError, match="QUATERNION"):
        load_onnx(model)


def test_cast_to_complex64_is_refused_at_import():
    x = np.ones(2, np.float32)
    model = make_model([helper.make_node("Cast", ["x"], ["y"], to=onnx.TensorProto.COMPLEX64)], {"x": x}, ["y"], opset=21)
    with pytest.raises(PolykitError, match="COMPLEX64"):
        load_onnx(model)


def test_concat_v3_without_axis_joins_axis_1():
    a, b = RNG.standard_normal((2, 1)).astype(np.float32), RNG.standard_normal((2, 3)).astype(np.float32)
    node = helper.make_node("Concat", ["a", "b"], ["y"])
    _, (y,) = run_polykit(make_model([node], {"a": a, "b": b}, ["y"], opset=3), {"a": a, "b": b})
    np.testing.assert_array_equal(y, np.concatenate([a, b], axis=1))


def test_tile_v5_tiles_and_axis_become_repeats():
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    node = helper.make_node("Tile", ["x", "tiles", "axis"], ["y"])
    model = make_model([node], {"x": x}, ["y"], opset=5, initializers={"tiles": np.array(3, np.int64), "axis": np.array(1, np.int64)})
    graph, (y,) = run_polykit(model, {"x": x})
    np.testing.assert_array_equal(y, np.tile(x, (1, 3)))
    assert graph.value("y").shape == (2, 9)


def test_constant_value_ints_becomes_a_value_tensor():
    node = helper.make_node("Constant", [], ["c"], value_ints=[4, 5, 6])
    graph, (c,) = run_polykit(make_model([node], {}, ["c"], opset=13), {})
    assert set(only_node(graph, "Constant").attrs) == {"value"}
    np.testing.assert_array_equal(c, np.array([4, 5, 6], np.int64))


def test_constant_sparse_value_becomes_dense():
    sparse = helper.make_sparse_tensor(
        numpy_helper.from_array(np.array([2.0, 3.0], np.float32), "v"), numpy_helper.from_array(np.array([1, 4], np.int64), "i"), [2, 3])
    node = helper.make_node("Constant", [], ["c"], sparse_value=sparse)
    _, (c,) = run_polykit(make_model([node], {}, ["c"], opset=13), {})
    np.testing.assert_array_equal(c, np.array([[0, 2, 0], [0, 3, 0]], np.float32))


OLD_MODELS = {
    "reshape_v4": lambda x: make_model([helper.make_node("Reshape", ["x"], ["y"], shape=[-1])], {"x": x}, ["y"], opset=4),
    "squeeze_v11": lambda x: make_model([helper.make_node("Unsqueeze", ["x"], ["y"], axes=[0])], {"x": x}, ["y"], opset=11),
    "slice_v9": lambda x: make_model([helper.make_node("Slice", ["x"], ["y"], starts=[1], ends=[2])], {"x": x}, ["y"], opset=9),
    "pad_v2": lambda x: make_model([helper.make_node("Pad", ["x"], ["y"], pads=[1, 1, 1, 1], value=2.0)], {"x": x}, ["y"], opset=2),
    "dropout_v7": lambda x: make_model([helper.make_node("Dropout", ["x"], ["y"], ratio=0.1)], {"x": x}, ["y"], opset=7),
    "split_v2": lambda x: make_model([helper.make_node("Split", ["x"], ["a", "b"], split=[1, 2])], {"x": x}, ["a", "b"], opset=2),
}


@pytest.mark.parametrize("name", sorted(OLD_MODELS))
def test_canonical_graph_exports_as_a_valid_opset_21_model(name):
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    graph = load_onnx(OLD_MODELS[name](x))
    exported = to_onnx(graph)
    onnx.checker.check_model(exported, full_check=True)
    assert {o.domain: o.version for o in exported.opset_import}[""] == 21
    assert_same(run_ort(exported, {"x": x}), run_polykit(OLD_MODELS[name](x), {"x": x})[1])

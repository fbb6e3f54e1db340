"""value_ranges reads each shape-tensor input's range from the ops that consume it."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from polykit.compiler.builder.builder import apply_input_shapes
from polykit.compiler.graph.infer import infer_shapes
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.compiler.builder.value_ranges import UNBOUNDED, ruled_profile, value_ranges


def _graph(nodes, ints: dict[str, list[int]]):
    g = helper.make_graph(nodes, "ranges",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])]
                          + [helper.make_tensor_value_info(n, TensorProto.INT64, s) for n, s in ints.items()],
                          [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for n in nodes for o in n.output])
    graph = load_onnx(helper.make_model(g, ir_version=10, opset_imports=[helper.make_opsetid("", 18)]))
    apply_input_shapes(graph, {})
    infer_shapes(graph, strict=False)
    return graph


def test_each_consumer_gives_its_operand_range():
    graph = _graph([helper.make_node("Reshape", ["x", "shape"], ["r"]),
                    helper.make_node("TopK", ["x", "k"], ["t", "i"], axis=1),
                    helper.make_node("ReduceSum", ["x", "axes"], ["s"]),
                    helper.make_node("Unsqueeze", ["x", "uaxes"], ["u"]),
                    helper.make_node("Split", ["x", "split"], ["a", "b"], axis=2),
                    helper.make_node("Pad", ["x", "pads"], ["p"])],
                   {"shape": [2], "k": [1], "axes": [2], "uaxes": [2], "split": [2], "pads": [6]})
    assert value_ranges(graph) == {"shape": ((-1, 24),) * 2, "k": ((0, 3),), "axes": ((-3, 2),) * 2,
                                   "uaxes": ((-5, 4),) * 2, "split": ((0, 4),) * 2, "pads": (UNBOUNDED,) * 6}


def test_an_input_used_twice_gets_the_intersection():
    graph = _graph([helper.make_node("TopK", ["x", "k"], ["t", "i"], axis=0),
                    helper.make_node("TopK", ["x", "k"], ["t2", "i2"], axis=2)], {"k": [1]})
    assert value_ranges(graph) == {"k": ((0, 2),)}


def test_an_integer_input_used_only_as_data_is_no_shape_tensor_input():
    graph = _graph([helper.make_node("Reshape", ["x", "shape"], ["r"]),
                    helper.make_node("Cast", ["shape"], ["f"], to=TensorProto.FLOAT),
                    helper.make_node("Mul", ["f", "x"], ["m"]),
                    helper.make_node("Cast", ["data"], ["g"], to=TensorProto.FLOAT),
                    helper.make_node("Mul", ["g", "x"], ["n"])], {"shape": [4], "data": [4]})
    assert value_ranges(graph) == {"shape": ((-1, 24),) * 4}  # data uses of a shape-tensor input are allowed


def test_ruled_profile_puts_opt_at_the_feed_and_refuses_a_value_outside_the_range():
    graph = _graph([helper.make_node("TopK", ["x", "k"], ["t", "i"], axis=-1)], {"k": [1]})
    shapes = {"x": (2, 3, 4), "k": (1,)}
    profile = ruled_profile(graph, shapes, {"k": np.array([3])})
    assert profile.values == {"k": ((0,), (3,), (4,))} and profile.ruled == ("k",)
    assert ruled_profile(graph, shapes, {"k": np.array([7])}) is None


def _float_graph(nodes, floats: dict[str, list[int]]):
    g = helper.make_graph(nodes, "ranges",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3, 4])]
                          + [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in floats.items()],
                          [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for n in nodes for o in n.output])
    graph = load_onnx(helper.make_model(g, ir_version=10, opset_imports=[helper.make_opsetid("", 18)]))
    apply_input_shapes(graph, {})
    infer_shapes(graph, strict=False)
    return graph


def test_a_float_shape_operand_gets_a_float_domain():
    graph = _float_graph([helper.make_node("Resize", ["x", "", "scales"], ["r"]),
                          helper.make_node("Range", ["a", "b", "c"], ["g"])],
                         {"scales": [4], "a": [], "b": [], "c": []})
    assert value_ranges(graph) == {"scales": ((0.0, float(UNBOUNDED[1])),) * 4, "a": (tuple(map(float, UNBOUNDED)),),
                                   "b": (tuple(map(float, UNBOUNDED)),), "c": (tuple(map(float, UNBOUNDED)),)}
    profile = ruled_profile(graph, {"x": (1, 2, 3, 4), "scales": (4,), "a": (), "b": (), "c": ()},
                            {"scales": np.array([1, 1, 0.5, 2.5], np.float32), "a": np.float32(0),
                             "b": np.float32(3), "c": np.float32(0.5)})
    assert profile.values["scales"][1] == (1.0, 1.0, 0.5, 2.5) and set(profile.ruled) == {"scales", "a", "b", "c"}


def test_a_float_input_read_by_a_shape_chain_or_as_data_is_no_shape_tensor_input():
    graph = _float_graph([helper.make_node("Resize", ["x", "", "scales"], ["r"]),
                          helper.make_node("Mul", ["scales", "scales"], ["m"]),
                          helper.make_node("Range", ["a", "b", "c"], ["g"]),
                          helper.make_node("Cast", ["a"], ["i"], to=TensorProto.INT64)],
                         {"scales": [4], "a": [], "b": [], "c": []})
    assert sorted(value_ranges(graph)) == ["b", "c"]


def test_split_to_sequence_sizes_range_over_the_axis_and_a_chunk_size_over_positive_ints():
    # the pieces of a 1-D split are as many as its entries (a ruled Split); a scalar chunk size decides
    # how many pieces there are (the plan holds the axis' length of them and a run-time length)
    nodes = [helper.make_node("SplitToSequence", ["x", "sizes"], ["s1"], axis=2),
             helper.make_node("SplitToSequence", ["x", "chunk"], ["s2"], axis=1)]
    g = helper.make_graph(nodes, "ranges",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4]),
                           helper.make_tensor_value_info("sizes", TensorProto.INT64, [3]),
                           helper.make_tensor_value_info("chunk", TensorProto.INT64, [])],
                          [helper.make_tensor_sequence_value_info(o, TensorProto.FLOAT, None) for o in ("s1", "s2")])
    graph = load_onnx(helper.make_model(g, ir_version=10, opset_imports=[helper.make_opsetid("", 18)]))
    apply_input_shapes(graph, {})
    infer_shapes(graph, strict=False)
    assert value_ranges(graph) == {"sizes": ((0, 4),) * 3, "chunk": ((1, UNBOUNDED[1]),)}

"""benchmarks/zoo_check.py's traffic yardstick: views cost nothing, a gather reads the rows it
gathers, a PermutedCopy is movement (a plan built here for the cuda target, no GPU needed)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from benchmarks.zoo_check import movement_layers, traffic
from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig


def test_a_reshape_view_is_free_and_an_embedding_gather_reads_its_rows(tmp_path):
    table = helper.make_tensor("table", TensorProto.FLOAT, [1000, 64], np.zeros(64000, np.float32))
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["e"]),
         helper.make_node("Reshape", ["e", "shape"], ["r"]),
         helper.make_node("Relu", ["r"], ["y"])],
        "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 8, 8])],
        [table, helper.make_tensor("shape", TensorProto.INT64, [3], [8, 8, 8])])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    plan = build_plan(str(path), BuilderConfig(target="cuda", builder_optimization_level=0))
    t = traffic(plan)
    assert "Reshape" in {l.kind for l in plan.layers} and "Reshape" not in t["traffic_by_kind_mb"]
    # the gathered rows (8 x 64 floats) twice and the ids, not the 256 KB table
    assert t["traffic_by_kind_mb"]["Gather"] < 0.01


def _reshaped_plan(tmp_path, first: str, x_shape: list[int], y_shape: list[int], last: str = ""):
    """The cuda level-0 plan of x -> `first` -> Reshape to `y_shape` [-> `last`] -> y."""
    nodes = [helper.make_node(first, ["x"], ["a"], **({"perm": [1, 0]} if first == "Transpose" else {})),
             helper.make_node("Reshape", ["a", "shape"], ["r" if last else "y"])]
    nodes += [helper.make_node(last, ["r"], ["y"])] if last else []
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
                              [helper.make_tensor("shape", TensorProto.INT64, [len(y_shape)], y_shape)])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return build_plan(str(path), BuilderConfig(target="cuda", builder_optimization_level=0))


def test_a_reshape_writing_an_engine_output_is_free_when_its_source_shares_the_output(tmp_path):
    plan = _reshaped_plan(tmp_path, "Relu", [64, 64], [8, 8, 64])
    assert plan.memory.aliases == {"a": "y"} and "Reshape" not in traffic(plan)["traffic_by_kind_mb"]
    assert movement_layers(plan) == {"movement_views": 1, "movement_copies": {}}


def test_movement_layers_counts_views_apart_from_the_copies_and_their_bytes(tmp_path):
    plan = _reshaped_plan(tmp_path, "Transpose", [64, 32], [8, 4, 64], last="Relu")
    assert movement_layers(plan) == {"movement_views": 1, "movement_copies": {"Transpose": [1, 64 * 32 * 4]}}


def test_a_slice_reads_only_its_window(tmp_path):
    consts = [helper.make_tensor(n, TensorProto.INT64, [1], [v]) for n, v in (("s", 0), ("e", 2), ("a", 0))]
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Slice", ["r", "s", "e", "a"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1000, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])], consts)
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    t = traffic(build_plan(str(path), BuilderConfig(target="cuda", builder_optimization_level=0)))
    assert t["traffic_by_kind_mb"]["Slice"] < 0.01  # 2 x 64 floats read and written, not the 256 KB input

"""`polykit inspect capability MODEL`: which nodes run on a target, why the others do not, the
supported partitions, and -o writing them as ONNX models that onnx.checker and onnxruntime take."""

from __future__ import annotations

import json
import logging

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from polykit.tools.model.capability import check_capability
from polykit.tools.cli.app import main
from tests.cli_models import MLP, dynamic_model, save

pytestmark = pytest.mark.usefixtures("fresh_plugins")
vi = helper.make_tensor_value_info


def _double_model(path) -> str:
    """y = Tanh(Relu(x) + Relu(x) @ Relu(x)) in float64: the cuda target has no float64 MatMul, so the
    supported Relu and Add must not share a partition (the path Relu -> MatMul -> Add would leave it)."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"), helper.make_node("MatMul", ["a", "a"], ["u"], name="matmul"),
             helper.make_node("Add", ["a", "u"], ["b"], name="add"), helper.make_node("Tanh", ["b"], ["y"], name="tanh")]
    graph = helper.make_graph(nodes, "double", [vi("x", TensorProto.DOUBLE, [4, 4])], [vi("y", TensorProto.DOUBLE, [4, 4])])
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def _custom_op_model(path) -> str:
    """Relu -> my.domain::Foo (no implementation) -> Relu."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="first"),
             helper.make_node("Foo", ["a"], ["b"], name="foo", domain="my.domain"),
             helper.make_node("Relu", ["b"], ["y"], name="second")]
    graph = helper.make_graph(nodes, "custom", [vi("x", TensorProto.FLOAT, [4])], [vi("y", TensorProto.FLOAT, [4])])
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("my.domain", 1)]),
                path)


def test_every_mlp_node_runs_on_both_targets_in_one_partition():
    for target in ("cpu", "cuda"):
        report, _ = check_capability(str(MLP), target)
        assert report.supported == len(report.nodes) == 4
        (part,) = report.partitions
        assert part.nodes == ("fc1", "relu1", "fc2", "softmax") and part.inputs == ("x",)
        assert part.outputs == ("logits", "probs")
        assert all(n.tactics for n in report.nodes)


def test_a_node_without_a_tactic_names_the_reason_and_splits_the_partitions(tmp_path):
    report, _ = check_capability(_double_model(tmp_path / "d.onnx"), "cuda")
    matmul = next(n for n in report.nodes if n.name == "matmul")
    assert not matmul.supported and "no cuda tactic accepts it (inputs float64[4, 4], float64[4, 4])" in matmul.reason
    assert [p.nodes for p in report.partitions] == [("relu",), ("add", "tanh")]
    assert report.partitions[1].inputs == ("a", "u") and report.partitions[1].outputs == ("y",)
    cpu, _ = check_capability(_double_model(tmp_path / "d.onnx"), "cpu")
    assert cpu.supported == 4 and len(cpu.partitions) == 1


def test_written_partitions_pass_the_checker_and_compute_the_models_values_in_onnxruntime(tmp_path, capsys):
    model = _double_model(tmp_path / "d.onnx")
    assert main(["inspect", "capability", model, "--target", "cuda", "-o", str(tmp_path / "parts"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    files = [p["file"] for p in doc["partitions"]]
    assert files == [str(tmp_path / "parts" / f"partition_{i}.onnx") for i in range(2)]
    x = np.random.default_rng(2).normal(size=(4, 4))
    a = np.maximum(x, 0)
    for path, part in zip(files, doc["partitions"]):
        onnx.checker.check_model(onnx.load(path), full_check=True)
        assert [n.name for n in onnx.load(path).graph.node] == part["nodes"]
    (first,) = ort.InferenceSession(files[0]).run(None, {"x": x})
    (y,) = ort.InferenceSession(files[1]).run(None, {"a": a, "u": a @ a})
    np.testing.assert_array_equal(first, a)
    np.testing.assert_allclose(y, np.tanh(a + a @ a), rtol=1e-12)


def test_a_written_partition_reads_folded_constants_as_initializers_at_the_shapes_judged(tmp_path, capsys):
    """y = Reshape(Relu(x), Shape(x) * 1) with x [N, 4]: at --input-shapes x:[3,4] the shape
    subgraph folds, so the partition is Relu + Reshape with the shape [3, 4] as a weight."""
    one = helper.make_tensor("one", TensorProto.INT64, [1], [1])
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"), helper.make_node("Mul", ["s", "one"], ["s1"], name="mul"),
             helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("Reshape", ["r", "s1"], ["y"], name="reshape")]
    graph = helper.make_graph(nodes, "fold", [vi("x", TensorProto.FLOAT, ["N", 4])], [vi("y", TensorProto.FLOAT, ["N", 4])],
                              [one])
    model = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "f.onnx")
    assert main(["inspect", "capability", model, "--target", "cpu", "--input-shapes", "x:[3,4]", "-o",
                 str(tmp_path / "parts"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["folded"] == 2 and [p["nodes"] for p in doc["partitions"]] == [["relu", "reshape"]]
    part = onnx.load(doc["partitions"][0]["file"])
    onnx.checker.check_model(part, full_check=True)
    assert [n.name for n in part.graph.node] == ["relu", "reshape"] and [i.name for i in part.graph.input] == ["x"]
    assert [d.dim_value for d in part.graph.input[0].type.tensor_type.shape.dim] == [3, 4]
    x = np.random.default_rng(3).normal(size=(3, 4)).astype(np.float32)
    (y,) = ort.InferenceSession(doc["partitions"][0]["file"]).run(None, {"x": x})
    np.testing.assert_array_equal(y, np.maximum(x, 0))


def test_an_op_polykit_lacks_is_named_and_what_follows_it_cannot_be_judged(tmp_path, capsys):
    model = _custom_op_model(tmp_path / "c.onnx")
    assert main(["inspect", "capability", model, "--target", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "1 of 3 node(s)" in out and "polykit does not implement my.domain::Foo" in out
    assert "shape inference cannot tell tensor 'b'" in out
    assert main(["inspect", "capability", model, "--target", "cpu", "-o", str(tmp_path / "parts")]) == 0
    part = onnx.load(str(tmp_path / "parts" / "partition_0.onnx"))  # cut from a graph with an op polykit lacks
    onnx.checker.check_model(part, full_check=True)
    assert [n.name for n in part.graph.node] == ["first"] and [o.name for o in part.graph.output] == ["a"]


def test_json_lists_each_nodes_verdict_and_the_folded_count(capsys):
    assert main(["inspect", "capability", str(MLP), "--target", "cpu", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["target"] == "cpu" and doc["supported"] == doc["nodes_checked"] == 4 and doc["folded"] == 0
    assert doc["nodes"][0] == {"name": "fc1", "op": "Gemm", "domain": "", "supported": True, "reason": "",
                               "tactics": doc["nodes"][0]["tactics"]} and doc["nodes"][0]["tactics"]


def test_dynamic_inputs_take_input_shapes_or_1(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(logging.getLogger("polykit"), "propagate", True)
    caplog.set_level(logging.WARNING, logger="polykit")
    model = dynamic_model(tmp_path / "dyn.onnx")
    report, graph = check_capability(model, "cpu", {"x": (3, 4)})
    assert report.supported == 2 and graph.value("y").shape == (3, 4)
    report, graph = check_capability(model, "cpu")
    assert graph.value("y").shape == (1, 4) and "dynamic shape" in caplog.text


def test_output_that_is_a_file_is_a_usage_error(tmp_path, capsys):
    (tmp_path / "f").write_text("")
    assert main(["inspect", "capability", str(MLP), "--target", "cpu", "-o", str(tmp_path / "f")]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err

"""`polykit check lint` (a report shaped like Polygraphy's) and `polykit data to-input / merge`."""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.tools.cli.app import main
from polykit.tools.data.results_io import load_feeds, load_outputs, save_feeds, save_outputs
from tests.cli_models import ADD_MUL, save

pytestmark = pytest.mark.usefixtures("fresh_plugins")


def _bad_graph(tmp_path):
    """Polygraphy's check example in small: an empty graph name, a MatMul of mismatched shapes
    whose reader is then not checked, an unused input and node, an unused initializer, a custom op."""
    info = helper.make_tensor_value_info
    nodes = [helper.make_node("MatMul", ["a", "b"], ["ab"], name="bad_matmul"),
             helper.make_node("Relu", ["ab"], ["r"], name="after_bad"),
             helper.make_node("Add", ["x", "x"], ["y"], name="good_add"),
             helper.make_node("Neg", ["x"], ["dead"], name="dead_neg"),
             helper.make_node("Frob", ["x"], ["z"], name="custom", domain="example.custom")]
    graph = helper.make_graph(nodes, "", [info("a", TensorProto.FLOAT, [2, 3]), info("b", TensorProto.FLOAT, [4, 5]),
                                          info("x", TensorProto.FLOAT, [3]), info("unused", TensorProto.FLOAT, [1])],
                              [info("r", TensorProto.FLOAT, None), info("y", TensorProto.FLOAT, [3]),
                               info("z", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.ones(2, np.float32), "stale")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("example.custom", 1)])
    return save(model, tmp_path / "bad_graph.onnx")


def test_lint_reports_checker_shape_and_unused_findings_in_polygraphys_shape(tmp_path, capsys):
    report_path = tmp_path / "report.json"
    assert main(["check", "lint", _bad_graph(tmp_path), "-o", str(report_path)]) == 1
    report = json.loads(report_path.read_text())
    assert set(report) == {"summary", "lint_entries"}
    assert report["summary"]["failing"] == ["bad_matmul"]
    assert "good_add" in report["summary"]["passing"] and "after_bad" not in report["summary"]["passing"]
    entries = {(e["level"], e["source"], e["message"], tuple(e.get("nodes", ()))) for e in report["lint_entries"]}
    assert ("exception", "onnx_checker", "Field 'name' of 'graph' is required to be non-empty.", ()) in entries
    assert ("exception", "onnx_shape_inference", "Incompatible dimensions for matrix multiplication",
            ("bad_matmul",)) in entries
    assert ("warning", "onnx_graphsurgeon", "Input: 'unused' does not affect outputs, can be removed.", ()) in entries
    assert ("warning", "onnx_graphsurgeon", "Does not affect outputs, can be removed.", ("dead_neg",)) in entries
    assert ("warning", "polykit", "Initializer: 'stale' is read by no node, can be removed.", ()) in entries
    assert any(e[1] == "polykit" and "Frob" in e[2] and e[3] == ("custom",) for e in entries)
    assert "[E] LINT | Name: bad_matmul | Incompatible dimensions" in capsys.readouterr().err


def test_lint_of_a_clean_model_passes(capsys):
    assert main(["check", "lint", str(ADD_MUL), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["lint_entries"] == [] and len(report["summary"]["passing"]) == 3


def test_to_input_combines_inputs_and_one_runners_outputs_per_iteration(tmp_path):
    feeds = [{"x": np.full(2, i, np.float32)} for i in range(2)]
    outputs = {"onnxrt": [{"h": np.full(3, 10 + i, np.float32)} for i in range(2)]}
    inputs_path = save_feeds(tmp_path / "inputs.json", feeds)
    outputs_path = save_outputs(tmp_path / "layers.json", outputs)
    out = tmp_path / "combined.json"
    assert main(["data", "to-input", str(inputs_path), str(outputs_path), "-o", str(out)]) == 0
    combined = load_feeds(out)
    assert [sorted(f) for f in combined] == [["h", "x"], ["h", "x"]]
    assert combined[1]["h"].tolist() == [11, 11, 11] and combined[1]["x"].tolist() == [1, 1]
    assert json.loads(out.read_text())[0]["x"]["polygraphy_class"] == "ndarray"  # Polygraphy's JSON


def test_merge_joins_runners_and_refuses_mixed_kinds(tmp_path, capsys):
    a = save_outputs(tmp_path / "a.npz", {"trt": [{"y": np.ones(2, np.float32)}]})
    b = save_outputs(tmp_path / "b.json", {"trt": [{"y": np.zeros(2, np.float32)}]})
    out = tmp_path / "both.json"
    assert main(["data", "merge", str(a), str(b), "-o", str(out)]) == 0
    merged = load_outputs(out)
    assert list(merged) == ["trt", "trt-1"] and merged["trt-1"][0]["y"].tolist() == [0, 0]
    feeds = save_feeds(tmp_path / "in.npz", [{"x": np.ones(1, np.float32)}])
    assert main(["data", "merge", str(a), str(feeds), "-o", str(tmp_path / "x.json")]) == 2
    assert "one kind" in capsys.readouterr().err

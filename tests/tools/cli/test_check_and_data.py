"""`polykit check lint` (a report shaped like Polygraphy's) and `polykit data merge / to-input / concat / join`."""

from __future__ import annotations

import json
from pathlib import Path

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


WRITTEN = Path(__file__).parents[2] / "data" / "polygraphy_examples" / "written_by_polygraphy"


def test_merge_writes_what_polygraphys_data_merge_writes(tmp_path):
    out = tmp_path / "merged.json"
    assert main(["data", "merge", str(WRITTEN / "layerwise_outputs.json"), "-o", str(out)]) == 0
    assert json.loads(out.read_text()) == json.loads((WRITTEN / "merged_layerwise.json").read_text())
    again = tmp_path / "to_input.json"
    assert main(["data", "to-input", str(WRITTEN / "layerwise_outputs.json"), "-o", str(again)]) == 0
    assert again.read_bytes() == out.read_bytes()


def test_merge_keeps_each_iteration_and_warns_on_overwrite(tmp_path, capsys):
    inputs = load_feeds(WRITTEN / "inputs.json")
    (runner, outputs), = load_outputs(WRITTEN / "outputs.json").items()
    out = tmp_path / "merged.npz"
    assert main(["data", "merge", str(WRITTEN / "inputs.json"), str(WRITTEN / "outputs.json"), "-o", str(out)]) == 0
    merged = load_feeds(out)
    assert len(merged) == 2 and not np.array_equal(merged[0]["x"], merged[1]["x"])
    for i in range(2):
        np.testing.assert_array_equal(merged[i]["x"], inputs[i]["x"])
        np.testing.assert_array_equal(merged[i]["y"], outputs[i]["y"])
    assert "overwriting" not in capsys.readouterr().err
    assert main(["data", "merge", str(WRITTEN / "inputs.json"), str(WRITTEN / "inputs.json"), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "overwriting input 'x'" in err and "data concat" in err


def test_concat_matches_polygraphys_concat_of_outputs(tmp_path):
    out = tmp_path / "concat.json"
    outputs = str(WRITTEN / "outputs.json")
    assert main(["data", "concat", outputs, outputs, "-o", str(out)]) == 0
    ours, theirs = load_outputs(out), load_outputs(WRITTEN / "concat_outputs.json")
    assert list(ours) == list(theirs) and len(ours[next(iter(ours))]) == 4
    for mine, polygraphys in zip(*ours.values(), *theirs.values()):
        np.testing.assert_array_equal(mine["y"], polygraphys["y"])


def test_concat_of_inputs_and_runners_by_name(tmp_path, capsys):
    a = save_feeds(tmp_path / "a.npz", [{"x": np.zeros(1, np.float32)}])
    out = tmp_path / "inputs.json"
    assert main(["data", "concat", str(a), str(WRITTEN / "inputs.json"), "-o", str(out)]) == 0
    assert [f["x"].shape for f in load_feeds(out)] == [(1,), (1, 1, 2, 2), (1, 1, 2, 2)]
    first = save_outputs(tmp_path / "1.json", {"trt": [{"y": np.zeros(1)}], "onnxrt": [{"y": np.ones(1)}]})
    second = save_outputs(tmp_path / "2.npz", {"onnxrt": [{"y": np.full(1, 2.0)}], "new": [{"y": np.ones(1)}]})
    assert main(["data", "concat", str(first), str(second), "-o", str(tmp_path / "o.json")]) == 0
    runs = load_outputs(tmp_path / "o.json")
    assert {k: [it["y"].tolist() for it in v] for k, v in runs.items()} == {
        "trt": [[0]], "onnxrt": [[1], [2]], "new": [[1]]}
    assert main(["data", "concat", str(first), str(a), "-o", str(tmp_path / "x.json")]) == 2
    assert "cannot concatenate saved inputs with saved outputs" in capsys.readouterr().err


def test_join_joins_runners_and_refuses_inputs(tmp_path, capsys):
    a = save_outputs(tmp_path / "a.npz", {"trt": [{"y": np.ones(2, np.float32)}]})
    b = save_outputs(tmp_path / "b.json", {"trt": [{"y": np.zeros(2, np.float32)}]})
    out = tmp_path / "both.json"
    assert main(["data", "join", str(a), str(b), "-o", str(out)]) == 0
    joined = load_outputs(out)
    assert list(joined) == ["trt", "trt-1"] and joined["trt-1"][0]["y"].tolist() == [0, 0]
    feeds = save_feeds(tmp_path / "in.npz", [{"x": np.ones(1, np.float32)}])
    assert main(["data", "join", str(a), str(feeds), "-o", str(tmp_path / "x.json")]) == 2
    assert "saved inputs" in capsys.readouterr().err

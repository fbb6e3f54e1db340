"""`polykit run --mark-all` names the first divergent tensor in topological order, its node and
the inputs that still agree (text and --json), against saved layerwise outputs or a live runner."""

from __future__ import annotations

import json

import pytest

from polykit.tools.cli.app import main
from tests.tools.compare.layerwise_models import convnet

CPU = ("--target", "cpu")


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # rich wraps at the terminal width; keep report lines whole


def _run(capsys, *args: str) -> tuple[int, str]:
    code = main(list(args))
    return code, capsys.readouterr().out


@pytest.fixture
def saved_reference(tmp_path, capsys, request):
    """The unperturbed convnet's layerwise outputs and its feeds, saved by `request.param`."""
    model = convnet(tmp_path / "good.onnx")
    out, feeds = str(tmp_path / "layers.npz"), str(tmp_path / "feeds.npz")
    runner = ("--onnxrt",) if request.param == "onnxrt" else ("--trt", *CPU)
    code, _ = _run(capsys, "run", model, *runner, "--mark-all", "--save-outputs", out, "--save-inputs", feeds)
    assert code == 0
    return out, feeds


@pytest.mark.parametrize("saved_reference", ["onnxrt", "trt"], indirect=True)
def test_a_perturbed_weight_deep_in_the_graph_is_named_in_text_and_json(saved_reference, tmp_path, capsys):
    out, feeds = saved_reference
    bad = convnet(tmp_path / "bad.onnx", perturb="w3")
    args = ("run", bad, "--trt", *CPU, "--mark-all", "--load-outputs", out, "--load-inputs", feeds)
    code, text = _run(capsys, *args)
    assert code == 1
    assert "first divergence: tensor 'c3' from node 'conv3' (Conv)" in text
    assert "inputs: r2 agrees (max abs error" in text and "w3 weight" in text
    code, doc = _run(capsys, *args, "--json")
    first = json.loads(doc)["first_divergence"]
    assert (first["tensor"], first["node"], first["op"]) == ("c3", "conv3", "Conv")
    assert first["error"]["max_abs"] > 0.1 and first["error"]["atol"] == 1e-5 and not first["error"]["passed"]
    assert [(i["name"], i["state"]) for i in first["inputs"]] == [("r2", "agrees"), ("w3", "weight"), ("b3", "weight")]
    assert first["inputs"][0]["error"]["max_abs"] < 1e-5


def test_a_perturbed_node_fused_with_its_activation_is_named_in_the_region(tmp_path, capsys):
    """conv2 and relu2 are one polykit layer: c2 is not compared, r2 diverges first."""
    model, bad = convnet(tmp_path / "good.onnx"), convnet(tmp_path / "bad.onnx", perturb="w2")
    out, feeds = str(tmp_path / "layers.npz"), str(tmp_path / "feeds.npz")
    assert _run(capsys, "run", model, "--onnxrt", "--mark-all", "--save-outputs", out, "--save-inputs", feeds)[0] == 0
    code, doc = _run(capsys, "run", bad, "--trt", *CPU, "--mark-all", "--observe-marks", "--load-outputs", out,
                     "--load-inputs", feeds, "--json")
    doc = json.loads(doc)
    assert code == 1 and doc["first_divergence"]["tensor"] == "r2"
    assert doc["first_divergence"]["region"] == [{"node": "conv2", "op": "Conv"}, {"node": "relu2", "op": "Relu"}]
    assert "c2" in doc["fused_away"] and "c1" in doc["fused_away"]


@pytest.mark.usefixtures("fault_plugin")
def test_a_faulty_polykit_layer_is_the_first_divergence_against_onnxruntime(tmp_path, capsys, monkeypatch):
    model = convnet(tmp_path / "c.onnx")
    args = ("run", model, "--onnxrt", "--trt", *CPU, "--builder-optimization-level", "0", "--mark-all", "--observe-marks")
    assert _run(capsys, *args)[0] == 0
    monkeypatch.setenv("POLYKIT_FAULT_LAYERS", "^conv3$")
    code, text = _run(capsys, *args)
    assert code == 1 and "first divergence: tensor 'c3' from node 'conv3' (Conv), trt vs onnxrt" in text
    code, doc = _run(capsys, *args, "--json")
    doc = json.loads(doc)
    assert doc["first_divergence"]["node"] == "conv3"
    assert [l["tensor"] for l in doc["layers"]] == ["r1", "r2", "c3", "g", "f", "logits", "probs"]
    assert [l["passed"] for l in doc["layers"]] == [True, True, False, False, False, False, False]
    assert doc["fused_away"] == ["c1", "c2", "m"]


def test_default_text_is_a_line_per_pair_and_the_first_divergence_not_every_tensor(tmp_path, capsys):
    model = convnet(tmp_path / "c.onnx", size=8)
    code, text = _run(capsys, "run", model, "--trt", *CPU, "--onnxrt", "--mark-all", "--observe-marks")
    assert code == 0
    assert "onnxrt vs trt (reference), iteration 0: 7 tensor(s) compared, 0 differ, 3 not compared" in text
    assert "r1: PASSED" not in text and "no divergence: every compared tensor agrees" in text
    assert text.splitlines()[-1] == "PASSED | 1 comparison(s), 7 tensor(s) match; 3 fused away (not compared)"


def test_verbose_lists_every_tensor_in_topological_order_and_the_fused_away_ones(tmp_path, capsys):
    model = convnet(tmp_path / "c.onnx", size=8)
    code, text = _run(capsys, "run", model, "--trt", *CPU, "--onnxrt", "--mark-all", "--observe-marks", "-v")
    rows = [line.split(":")[0].strip() for line in text.splitlines() if line.endswith(": PASSED")]
    assert code == 0 and rows == ["r1", "r2", "c3", "g", "f", "logits", "probs"]
    assert "not compared: c1, c2, m" in text


@pytest.mark.parametrize("marked", [(), ("--mark-all",)])
def test_quiet_prints_only_the_summary_line(tmp_path, capsys, marked):
    model = convnet(tmp_path / "c.onnx", size=8)
    code, text = _run(capsys, "run", model, "--trt", *CPU, "--onnxrt", *marked, "-q")
    assert code == 0 and len(text.splitlines()) == 1 and text.startswith("PASSED | 1 comparison(s)")


def test_mark_names_tensors_and_a_fused_one_is_reported_not_compared(tmp_path, capsys):
    model = convnet(tmp_path / "c.onnx", size=8)
    code, doc = _run(capsys, "run", model, "--onnxrt", "--trt", *CPU, "--mark", "c2", "c3", "--observe-marks", "--json")
    doc = json.loads(doc)
    assert code == 0 and [l["tensor"] for l in doc["layers"]] == ["c3", "probs"]
    assert doc["fused_away"] == ["c2"] and doc["first_divergence"] is None


def test_marks_are_forced_by_default_so_every_marked_tensor_is_compared(tmp_path, capsys):
    """Polygraphy's `--trt-outputs mark all`: the plan is built with every tensor an output."""
    model = convnet(tmp_path / "c.onnx", size=8)
    code, doc = _run(capsys, "run", model, "--onnxrt", "--trt", *CPU, "--mark", "c2", "c3", "--json")
    doc = json.loads(doc)
    assert code == 0 and [l["tensor"] for l in doc["layers"]] == ["c2", "c3", "probs"] and doc["fused_away"] == []
    for spelling in (["--trt-outputs", "mark", "all", "--onnx-outputs", "mark", "all"], ["--trt-outputs", "*"],
                     ["--mark-all"]):
        code, doc = _run(capsys, "run", model, "--trt", *CPU, "--onnxrt", *spelling, "--json")
        doc = json.loads(doc)
        assert code == 0 and doc["fused_away"] == [], spelling
        assert [l["tensor"] for l in doc["layers"]] == ["c1", "r1", "c2", "r2", "c3", "g", "f", "m", "logits", "probs"]


def test_a_perturbed_node_is_named_itself_when_marks_are_forced(tmp_path, capsys):
    model, bad = convnet(tmp_path / "good.onnx"), convnet(tmp_path / "bad.onnx", perturb="w2")
    out, feeds = str(tmp_path / "layers.npz"), str(tmp_path / "feeds.npz")
    assert _run(capsys, "run", model, "--onnxrt", "--mark-all", "--save-outputs", out, "--save-inputs", feeds)[0] == 0
    code, doc = _run(capsys, "run", bad, "--trt", *CPU, "--trt-outputs", "mark", "all", "--load-outputs", out,
                     "--load-inputs", feeds, "--json")
    doc = json.loads(doc)
    assert code == 1 and doc["first_divergence"]["tensor"] == "c2" and doc["first_divergence"]["node"] == "conv2"


def test_plain_outputs_keep_the_full_report_and_a_null_first_divergence(tmp_path, capsys):
    model = convnet(tmp_path / "c.onnx", size=8)
    code, text = _run(capsys, "run", model, "--trt", *CPU, "--onnxrt")
    assert code == 0 and "probs: PASSED" in text and "first divergence" not in text
    code, doc = _run(capsys, "run", model, "--trt", *CPU, "--onnxrt", "--json")
    doc = json.loads(doc)
    assert doc["first_divergence"] is None and doc["fused_away"] == [] and [l["tensor"] for l in doc["layers"]] == ["probs"]


# ---- the Python API: GraphOrder and analyze -------------------------------------------------
def _unsorted_model():
    """x -> a=Relu(x) -> b=Neg(a) -> c=Add(b, x) -> y=Abs(c), nodes stored backwards."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Abs", ["c"], ["y"], name="abs"), helper.make_node("Add", ["b", "x"], ["c"], name="add"),
             helper.make_node("Neg", ["a"], ["b"]), helper.make_node("Relu", ["x"], ["a"], name="relu")]
    info = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, "g", [info("x", TensorProto.FLOAT, [3])], [info("y", TensorProto.FLOAT, [3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _compared(name: str, passed: bool):
    from polykit.tools.compare.funcs import OutputComparison

    return OutputComparison(name, passed, "simple", max_abs=0.0 if passed else 1.0)


def test_graph_order_sorts_nodes_topologically_and_names_unnamed_ones():
    from polykit.tools.compare.divergence import GraphOrder

    order = GraphOrder.from_onnx(_unsorted_model())
    assert [(p.tensor, p.node, p.op) for p in order.producers] == [("a", "relu", "Relu"), ("b", "Neg_2", "Neg"),
                                                                   ("c", "add", "Add"), ("y", "abs", "Abs")]
    assert order.intermediates == {"a", "b", "c"} and order.inputs == {"x"}


def test_analyze_walks_topological_order_and_back_through_tensors_not_compared():
    from polykit.tools.compare.comparator import AccuracyReport, PairResult
    from polykit.tools.compare.divergence import GraphOrder, analyze

    order = GraphOrder.from_onnx(_unsorted_model())
    pair = PairResult("ref", "act", 0, (_compared("y", False), _compared("c", False), _compared("a", True)), ("b",))
    result = analyze(AccuracyReport((pair,)), order)
    assert [r.tensor for r in result.layers] == ["a", "c", "y"] and result.fused_away == ("b",) and result.marked
    first = result.first_divergence
    assert (first.tensor, first.node, first.op) == ("c", "add", "Add")
    assert first.region == (("Neg_2", "Neg"), ("add", "Add"))
    assert [(i.name, i.state) for i in first.inputs] == [("a", "agrees"), ("x", "graph input")]


def test_analyze_reports_the_first_pair_that_diverges():
    from polykit.tools.compare.comparator import AccuracyReport, PairResult
    from polykit.tools.compare.divergence import GraphOrder, analyze

    order = GraphOrder.from_onnx(_unsorted_model())
    good = PairResult("ref", "one", 0, (_compared("a", True), _compared("y", True)))
    bad = PairResult("ref", "two", 0, (_compared("a", False), _compared("y", False)))
    result = analyze(AccuracyReport((good, bad)), order)
    assert result.runner == "two" and result.first_divergence.tensor == "a"
    assert [(i.name, i.state) for i in result.first_divergence.inputs] == [("x", "graph input")]

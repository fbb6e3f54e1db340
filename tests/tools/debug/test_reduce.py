"""`polykit debug reduce` on the cpu target: a model whose failure comes from one node (the
example fault plugin's tactic on one layer, or a weight that differs from the reference
outputs) shrinks to a subgraph of at most 5 nodes holding it — the first node too; the
subgraph passes onnx.checker, its inputs get the values they have in the full model, and
it reproduces the failure in a plain `polykit run`; --min-good, --check, --json; bad input."""

from __future__ import annotations

import json
import math
import shlex
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.backends.loaders import MARK_ALL, ModifyOutputs
from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.runtime.engine import Engine
from polykit.tools.compare.accuracy import AccuracySettings
from polykit.tools.cli.app import main
from polykit.tools.cli.args import compare_settings
from polykit.tools.data.loaders import DataLoaderOptions
from polykit.tools.debug.check import onnxrt_outputs
from polykit.tools.debug.reduce import ReduceOptions, Subgraphs, debug_reduce
from tests.cli_models import REPO, perturbed_mlp, save

CONVNET = str(REPO / "tests" / "data" / "torch" / "convnet_ts.onnx")
MLP = str(REPO / "examples" / "models" / "mlp.onnx")
LEVEL0 = ["--target", "cpu", "--builder-optimization-level", "0"]
TOL = ["--atol", "1e-4", "--rtol", "1e-4"]

pytestmark = pytest.mark.usefixtures("fault_plugin")


def _reduce_json(capsys, *args) -> dict:
    assert main(["debug", "reduce", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("pattern, culprit", [
    ("stem", "/stem/stem.0/Conv"),                  # the first node of the model
    ("blocks.1/Conv", "/blocks/blocks.1/Conv"),     # in the middle, a plain Conv
    ("blocks.2/c2", "/blocks/blocks.2/c2/Conv"),    # fused with the Add and Relu after it in the full build
    ("fc/Gemm", "/fc/Gemm"),                        # the last
])
def test_one_faulty_layer_reduces_to_a_subgraph_of_at_most_5_nodes_holding_it(monkeypatch, capsys, tmp_path,
                                                                              pattern, culprit):
    monkeypatch.setenv("POLYKIT_FAULT_LAYERS", pattern)
    out = tmp_path / "reduced.onnx"
    doc = _reduce_json(capsys, CONVNET, "-o", str(out), *LEVEL0, *TOL)
    nodes = doc["reduced"]["nodes"]
    assert culprit in nodes and len(nodes) <= 5
    assert doc["reduced"]["passed"] is False and doc["reduced"]["error"]["max_abs"] > 1e-4
    assert doc["total_nodes"] == 16 and doc["builds"] == doc["checks"] <= 1 + 2 * math.ceil(math.log2(16)) + 5
    reduced = onnx.load(str(out))
    onnx.checker.check_model(reduced, full_check=True)
    assert [n.name for n in reduced.graph.node] == nodes


def test_the_reduced_model_fails_a_plain_run_only_with_the_fault(monkeypatch, tmp_path):
    monkeypatch.setenv("POLYKIT_FAULT_LAYERS", "blocks.0/c1/Conv$")
    out = tmp_path / "reduced.onnx"
    assert main(["debug", "reduce", CONVNET, "-o", str(out), *LEVEL0, *TOL]) == 0
    assert [n.name for n in onnx.load(str(out)).graph.node] == ["/blocks/blocks.0/c1/Conv"]
    run = ["run", str(out), "--trt", "--onnxrt", *LEVEL0, *TOL, "--val-range", "[-1,1]"]
    assert main(run) == 1
    monkeypatch.delenv("POLYKIT_FAULT_LAYERS")
    assert main(run) == 0


def test_subgraph_inputs_are_fed_the_values_they_have_in_the_full_model():
    subgraphs = Subgraphs(onnx.load(CONVNET))
    subgraphs.cache_values(ReduceOptions())
    position = [subgraphs.nodes[i].name for i in subgraphs.order].index("/blocks/blocks.2/Add")
    candidate = subgraphs.candidate((position,))
    inputs = [i.name for i in candidate.model.graph.input]
    assert inputs == ["/blocks/blocks.2/c2/Conv_output_0", "/blocks/blocks.1/Conv_output_0"]
    full = onnxrt_outputs(ModifyOutputs(CONVNET, outputs=MARK_ALL),
                          [{"image": subgraphs.values[0]["image"]}])[0]
    for name in inputs:
        assert np.abs(full[name]).max() > 0
        np.testing.assert_array_equal(candidate.feeds[0][name], full[name])
    assert [o.name for o in candidate.model.graph.output] == ["/blocks/blocks.2/Add_output_0"]


def _shape_chain_model(path) -> str:
    """x[2,3,4] -> relu -> reshape to [Gather(Shape(r), 0), -1] (a shape chain) -> mm (MatMul) -> y[2,5]."""
    w = np.random.default_rng(3).standard_normal((12, 5)).astype(np.float32)
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Shape", ["r"], ["s"], name="shape"),
             helper.make_node("Gather", ["s", "zero"], ["g"], name="gather", axis=0),
             helper.make_node("Concat", ["g", "minus_one"], ["target"], name="concat", axis=0),
             helper.make_node("Reshape", ["r", "target"], ["flat"], name="reshape"),
             helper.make_node("MatMul", ["flat", "w"], ["y"], name="mm")]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])],
                              [numpy_helper.from_array(np.array([0], np.int64), "zero"),
                               numpy_helper.from_array(np.array([-1], np.int64), "minus_one"),
                               numpy_helper.from_array(w, "w")])
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_integer_intermediate_inputs_are_baked_in_so_the_subgraph_builds(tmp_path):
    model = _shape_chain_model(tmp_path / "chain.onnx")
    subgraphs = Subgraphs(onnx.load(model))
    subgraphs.cache_values(ReduceOptions(accuracy=AccuracySettings(data_options=DataLoaderOptions(
        val_ranges={"": (-1.0, 1.0)}))))
    position = [subgraphs.nodes[i].name for i in subgraphs.order].index("reshape")
    candidate = subgraphs.candidate((position, position + 1))
    assert candidate.nodes == ("reshape", "mm") and [i.name for i in candidate.model.graph.input] == ["r"]
    baked = {t.name: numpy_helper.to_array(t) for t in candidate.model.graph.initializer}
    np.testing.assert_array_equal(baked["target"], [2, -1])
    onnx.checker.check_model(candidate.model, full_check=True)
    plan = build_plan(candidate.model, BuilderConfig(target="cpu"))
    with Engine(plan) as engine, engine.create_execution_context() as context:
        got = context.execute(candidate.feeds[0])["y"]
    np.testing.assert_allclose(got, subgraphs.values[0]["y"], rtol=1e-5, atol=1e-5)


def test_a_fault_behind_a_shape_chain_reduces_to_its_matmul(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("POLYKIT_FAULT_LAYERS", "^mm$")
    model = _shape_chain_model(tmp_path / "chain.onnx")
    doc = _reduce_json(capsys, model, "-o", str(tmp_path / "r.onnx"), *LEVEL0, *TOL, "--val-range", "[-1,1]")
    assert doc["reduced"]["nodes"] == ["mm"] and doc["total_nodes"] == 6


def test_min_good_writes_the_nearest_passing_subgraph(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("POLYKIT_FAULT_LAYERS", "blocks.2/c1")
    good = tmp_path / "good.onnx"
    doc = _reduce_json(capsys, CONVNET, "-o", str(tmp_path / "r.onnx"), "--min-good", str(good), *LEVEL0, *TOL)
    assert doc["reduced"]["nodes"] == ["/blocks/blocks.2/c1/Conv"]
    assert doc["min_good"]["passed"] is True and doc["min_good"]["path"] == str(good)
    kept = [n.name for n in onnx.load(str(good)).graph.node]
    assert kept == doc["min_good"]["nodes"] and "/blocks/blocks.2/c1/Conv" not in kept
    onnx.checker.check_model(onnx.load(str(good)), full_check=True)


def test_the_text_report_lists_the_nodes_and_the_files_written(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("POLYKIT_FAULT_LAYERS", "fc/Gemm")
    out = tmp_path / "r.onnx"
    assert main(["debug", "reduce", CONVNET, "-o", str(out), "--min-good", str(tmp_path / "g.onnx"), *LEVEL0,
                 *TOL]) == 0
    text = capsys.readouterr().out
    assert "debug reduce: 16 node(s) -> 1 in" in text and "/fc/Gemm" in text and "reduced model: FAILS" in text
    assert f"wrote {out}" in text


def test_a_check_command_judges_each_subgraph_on_its_real_inputs(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("POLYKIT_FAULT_LAYERS", "blocks.1/Conv")
    run = [sys.executable, "-m", "polykit.tools.cli.app", "run", "{model}", "--trt", "--onnxrt", *LEVEL0, *TOL,
           "--load-inputs", "{inputs}"]
    monkeypatch.setenv("PYTHONPATH", str(REPO / "examples" / "polykit-fault-plugin"))
    doc = _reduce_json(capsys, CONVNET, "-o", str(tmp_path / "r.onnx"), "--check", shlex.join(run), "--target", "cpu")
    assert doc["reduced"]["nodes"] == ["/blocks/blocks.1/Conv"] and doc["builds"] == 0
    assert doc["reduced"]["passed"] is False and "exit code 1" in doc["reduced"]["detail"]


def test_a_weight_that_differs_from_saved_layerwise_outputs_is_isolated(tmp_path, capsys):
    ref, inputs = tmp_path / "ref.npz", tmp_path / "in.npz"
    assert main(["run", MLP, "--onnxrt", "--mark-all", "--save-inputs", str(inputs), "--save-outputs", str(ref)]) == 0
    bad = perturbed_mlp(tmp_path / "bad.onnx")
    capsys.readouterr()
    doc = _reduce_json(capsys, bad, "-o", str(tmp_path / "r.onnx"), "--load-inputs", str(inputs), "--load-outputs",
                       str(ref), "--target", "cpu")
    assert doc["reduced"]["nodes"] == ["fc2"] and doc["total_nodes"] == 4


def test_the_python_api_returns_the_reduced_model_and_its_feeds(monkeypatch):
    monkeypatch.setenv("POLYKIT_FAULT_LAYERS", "stem")
    accuracy = AccuracySettings(**compare_settings(atol=["1e-4"], rtol=["1e-4"]))
    report = debug_reduce(CONVNET, BuilderConfig(target="cpu", builder_optimization_level=0),
                          ReduceOptions(accuracy=accuracy))
    assert report.reduced.nodes == ("/stem/stem.0/Conv",) and not report.verdict.passed
    assert list(report.reduced.feeds[0]) == ["image"]  # the model's own input stays an input


@pytest.mark.parametrize("args, message", [
    (["--mode", "fast"], "--mode 'fast' is not one of both, bisect, linear"),
    (["--check", "run '{model}"], "is not a command line"),
    (["--fail-regex", "(", "--check", "true"], "--fail-regex '(' is not a regular expression"),
    (["--fail-code", "1", "--ignore-fail-code", "2", "--check", "true"], "--fail-code and --ignore-fail-code exclude"),
    (["--check", "run {model}", "--load-outputs", "x.npz"], "--load-outputs steer(s) the built-in check"),
])
def test_bad_input_is_a_usage_error(tmp_path, capsys, args, message):
    assert main(["debug", "reduce", CONVNET, "-o", str(tmp_path / "r.onnx"), *LEVEL0, *TOL, *args]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "r.onnx").exists()


def test_a_plan_file_is_refused(tmp_path, capsys):
    plan = tmp_path / "m.plan"
    assert main(["convert", MLP, "-o", str(plan), "--target", "cpu"]) == 0
    assert main(["debug", "reduce", str(plan), "-o", str(tmp_path / "r.onnx")]) == 2
    assert "needs the ONNX model, not a plan" in capsys.readouterr().err


def _mul_add_add(path) -> str:
    """Polygraphy's debug/02 model, small: Y = x0 + (a * x1 + b)."""
    a, b = (numpy_helper.from_array(np.full((1, 3, 2, 2), v, np.float32), n) for n, v in (("a", 2.0), ("b", 1.0)))
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 3, 2, 2]) for n in ("x0", "x1", "Y")]
    nodes = [helper.make_node("Mul", ["a", "x1"], ["mul_out"]), helper.make_node("Add", ["mul_out", "b"], ["add_out"]),
             helper.make_node("Add", ["x0", "add_out"], ["Y"])]
    graph = helper.make_graph(nodes, "g", io[:2], io[2:], [a, b])
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)]), path)


#: prints the op of each node of polygraphy_debug.onnx, exits 0
PRINT_OPS = [sys.executable, "-c", "import onnx; [print('Op:', n.op_type) for n in onnx.load("
                                   "'polygraphy_debug.onnx').graph.node]"]


@pytest.mark.parametrize("mode, checks", [("bisect", 4), ("linear", 4), ("both", 4)])
def test_a_check_that_reads_polygraphy_debug_onnx_with_a_fail_regex_isolates_the_mul(tmp_path, monkeypatch, capsys,
                                                                                    mode, checks):
    monkeypatch.chdir(tmp_path)
    model = _mul_add_add(tmp_path / "model.onnx")
    assert main(["debug", "reduce", model, "-o", "reduced.onnx", f"--mode={mode}", "--fail-regex", "Op: Mul",
                 "--json", "--check", *PRINT_OPS]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["reduced"]["ops"] == ["Mul"] and doc["checks"] == checks and doc["builds"] == 0
    assert "matches --fail-regex 'Op: Mul'" in doc["reduced"]["detail"]
    assert [n.op_type for n in onnx.load("reduced.onnx").graph.node] == ["Mul"]
    assert not (tmp_path / "polygraphy_debug.onnx").exists()  # removed after each iteration


def test_artifacts_of_each_check_are_sorted_and_the_iteration_artifact_can_be_kept(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    model = _mul_add_add(tmp_path / "model.onnx")
    write_ops = [sys.executable, "-c", "import onnx, sys; ops = [n.op_type for n in onnx.load('it.onnx').graph.node]; "
                                       "open('ops.txt', 'w').write(' '.join(ops)); sys.exit('Mul' in ops)"]
    assert main(["debug", "reduce", model, "-o", "r.onnx", "--iter-artifact", "it.onnx", "--no-remove-intermediate",
                 "--artifacts", "ops.txt", "--artifacts-dir", "arts", "--check", *write_ops]) == 0
    bad = sorted(p.read_text() for p in (tmp_path / "arts" / "bad").iterdir())
    good = sorted(p.read_text() for p in (tmp_path / "arts" / "good").iterdir())
    assert "Mul Add Add" in bad and "Mul" in bad and good and all("Mul" not in ops for ops in good)
    assert (tmp_path / "it.onnx").exists()


def test_a_model_that_passes_exits_0_and_is_written_unchanged(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    model = _mul_add_add(tmp_path / "model.onnx")
    assert main(["debug", "reduce", model, "-o", "r.onnx", "--check", *PRINT_OPS]) == 0
    assert "the model passes the check" in capsys.readouterr().out
    assert [n.op_type for n in onnx.load("r.onnx").graph.node] == ["Mul", "Add", "Add"]

"""`polykit debug precision` on the cpu target (whose kernels honour --fp16: they compute on
float16 arrays): a model with one MatMul whose values exceed fp16's range, followed by a
scale-down, fails in fp16; the command names that MatMul in a set of at most 3 nodes, and
`run --fp16 --layer-precisions <that set>` then passes. Both rankings, -o, --json, the error
and latency before and after; bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder.config import BuilderConfig
from polykit.tools.compare.accuracy import AccuracySettings
from polykit.tools.cli.app import main
from polykit.tools.cli.args import compare_settings
from polykit.tools.debug.precision import PrecisionOptions, debug_precision, fp32_candidates
from tests.cli_models import REPO

TOL = ["--atol", "1e-2", "--rtol", "1e-2"]
CPU = ["--target", "cpu"]

pytestmark = pytest.mark.usefixtures("fresh_plugins")


def overflow_model(path: Path) -> str:
    """x[4,16] -> Relu -> big_mm (MatMul, outputs ~1e5: beyond fp16's 65504) -> scale_down (Mul 1e-5)
    -> bias (Add) -> squash (Tanh) -> head (MatMul) -> relu_out (Relu) -> y[4,4]."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Relu", ["x"], ["h0"], name="relu_in"),
             helper.make_node("MatMul", ["h0", "w1"], ["h1"], name="big_mm"),
             helper.make_node("Mul", ["h1", "scale"], ["h2"], name="scale_down"),
             helper.make_node("Add", ["h2", "b"], ["h3"], name="bias"),
             helper.make_node("Tanh", ["h3"], ["h4"], name="squash"),
             helper.make_node("MatMul", ["h4", "w2"], ["h5"], name="head"),
             helper.make_node("Relu", ["h5"], ["y"], name="relu_out")]
    weights = {"w1": 2e4 * rng.uniform(0.5, 1.0, (16, 8)), "scale": np.array(1e-5), "b": rng.standard_normal(8),
               "w2": rng.standard_normal((8, 4))}
    graph = helper.make_graph(nodes, "overflow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])],
                              [numpy_helper.from_array(w.astype(np.float32), name) for name, w in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save_model(model, str(path))
    return str(path)


@pytest.fixture
def overflow(tmp_path) -> str:
    return overflow_model(tmp_path / "overflow.onnx")


def _precision_json(capsys, *args) -> dict:
    assert main(["debug", "precision", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("rank", ["layerwise", "isolated"])
def test_the_overflowing_matmul_is_named_and_run_with_its_set_in_fp32_passes(overflow, capsys, tmp_path, rank):
    run = ["run", overflow, "--trt", "--onnxrt", *CPU, "--fp16", *TOL]
    assert main(run) == 1
    capsys.readouterr()
    out = tmp_path / "precisions.txt"
    doc = _precision_json(capsys, overflow, "--fp16", *CPU, *TOL, "--rank", rank, "-o", str(out))
    names = [n["name"] for n in doc["nodes"]]
    assert "big_mm" in names and len(names) <= 3
    value = out.read_text().strip()
    assert value == doc["layer_precisions"] == ",".join(f"{n}:fp32" for n in names)
    assert doc["before"]["passed"] is False and doc["after"]["passed"] is True
    assert doc["after"]["error"]["max_abs"] < doc["before"]["error"]["max_abs"]
    assert doc["before"]["latency_ms"] > 0 and doc["after"]["latency_ms"] > 0
    assert doc["candidates"] == 7 and doc["rank"] == rank and doc["builds"] >= doc["checks"] >= 3
    capsys.readouterr()
    assert main(run + ["--layer-precisions", value]) == 0
    for bench_or_convert in (["bench", overflow, *CPU, "--fp16", "--iterations", "2", "--duration", "0"],
                             ["convert", overflow, "-o", str(tmp_path / "m.plan"), *CPU, "--fp16"]):
        assert main(bench_or_convert + ["--layer-precisions", value]) == 0


def test_the_text_report_shows_errors_latencies_and_the_value(overflow, capsys):
    assert main(["debug", "precision", overflow, "--fp16", *CPU, *TOL]) == 0
    text = capsys.readouterr().out
    assert "debug precision (fp16):" in text and "of 7 candidate node(s) must stay in fp32" in text
    assert "before (fp16 everywhere): FAILS" in text and "after (these nodes in fp32): passes" in text
    assert text.count("latency") == 2
    value = next(line for line in text.splitlines() if line.startswith("--layer-precisions "))
    assert "big_mm:fp32" in value


def test_the_python_api_keeps_the_nodes_in_topological_order(overflow):
    accuracy = AccuracySettings(**compare_settings(atol=["1e-2"], rtol=["1e-2"]))
    report = debug_precision(overflow, BuilderConfig(target="cpu", fp16=True),
                             PrecisionOptions(accuracy=accuracy, timing_iterations=0))
    assert report.nodes == ("big_mm", "scale_down") and report.ops == ("MatMul", "Mul")
    assert report.layer_precisions() == "big_mm:fp32,scale_down:fp32"
    assert report.latency_before_ms is None and report.scores["big_mm"] == float("inf")


def test_a_model_that_passes_in_fp16_needs_no_fp32_node(capsys):
    mlp = str(REPO / "examples" / "models" / "mlp.onnx")
    doc = _precision_json(capsys, mlp, "--fp16", *CPU, *TOL, "--timing-iterations", "0")
    assert doc["nodes"] == [] and doc["layer_precisions"] == "" and doc["before"]["passed"] is True
    assert main(["debug", "precision", mlp, "--fp16", *CPU, *TOL]) == 0
    assert "passes as it is: no node needs fp32" in capsys.readouterr().out


def test_candidates_are_the_nodes_that_compute_float32_and_are_not_folded(tmp_path):
    from polykit.backends.loaders import GraphFromOnnx

    shape = numpy_helper.from_array(np.array([4, 16], np.int64), "shape")
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape_of"),
             helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
             helper.make_node("Add", ["shape", "shape"], ["twice"], name="folded"),
             helper.make_node("Relu", ["r"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "c", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16]),
                               helper.make_tensor_value_info("s", TensorProto.INT64, [1]),
                               helper.make_tensor_value_info("twice", TensorProto.INT64, [2])], [shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert fp32_candidates(GraphFromOnnx(model)()) == ["reshape", "relu"]


def test_a_failure_fp32_does_not_fix_is_a_usage_error(bad_mlp, tmp_path, capsys):
    ref, inputs = tmp_path / "ref.npz", tmp_path / "in.npz"
    mlp = str(REPO / "examples" / "models" / "mlp.onnx")
    assert main(["run", mlp, "--onnxrt", "--save-inputs", str(inputs), "--save-outputs", str(ref)]) == 0
    assert main(["debug", "precision", bad_mlp, "--fp16", *CPU, *TOL, "--load-inputs", str(inputs),
                 "--load-outputs", str(ref)]) == 2
    assert "the outputs fail even with every candidate node in fp32" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    ([], "needs one reduced precision to debug: --fp16 or --bf16"),
    (["--fp16", "--bf16"], "needs one reduced precision to debug: --fp16 or --bf16"),
    (["--fp16", "--rank", "random"], "unknown ranking 'random'"),
])
def test_bad_input_is_a_usage_error(overflow, capsys, args, message):
    assert main(["debug", "precision", overflow, *CPU, *args]) == 2
    assert message in capsys.readouterr().err

"""`polykit debug precision` and `debug reduce` on --fp8 and --int8 builds (cpu target): a model
whose MatMul `crushed` reads an activation with one outlier channel (1e7, the others about 1) breaks
in FP8 and INT8 alone (a per-tensor scale of max |x| / 448 or / 127 rounds every other channel to
zero), while its two other MatMuls quantize within the tolerance. `debug precision --fp8 / --int8`
names exactly that node, the plan `convert --fp8 --layer-precisions <answer>` builds then passes
against onnxruntime where the plain --fp8 plan fails; every build of a search takes one calibration
of the whole model; `debug reduce --fp8` ends on that node, built in process or by a --check command
that reads the whole model's calibration cache; flag combinations that cannot work are usage errors."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder import quantize
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.plan.file import Plan
from polykit.tools.cli.app import main
from polykit.tools.cli.args import compare_settings
from polykit.tools.compare.accuracy import AccuracySettings
from polykit.tools.debug.precision import PrecisionOptions, debug_precision
from polykit.tools.debug.reduce import ReduceOptions, debug_reduce
from tests.cli_models import save

# FP8 quantization of the benign MatMuls errs up to ~0.15 on outputs of magnitude ~4; the crushed one by ~2
TOL = ["--atol", "0.5", "--rtol", "0.1"]
CPU = ["--target", "cpu", "--builder-optimization-level", "0"]
QUANTIZED = ["fp8", "int8"]

pytestmark = pytest.mark.usefixtures("fresh_plugins")


def outlier_model(path: Path) -> str:
    """x[32,8] -> embed (MatMul) -> act (Relu) -> spread (Mul: channel 3 times 1e7) -> crushed (MatMul,
    whose weight row 3 is ~1e-7: the outlier channel adds a normal-sized term) -> bias (Add) -> squash
    (Tanh) -> head (MatMul) -> y[32,4]. Channel 3 of embed's output is positive for inputs in [0, 1]."""
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((8, 16)) / 2
    w1[:, 3] = np.abs(w1[:, 3]) + 0.1
    outlier = np.ones(16)
    outlier[3] = 1e7
    w2 = rng.standard_normal((16, 16)) / 4
    w2[3] = 1e-7 * rng.standard_normal(16)
    weights = {"w1": w1, "outlier": outlier, "w2": w2, "b": rng.standard_normal(16) / 4,
               "w3": rng.standard_normal((16, 4)) / 2}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h1"], name="embed"),
             helper.make_node("Relu", ["h1"], ["h2"], name="act"),
             helper.make_node("Mul", ["h2", "outlier"], ["h3"], name="spread"),
             helper.make_node("MatMul", ["h3", "w2"], ["h4"], name="crushed"),
             helper.make_node("Add", ["h4", "b"], ["h5"], name="bias"),
             helper.make_node("Tanh", ["h5"], ["h6"], name="squash"),
             helper.make_node("MatMul", ["h6", "w3"], ["y"], name="head")]
    graph = helper.make_graph(nodes, "outlier", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [32, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [32, 4])],
                              [numpy_helper.from_array(np.asarray(w, np.float32), n) for n, w in weights.items()])
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


@pytest.fixture
def model(tmp_path) -> str:
    return outlier_model(tmp_path / "outlier.onnx")


def _json(capsys, *args) -> dict:
    assert main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _accuracy() -> AccuracySettings:
    return AccuracySettings(**compare_settings(atol=["0.5"], rtol=["0.1"]))


@pytest.mark.parametrize("kind", QUANTIZED)
def test_debug_precision_names_the_crushed_matmul_and_a_build_with_its_answer_passes(model, kind, capsys, tmp_path):
    cache, answer = tmp_path / "model.cache", tmp_path / "precisions.txt"
    doc = _json(capsys, "debug", "precision", model, f"--{kind}", *CPU, *TOL, "--calibration-cache", str(cache),
                "-o", str(answer), "--timing-iterations", "0")
    assert doc["precision"] == kind and doc["candidates"] == 3  # embed, crushed, head: what the build quantizes
    assert [n["name"] for n in doc["nodes"]] == ["crushed"] and answer.read_text() == "crushed:fp32\n"
    assert doc["before"]["passed"] is False and doc["after"]["passed"] is True
    assert doc["calibration_cache"] == str(cache) and cache.read_text().startswith("polykit-calibration-cache")
    # the plans `convert` builds from the same cache, against onnxruntime on fresh inputs
    inputs, reference = tmp_path / "in.npz", tmp_path / "ref.npz"
    assert main(["run", model, "--onnxrt", "--seed", "7", "--save-inputs", str(inputs),
                 "--save-outputs", str(reference)]) == 0
    check = ["--trt", "--load-inputs", str(inputs), "--load-outputs", str(reference), *TOL]
    plans = {}
    for name, extra in (("plain", []), ("fixed", ["--layer-precisions", answer.read_text().strip()])):
        plans[name] = tmp_path / f"{name}.plan"
        assert main(["convert", model, "-o", str(plans[name]), *CPU, f"--{kind}", "--calibration-cache", str(cache),
                     *extra]) == 0
    assert main(["run", str(plans["plain"]), *check]) == 1
    assert main(["run", str(plans["fixed"]), *check]) == 0
    precisions = {layer.name: layer.precision for layer in Plan.load(plans["fixed"]).layers}
    assert precisions["crushed"] == "fp32" and precisions["embed"] == precisions["head"] == kind


def test_fp16_with_fp8_keeps_the_overflowing_mul_and_the_crushed_matmul_in_fp32(model):
    # the outlier channel (1e7) is beyond float16 too: the Mul that makes it must stay fp32 as well
    report = debug_precision(model, BuilderConfig(target="cpu", fp16=True, fp8=True),
                             PrecisionOptions(accuracy=_accuracy(), timing_iterations=0))
    assert report.precision == "fp16+fp8" and report.flags == ("--fp16", "--fp8")
    assert report.layer_precisions() == "spread:fp32,crushed:fp32"
    assert len(report.scores) == 7 and not report.before.passed and report.after.passed


@pytest.mark.parametrize("tool", ["precision", "reduce"])
def test_every_build_of_a_search_takes_one_calibration_of_the_whole_model(model, monkeypatch, tool):
    calibrated = []
    real = quantize.calibrate

    def counting(graph, names, *args, **kwargs):
        calibrated.append(sorted(names))
        return real(graph, names, *args, **kwargs)

    monkeypatch.setattr(quantize, "calibrate", counting)
    config = BuilderConfig(target="cpu", fp8=True, builder_optimization_level=0)
    if tool == "precision":
        report = debug_precision(model, config, PrecisionOptions(accuracy=_accuracy(), timing_iterations=0))
        assert report.nodes == ("crushed",) and report.calibration_cache is None  # a temporary cache
    else:
        report = debug_reduce(model, config, ReduceOptions(accuracy=_accuracy()))
        assert report.reduced.nodes == ("crushed",)
    assert report.builds >= 4 and calibrated == [["h3", "h6", "x"]]


@pytest.mark.parametrize("kind", QUANTIZED)
def test_debug_reduce_ends_on_the_crushed_matmul(model, kind, capsys, tmp_path):
    out = tmp_path / "reduced.onnx"
    doc = _json(capsys, "debug", "reduce", model, f"--{kind}", "-o", str(out), *CPU, *TOL)
    assert doc["reduced"]["nodes"] == ["crushed"] and doc["reduced"]["passed"] is False
    assert doc["reduced"]["inputs"][0]["name"] == "h3" and doc["total_nodes"] == 7
    # every subgraph was built and checked: none failed to build for want of calibration data
    assert doc["builds"] == doc["checks"] and not any("not checked" in s["detail"] for s in doc["steps"])


def test_a_check_command_reads_the_whole_models_calibration_cache(model, capsys, tmp_path):
    cache = tmp_path / "model.cache"
    run = [sys.executable, "-m", "polykit.tools.cli.app", "run", "{model}", "--trt", "--onnxrt", *CPU, *TOL,
           "--fp8", "--calibration-cache", str(cache), "--load-inputs", "{inputs}"]
    doc = _json(capsys, "debug", "reduce", model, "--fp8", "--calibration-cache", str(cache), "-o",
                str(tmp_path / "r.onnx"), *CPU, "--check", shlex.join(run))
    assert doc["reduced"]["nodes"] == ["crushed"] and doc["builds"] == 0
    assert "type=fp8" in cache.read_text().splitlines()[0]


def _explicit_model(path: Path) -> str:
    """x -> QuantizeLinear -> DequantizeLinear -> MatMul: a model quantized as written."""
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "s"), numpy_helper.from_array(np.array(0, np.int8), "z"),
             numpy_helper.from_array(np.ones((8, 4), np.float32), "w")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="q"),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["dq"], name="dq"),
             helper.make_node("MatMul", ["dq", "w"], ["y"], name="mm")]
    graph = helper.make_graph(nodes, "explicit", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], inits)
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


@pytest.mark.parametrize("args, message", [
    (["precision", "--int8", "--fp8"], "a build quantizes to INT8 or to FP8, not both"),
    (["precision"], "needs one reduced precision to debug: --fp16 or --bf16, --int8 or --fp8"),
    (["reduce", "-o", "r.onnx", "--int8", "--fp8"], "a build quantizes to INT8 or to FP8, not both"),
    (["reduce", "-o", "r.onnx", "--fp8", "--check", "true"], "debug reduce --check with --fp8 quantizes nothing itself"),
])
def test_flag_combinations_that_cannot_work_are_usage_errors(model, capsys, monkeypatch, tmp_path, args, message):
    monkeypatch.chdir(tmp_path)
    tool, *rest = args
    assert main(["debug", tool, model, *CPU, *rest]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_debug_precision_refuses_int8_on_a_model_that_carries_its_own_qdq(capsys, tmp_path):
    explicit = _explicit_model(tmp_path / "explicit.onnx")
    assert main(["debug", "precision", explicit, "--int8", *CPU, *TOL]) == 2
    err = capsys.readouterr().err
    assert "this model carries its own Q/DQ (node 'q')" in err and "Traceback" not in err

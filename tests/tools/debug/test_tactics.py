"""`polykit debug tactics` on the cpu target with the example fault plugin: it names exactly the
layers POLYKIT_FAULT_LAYERS breaks, with their tactic and error, within O(k log n) builds;
good/bad replays, --check, --load-outputs, artifacts, and bad input (exit 2)."""

from __future__ import annotations

import json
import math
import os
import shlex
import sys
from dataclasses import replace

import pytest

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.builder.tactic_replay import LayerChoice, TacticReplay, load_replay, save_replay
from polykit.errors import BuildError
from polykit.tools.cli.app import main
from polykit.tools.debug.tactics import DebugOptions, debug_tactics
from tests.cli_models import FAULT_PLUGIN, REPO

CONVNET = str(REPO / "tests" / "data" / "torch" / "convnet_ts.onnx")
MLP = str(REPO / "examples" / "models" / "mlp.onnx")
LEVEL0 = ["--target", "cpu", "--builder-optimization-level", "0"]

pytestmark = pytest.mark.usefixtures("fault_plugin")


def _debug_json(capsys, *args) -> dict:
    assert main(["debug", "tactics", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("pattern, layers", [
    ("blocks.0/c1/Conv$|blocks.1/Conv", ["/blocks/blocks.0/c1/Conv", "/blocks/blocks.1/Conv"]),  # fused, plain
    ("stem|blocks.2/c2", ["/stem/stem.0/Conv", "/blocks/blocks.2/c2/Conv"]),  # the first and the last
    ("blocks.2/c", ["/blocks/blocks.2/c1/Conv", "/blocks/blocks.2/c2/Conv"]),  # neighbours
])
def test_two_faulty_conv_layers_are_named_exactly_within_2_log2_n_plus_4_builds(monkeypatch, capsys, pattern, layers):
    monkeypatch.setenv("POLYKIT_FAULT_LAYERS", pattern)
    doc = _debug_json(capsys, CONVNET, *LEVEL0)
    assert [(c["layer"], c["tactic"], c["good_tactic"]) for c in doc["culprits"]] == [
        (name, "fault.Conv", "cpu.reference") for name in layers]
    assert all(c["error"]["max_abs"] > 1e-4 and c["group"] == [] for c in doc["culprits"])
    n = len(doc["suspects"])
    assert n == 7  # six Conv layers and the Gemm run fault tactics
    assert doc["builds"] <= 2 * math.ceil(math.log2(n)) + 4
    assert doc["bad"]["passed"] is False and "logits" in doc["bad"]["detail"]


def test_the_report_names_each_culprit_its_tactics_and_its_error(monkeypatch, capsys):
    monkeypatch.setenv("POLYKIT_FAULT_LAYERS", "fc/Gemm")
    assert main(["debug", "tactics", CONVNET, *LEVEL0]) == 0
    out = capsys.readouterr().out
    assert "7 layer(s) have other tactics" in out and "bad build: FAILS" in out
    row = next(line for line in out.splitlines() if "/fc/Gemm" in line)
    assert "fault.Gemm" in row and "cpu.reference" in row


def test_a_build_without_faults_has_no_culprits_after_one_build(capsys):
    doc = _debug_json(capsys, CONVNET, *LEVEL0)
    assert doc["culprits"] == [] and doc["builds"] == 1 and doc["bad"]["passed"] is True
    assert main(["debug", "tactics", CONVNET, *LEVEL0]) == 0
    assert "no culprits: the bad build passes the check (1 build(s))" in capsys.readouterr().out


def test_the_artifacts_replay_to_a_failing_and_a_passing_build(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("POLYKIT_FAULT_LAYERS", "blocks.0/c2")
    folder = tmp_path / "debug"
    assert main(["debug", "tactics", CONVNET, *LEVEL0, "--artifacts", str(folder)]) == 0
    assert sorted(p.name for p in folder.iterdir()) == ["bad.json", "culprits.json", "fixed.json", "good.json"]
    fixed, good = load_replay(folder / "fixed.json"), load_replay(folder / "good.json")
    assert fixed.layers["/blocks/blocks.0/c2/Conv"].tactic == "cpu.reference"
    assert fixed.layers["/blocks/blocks.0/c1/Conv"].tactic == "fault.Conv"
    assert {choice.tactic for choice in good.layers.values()} == {"cpu.reference"}
    doc = json.loads((folder / "culprits.json").read_text())
    assert doc["trials"][0]["bad_layers"] == doc["suspects"] and doc["trials"][-1]["passed"] is True
    run = ["run", CONVNET, "--trt", "--onnxrt", "--target", "cpu"]
    assert main([*run, "--load-tactics", str(folder / "bad.json")]) == 1
    assert main([*run, "--load-tactics", str(folder / "fixed.json")]) == 0


def test_good_and_bad_replay_files_replace_the_conservative_and_the_current_build(monkeypatch, tmp_path):
    monkeypatch.setenv("POLYKIT_FAULT_LAYERS", "blocks.1/Conv")
    faulty = build_plan(CONVNET, BuilderConfig(target="cpu", builder_optimization_level=0))
    bad = save_replay(tmp_path / "bad.json", TacticReplay.from_layers(faulty.layers))
    im2col = [replace(l, tactic="cpu.conv.im2col") for l in faulty.layers if l.kind == "Conv"]
    good = save_replay(tmp_path / "good.json", TacticReplay.from_layers(im2col))  # names the Conv layers only
    # the default level (3) would time the candidates; the bad replay forces the fault tactics
    report = debug_tactics(CONVNET, BuilderConfig(target="cpu"), DebugOptions(good_tactics=good, bad_tactics=bad))
    assert [(c.layer, c.tactic, c.good_tactic) for c in report.result.culprits] == [
        ("/blocks/blocks.1/Conv", "fault.Conv", "cpu.conv.im2col")]
    assert report.good_source == str(good)


def test_saved_reference_outputs_replace_onnxruntime(monkeypatch, tmp_path, capsys):
    inputs, outputs = str(tmp_path / "in.npz"), str(tmp_path / "ref.npz")
    assert main(["run", MLP, "--onnxrt", "--save-inputs", inputs, "--save-outputs", outputs]) == 0
    capsys.readouterr()
    monkeypatch.setenv("POLYKIT_FAULT_LAYERS", "fc1")
    doc = _debug_json(capsys, MLP, *LEVEL0, "--load-inputs", inputs, "--load-outputs", outputs)
    assert [(c["layer"], c["tactic"]) for c in doc["culprits"]] == [("fc1", "fault.Gemm")]


def test_a_check_command_judges_each_trial_by_its_exit_code(monkeypatch, capsys, tmp_path):
    """The command here is `polykit run` itself, in a subprocess that finds the plugin the same way."""
    monkeypatch.setenv("POLYKIT_FAULT_LAYERS", "fc2")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FAULT_PLUGIN), str(REPO)]))
    polykit = shlex.join([sys.executable, "-c", "import sys; from polykit.tools.cli.app import main; sys.exit(main())"])
    check = f"{polykit} run {MLP} --trt --onnxrt --target cpu --load-tactics {{tactics}}"
    doc = _debug_json(capsys, MLP, *LEVEL0, "--check", check)
    assert [(c["layer"], c["tactic"], c["error"]) for c in doc["culprits"]] == [("fc2", "fault.Gemm", None)]
    assert doc["suspects"] == ["fc1", "fc2"]
    assert doc["builds"] == 4  # the bad build in process; the checks of both layers, fc1 alone, fc2 alone
    assert doc["bad"]["detail"].startswith("exit code 1")


@pytest.mark.parametrize("args, message", [
    (["--check", "true"], "has no {tactics}"),
    (["--check", "run {tactics}", "--load-outputs", "x.npz"], "--load-outputs steer(s) the built-in check"),
    (["--check", "'unclosed {tactics}"], "is not a command line"),
    (["--check", "no-such-polykit-check-command {tactics}"], "--check cannot run 'no-such-polykit-check-command'"),
    (["--good-tactics", "missing.json"], "tactic replay file 'missing.json' does not exist"),
    (["--atol", "-1"], "--atol '-1' is negative"),
    (["--atol", "0", "--rtol", "0"], "the good tactic assignment fails the check too"),
])
def test_bad_input_exits_2_naming_the_problem(monkeypatch, capsys, args, message):
    monkeypatch.setenv("POLYKIT_FAULT_LAYERS", "fc2")
    assert main(["debug", "tactics", MLP, *LEVEL0, *args]) == 2
    assert message in capsys.readouterr().err.replace("\n", " ")


def test_a_good_replay_of_other_layers_is_a_usage_error(tmp_path):
    good = save_replay(tmp_path / "good.json", TacticReplay({"no_such_layer": LayerChoice("cpu.reference", ("float32",),
                                                                                         ("float32",))}))
    with pytest.raises(BuildError, match="names 1 layer\\(s\\) this build does not have: 'no_such_layer'"):
        debug_tactics(MLP, BuilderConfig(target="cpu"), DebugOptions(good_tactics=good))


def test_a_good_replay_for_other_dtypes_is_refused(tmp_path):
    good = save_replay(tmp_path / "good.json", TacticReplay({"fc1": LayerChoice("cpu.reference", ("float16",) * 3,
                                                                                ("float16",))}))
    with pytest.raises(BuildError, match="chose tactic 'cpu.reference' for input dtypes \\['float16'"):
        debug_tactics(MLP, BuilderConfig(target="cpu"), DebugOptions(good_tactics=good))


def test_only_the_bad_build_writes_the_configs_replay_file(monkeypatch, tmp_path):
    monkeypatch.setenv("POLYKIT_FAULT_LAYERS", "fc2")
    saved = tmp_path / "bad.json"
    report = debug_tactics(MLP, BuilderConfig(target="cpu", builder_optimization_level=0, save_tactics=saved))
    assert report.builds > 1 and load_replay(saved).layers == report.bad.layers


def test_a_plan_file_or_a_file_as_artifacts_folder_is_a_usage_error(tmp_path, capsys):
    plan = str(tmp_path / "m.plan")
    assert main(["convert", MLP, "-o", plan, "--target", "cpu"]) == 0
    assert main(["debug", "tactics", plan]) == 2
    assert "it needs the ONNX model, not a plan" in capsys.readouterr().err
    (tmp_path / "file").write_text("x")
    assert main(["debug", "tactics", MLP, *LEVEL0, "--artifacts", str(tmp_path / "file")]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err


def test_outputs_of_several_runners_without_onnxrt_are_ambiguous(tmp_path, capsys):
    outputs = str(tmp_path / "both.npz")
    assert main(["run", MLP, "--trt", "--polykit", "--target", "cpu", "--save-outputs", outputs]) == 0
    assert main(["debug", "tactics", MLP, *LEVEL0, "--load-outputs", outputs]) == 2
    assert "several runners' outputs" in capsys.readouterr().err


def test_debug_tactics_is_listed_under_debug(capsys):
    assert main(["debug", "--help"]) == 0
    assert "tactics" in capsys.readouterr().out

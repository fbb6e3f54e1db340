"""`polykit run ... --gen-script FILE` writes a script that does what the command does: run
with the venv's python, it exits with the command's code and saves the same arrays."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from polykit.tools.cli.app import main
from polykit.tools.data.results_io import load_feeds, load_outputs
from tests.cli_models import REPO, perturbed_mlp
from tests.cli_models import MLP as MLP_PATH

pytestmark = pytest.mark.usefixtures("fresh_plugins")

MLP = str(MLP_PATH)
NUMPY_REF_PLUGIN = REPO / "examples" / "polykit-plugin-example"


def _script_env(plugins: str = "") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "POLYKIT_PLUGINS"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), str(NUMPY_REF_PLUGIN), env.get("PYTHONPATH", "")]))
    if plugins:
        env["POLYKIT_PLUGINS"] = plugins
    return env


def _cli_and_script(tmp_path, capsys, args: list[str], plugins: str = "") -> tuple[tuple[int, str], tuple[int, str]]:
    """(exit code, stdout) of `polykit run ARGS` (SAVED in paths becoming cli) and of the script it
    generates (SAVED becoming script), run by the venv's python in `tmp_path`."""
    def saving(prefix: str) -> list[str]:
        return ["run", *(a.replace("SAVED", str(tmp_path / prefix)) for a in args)]

    capsys.readouterr()
    cli_code = main(saving("cli"))
    cli_out = capsys.readouterr().out
    script = tmp_path / "gen.py"
    assert main([*saving("script"), "--gen-script", str(script)]) == 0
    assert f"wrote {script}" in capsys.readouterr().out
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=_script_env(plugins), capture_output=True,
                          text=True, timeout=300)
    return (cli_code, cli_out), (done.returncode, done.stdout + done.stderr)


def _same_arrays(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for name in a:
        for x, y in zip(a[name], b[name]):
            assert list(x) == list(y)
            for key in x:
                np.testing.assert_array_equal(x[key], y[key])
                assert x[key].dtype == y[key].dtype


@pytest.mark.parametrize("args", [
    [MLP, "--trt", "--onnxrt", "--target", "cpu", "--save-outputs", "SAVED.npz"],
    [MLP, "--trt", "--onnxrt", "--target", "cpu", "--fp16", "--atol", "1e-2", "probs:1e-3", "--rtol", "1e-3",
     "--save-outputs", "SAVED.npz"],
    [MLP, "--onnxrt", "--trt", "--target", "cpu", "--iterations", "2", "--seed", "7", "--val-range", "x:[-2,2]",
     "--compare", "l2", "--l2-tol", "1e-4", "--save-inputs", "SAVED-in.npz", "--save-outputs", "SAVED.npz"],
    [MLP, "--trt", "--onnxrt", "--target", "cpu", "--fp16", "--layer-precisions", "fc2:fp32", "--precision-constraints",
     "obey", "--check-error-stat", "max", "--atol", "1e-2", "--save-outputs", "SAVED.json", "--format", "polygraphy"],
    [MLP, "--trt", "--onnxrt", "--target", "cpu", "--mark-all", "--builder-optimization-level", "0",
     "--save-outputs", "SAVED.npz"],
    [MLP, "--trt", "--onnxrt", "--target", "cpu", "--weight-streaming", "--weight-streaming-budget", "50%",
     "--allocation-strategy", "static", "--save-outputs", "SAVED.npz"],
], ids=["cpu", "fp16-tolerances", "loader-options-l2", "layer-precisions-polygraphy-format", "mark-all",
        "weight-streaming-budget"])
def test_generated_script_reproduces_the_command(tmp_path, capsys, args):
    (cli_code, cli_out), (code, out) = _cli_and_script(tmp_path, capsys, args)
    assert code == cli_code == 0, out
    assert "PASSED" in out and "PASSED" in cli_out
    saved = [a for a in args if a.startswith("SAVED")]
    assert saved
    for name in saved:
        cli, script = (tmp_path / name.replace("SAVED", p) for p in ("cli", "script"))
        if "-in" in name:
            _same_arrays({"feeds": load_feeds(cli)}, {"feeds": load_feeds(script)})
        else:
            _same_arrays(load_outputs(cli), load_outputs(script))


def test_generated_script_against_saved_outputs_exits_1_as_the_command_does(tmp_path, capsys):
    """A perturbed model checked against the good model's saved inputs and outputs: both fail alike."""
    assert main(["run", MLP, "--onnxrt", "--save-inputs", str(tmp_path / "in.npz"),
                 "--save-outputs", str(tmp_path / "ref.npz")]) == 0
    bad = perturbed_mlp(tmp_path / "bad.onnx")
    (cli_code, cli_out), (code, out) = _cli_and_script(tmp_path, capsys, [
        bad, "--trt", "--target", "cpu", "--load-inputs", str(tmp_path / "in.npz"), "--load-outputs",
        str(tmp_path / "ref.npz"), "--json", "--save-outputs", "SAVED.npz"])
    assert code == cli_code == 1
    cli_doc, doc = json.loads(cli_out), json.loads(out)
    assert doc["comparisons"] == cli_doc["comparisons"] and doc["passed"] is False
    _same_arrays(load_outputs(tmp_path / "cli.npz"), load_outputs(tmp_path / "script.npz"))
    assert list(load_outputs(tmp_path / "cli.npz")) == ["trt"]


def test_generated_script_exits_2_on_a_missing_input_file_as_the_command_does(tmp_path, capsys):
    (cli_code, _), (code, out) = _cli_and_script(
        tmp_path, capsys, [MLP, "--onnxrt", "--load-inputs", str(tmp_path / "missing.npz")])
    assert code == cli_code == 2
    assert "missing.npz" in out and "Traceback" not in out


def test_a_plugin_runner_is_made_with_make_runners_in_the_script(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(NUMPY_REF_PLUGIN))
    monkeypatch.setenv("POLYKIT_PLUGINS", "polykit_numpy_ref")
    (cli_code, _), (code, out) = _cli_and_script(
        tmp_path, capsys, [MLP, "--numpy-ref", "--onnxrt", "--save-outputs", "SAVED.npz"], plugins="polykit_numpy_ref")
    assert code == cli_code == 0, out
    assert "make_runners(['numpy-ref'], RunnerRequest(model=" in (tmp_path / "gen.py").read_text()
    _same_arrays(load_outputs(tmp_path / "cli.npz"), load_outputs(tmp_path / "script.npz"))


def test_the_script_builds_runners_from_loaders_with_only_the_options_given(tmp_path, capsys):
    script = tmp_path / "gen.py"
    assert main(["run", MLP, "--trt", "--onnxrt", "--target", "cpu", "--fp16", "--atol", "1e-3", "--mark-outputs",
                 "h1", "--save-engine", str(tmp_path / "m.plan"), "--gen-script", str(script)]) == 0
    text = script.read_text()
    assert (f"PolykitRunner(EngineFromPlan(SaveEngine(PlanFromOnnx({MLP!r}, BuilderConfig(target='cpu', fp16=True, "
            f"expose_tensors=('h1',), force_marks=True)), {str(tmp_path / 'm.plan')!r})), name='trt')") in text
    assert f"OnnxrtRunner(SessionFromOnnx(ModifyOutputs({MLP!r}, outputs=['h1'])), name='onnxrt')" in text
    assert "CompareOptions(atol={'': 0.001})" in text and "sys.exit(main())" in text
    assert not (tmp_path / "m.plan").exists()  # --gen-script writes the script and runs nothing


def test_gen_script_into_a_missing_folder_is_a_usage_error(tmp_path, capsys):
    assert main(["run", MLP, "--onnxrt", "--gen-script", str(tmp_path / "nodir" / "gen.py")]) == 2
    assert "--gen-script" in capsys.readouterr().err


def test_generated_script_prints_the_profile_in_json_as_the_command_does(tmp_path, capsys):
    (cli_code, cli_out), (code, out) = _cli_and_script(
        tmp_path, capsys, [MLP, "--trt", "--target", "cpu", "--profile", "--json", "--warm-up", "1", "--validate"])
    assert code == cli_code == 0, out
    cli_doc, doc = json.loads(cli_out), json.loads(out)
    assert set(doc) == set(cli_doc) and list(doc["profile"]) == ["trt"]
    assert [l["name"] for l in doc["profile"]["trt"]["layers"]] != [] and doc["profile"]["trt"]["runs"] == 2
    assert {l["name"] for l in doc["profile"]["trt"]["layers"]} == {l["name"] for l in cli_doc["profile"]["trt"]["layers"]}

"""`polykit debug reduce|precision ... --gen-script FILE` writes a script that does what the
command does through the public API (debug_reduce / debug_precision with the command's
BuilderConfig and options): run with the venv's python, it prints the command's --json
document, writes the same files and the same --report page."""

from __future__ import annotations

import json
import subprocess
import sys

import onnx
import pytest

from polykit.tools.cli.app import main
from tests.cli_models import MLP, perturbed_mlp
from tests.tools.debug.test_precision import overflow_model
from tests.tools.cli.test_gen_script import _script_env

pytestmark = pytest.mark.usefixtures("fresh_plugins")


def _cli_and_script(tmp_path, capsys, args: list[str]) -> tuple[dict, dict, str]:
    """The --json documents of `polykit debug ARGS` and of the script it generates (OUT in args
    becomes cli/ and script/, folders of their files), and the script's source."""
    def writing(prefix: str) -> list[str]:
        (tmp_path / prefix).mkdir(exist_ok=True)
        return ["debug", *(a.replace("OUT", str(tmp_path / prefix)) for a in args), "--json"]

    capsys.readouterr()
    assert main(writing("cli")) == 0
    cli = json.loads(capsys.readouterr().out)
    script = tmp_path / "gen.py"
    assert main([*writing("script"), "--gen-script", str(script)]) == 0
    assert f"wrote {script}" in capsys.readouterr().out
    assert not any((tmp_path / "script").iterdir())  # --gen-script only writes the script
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=_script_env(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return cli, json.loads(done.stdout), script.read_text()


def _same_files(tmp_path, *names: str) -> None:
    for name in names:
        cli, script = (tmp_path / side / name for side in ("cli", "script"))
        if name.endswith(".html"):  # the page shows the document's paths
            assert script.read_text() == cli.read_text().replace(str(tmp_path / "cli"), str(tmp_path / "script"))
        else:
            assert script.read_bytes() == cli.read_bytes()


def test_the_reduce_script_saves_the_same_subgraphs_and_prints_the_same_report(tmp_path, capsys):
    ref, inputs = tmp_path / "ref.npz", tmp_path / "in.npz"
    assert main(["run", str(MLP), "--onnxrt", "--mark-all", "--save-inputs", str(inputs), "--save-outputs", str(ref)]) == 0
    bad = perturbed_mlp(tmp_path / "bad.onnx")
    cli, script, source = _cli_and_script(tmp_path, capsys, [
        "reduce", bad, "-o", "OUT/r.onnx", "--min-good", "OUT/good.onnx", "--report", "OUT/r.html",
        "--load-inputs", str(inputs), "--load-outputs", str(ref), "--target", "cpu", "--atol", "1e-4"])
    assert "debug_reduce(" in source and "ReduceOptions(" in source and "BuilderConfig(target='cpu'" in source
    assert cli["reduced"]["nodes"] == ["fc2"] and cli["reduced"]["path"] == str(tmp_path / "cli" / "r.onnx")
    assert script == json.loads(json.dumps(cli).replace(str(tmp_path / "cli"), str(tmp_path / "script")))
    _same_files(tmp_path, "r.onnx", "good.onnx", "r.html")
    onnx.checker.check_model(onnx.load(str(tmp_path / "script" / "r.onnx")), full_check=True)


def test_the_precision_script_finds_the_same_set_and_writes_the_same_value(tmp_path, capsys):
    model = overflow_model(tmp_path / "overflow.onnx")
    cli, script, source = _cli_and_script(tmp_path, capsys, [
        "precision", model, "--fp16", "--target", "cpu", "--atol", "1e-2", "--rtol", "1e-2", "--rank", "isolated",
        "--timing-iterations", "0", "-o", "OUT/fp32.txt", "--report", "OUT/p.html"])
    assert "debug_precision(" in source and "rank='isolated'" in source and "fp16=True" in source
    assert cli["layer_precisions"] == "big_mm:fp32,scale_down:fp32" and cli["rank"] == "isolated"
    assert script == cli
    _same_files(tmp_path, "fp32.txt", "p.html")


def test_a_script_without_json_prints_the_text_report(tmp_path, capsys):
    model = overflow_model(tmp_path / "overflow.onnx")
    script = tmp_path / "gen.py"
    assert main(["debug", "precision", model, "--fp16", "--target", "cpu", "--atol", "1e-2", "--rtol", "1e-2",
                 "--timing-iterations", "0", "--gen-script", str(script)]) == 0
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=_script_env(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "--layer-precisions big_mm:fp32,scale_down:fp32" in done.stdout


def test_a_script_of_a_model_that_does_not_fail_exits_0_with_the_commands_message(tmp_path, capsys):
    script = tmp_path / "gen.py"
    assert main(["debug", "reduce", str(MLP), "-o", str(tmp_path / "r.onnx"), "--target", "cpu",
                 "--gen-script", str(script)]) == 0
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=_script_env(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and "the model passes the check" in done.stdout, done.stderr[-3000:]
    assert main(["debug", "reduce", str(MLP), "-o", str(tmp_path / "r.onnx"), "--target", "cpu"]) == 0

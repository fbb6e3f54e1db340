"""Polygraphy's CLI debug examples (examples/cli/debug/*/README.md of NVIDIA/TensorRT, vendored
under tests/data/polygraphy_examples/cli/debug with a NOTICE) run as written, `polygraphy`
replaced by `polykit`, on the cpu target (CUDA_VISIBLE_DEVICES hides any GPU), and reach the
outcome each README describes.

The harness is self-contained: `readme_commands` takes the ```bash blocks outside the
"Polygraphy Test: Ignore" regions, joins continued lines and replaces the word `polygraphy`
(not `polygraphy_debug.onnx`); `run_commands` runs them in order through the shell in one
folder that holds the example's files, with `polykit` on PATH.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "tests" / "data" / "polygraphy_examples" / "cli" / "debug"
_IGNORED = re.compile(r"<!-- Polygraphy Test: Ignore Start -->.*?<!-- Polygraphy Test: Ignore End -->", re.S)
_BLOCK = re.compile(r"```bash\n(.*?)```", re.S)
#: polykit features the examples use that other work of issue 32 adds: a command that fails with
#: "No such option/command" naming one of these is skipped with the reason, anything else fails
PENDING = {
    "--override-input-shapes": "surgeon sanitize --override-input-shapes (issue 32, point 8)",
    "--onnx-outputs": "--onnx-outputs mark all (issue 32, point 2)",
    "to-input": "data to-input (issue 32, point 9)",
}


def readme_commands(readme: Path) -> list[str]:
    """The example's commands, `polygraphy` replaced by `polykit`."""
    text = _IGNORED.sub("", readme.read_text())
    commands = []
    for block in _BLOCK.findall(text):
        joined = re.sub(r"\s*\\\n\s*", " ", block).strip()
        commands += [re.sub(r"\bpolygraphy\b", "polykit", line.strip()) for line in joined.splitlines() if line.strip()]
    return commands


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env["CUDA_VISIBLE_DEVICES"] = ""  # the cpu target
    env.pop("POLYKIT_PLUGINS", None)
    env["COLUMNS"] = "200"
    return env


def run(command: str, folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run(command, shell=True, cwd=folder, env=_env(), capture_output=True, text=True, timeout=600)


def run_commands(commands: list[str], folder: Path) -> list[subprocess.CompletedProcess]:
    """Run each command; a failure fails the test, or skips it when it is a PENDING feature's."""
    done = []
    for command in commands:
        result = run(command, folder)
        if result.returncode != 0:
            missing = re.search(r"No such (option|command)", result.stderr)
            reason = next((why for word, why in PENDING.items() if missing and word in command), None)
            if reason:
                pytest.skip(f"needs {reason}: {command}")
            pytest.fail(f"{command}\nexit code {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
        done.append(result)
    return done


def _debug02_model(path: Path) -> None:
    """The example's model.onnx (not vendored: 1.2 MB of ones; see the NOTICE): the same graph."""
    ones = np.ones((1, 3, 224, 224), np.float32)
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 3, 224, 224]) for n in ("x0", "x1", "Y")]
    nodes = [helper.make_node("Mul", ["a", "x1"], ["mul_out"]), helper.make_node("Add", ["mul_out", "b"], ["add_out"]),
             helper.make_node("Add", ["x0", "add_out"], ["Y"])]
    graph = helper.make_graph(nodes, "onnx_graphsurgeon_graph", io[:2], io[2:],
                              [numpy_helper.from_array(ones, "a"), numpy_helper.from_array(ones, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 7
    onnx.save(model, str(path))


def _example(name: str, tmp_path: Path) -> tuple[list[str], Path]:
    shutil.copytree(EXAMPLES / name, tmp_path, dirs_exist_ok=True)
    return readme_commands(tmp_path / "README.md"), tmp_path


def test_the_commands_are_extracted_as_a_user_reads_them():
    commands = readme_commands(EXAMPLES / "02_reducing_failing_onnx_models" / "README.md")
    assert len(commands) == 9 and all(c.startswith("polykit ") for c in commands)
    assert commands[4] == ('polykit debug reduce folded.onnx -o initial_reduced.onnx --mode=bisect --fail-regex '
                           '"Op: Mul" --check polykit inspect model polygraphy_debug.onnx --show layers')


def test_01_debugging_flaky_tactics_sorts_ten_passing_builds_and_finds_no_bad_tactic(tmp_path):
    commands, folder = _example("01_debugging_flaky_trt_tactics", tmp_path)
    assert [c.split()[1:3] for c in commands] == [["run", "identity.onnx"], ["debug", "build"],
                                                  ["inspect", "diff-tactics"]]
    fp16 = run("polykit run identity.onnx --trt --onnxrt --fp16", folder)
    if fp16.returncode != 0:
        pytest.skip("needs an --fp16 build that does not round an Identity between fp32 I/O (issue 32, point 7)")
    *_, diff = run_commands(commands, folder)
    assert len(list((folder / "replays" / "good").iterdir())) == 10 and not (folder / "replays" / "bad").exists()
    assert diff.stdout.splitlines() == [
        "Loaded 10 good tactic replays.", "Loaded 0 bad tactic replays.",
        "Could not determine potentially bad tactics. Try generating more tactic replay files?"]


def test_02_reducing_a_failing_model_leaves_just_the_mul(tmp_path):
    commands, folder = _example("02_reducing_failing_onnx_models", tmp_path)
    _debug02_model(folder / "model.onnx")
    layers = run("polykit inspect model model.onnx --show layers", folder)
    if "Op: Mul" not in layers.stdout:
        pytest.skip("needs Polygraphy's 'Op: Mul' lines from inspect model --show layers (issue 32, point 10), "
                    "which the simulated failure greps")
    run_commands(commands, folder)
    initial = [n.op_type for n in onnx.load(str(folder / "initial_reduced.onnx")).graph.node]
    final = [n.op_type for n in onnx.load(str(folder / "final_reduced.onnx")).graph.node]
    assert "Mul" in initial and final == ["Mul"]

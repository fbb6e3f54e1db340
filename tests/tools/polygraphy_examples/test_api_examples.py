"""Polygraphy's API examples (examples/api 00-08 of NVIDIA/TensorRT, vendored unchanged under
tests/data/polygraphy_examples/api with the NOTICE) run on polykit's names: each README's
commands as written, `python3 SCRIPT` as `python -m polykit.compat SCRIPT` (which resolves
`import polygraphy...` to polykit.compat.polygraphy: TrtRunner over polykit's engine,
EngineFromNetwork/NetworkFromOnnxPath building polykit plans, Comparator, CompareFunc, ...),
on the cpu target. And the examples' own asserts fail when the comparison fails: with
polykit's engine perturbed (perturbed_engine.py) the same scripts exit with AssertionError.

03 (TensorRT's INetworkDefinition and IBuilderConfig edited directly) and 05 (a network built
with TensorRT's layer API) are not vendored; 06 builds its engine through TensorRT's network API,
so its build and the commands that need that engine are EXCEPTIONS (docs/POLYGRAPHY.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from polykit.compiler.plan.file import Plan
from polykit.tools.data import results_io
from tests.tools.polygraphy_examples.harness import API_EXAMPLES, commands, copy_example, example_environment, run_command

API_DIRS = sorted(p.parent.name for p in API_EXAMPLES.glob("*/README.md"))
NETWORK_API = "TensorRT-only: build_and_run.py edits the parsed network with TensorRT's INetworkDefinition API"
EXCEPTIONS = {("06_immediate_eval_api", 1): NETWORK_API,
              ("06_immediate_eval_api", 2): "inspects the engine build_and_run.py builds",
              ("06_immediate_eval_api", 3): "loads the engine build_and_run.py builds"}


def _outcome_00(folder: Path, outputs: list[str]) -> None:
    assert Plan.load(folder / "identity.engine").target == "cpu"
    assert outputs[1].strip().endswith("Inference succeeded!") and outputs[3].strip().endswith("Inference succeeded!")


def _outcome_01(folder: Path, outputs: list[str]) -> None:
    saved = results_io.load_outputs(folder / "inference_results.json")
    assert list(saved) == ["trt", "onnxrt"] and outputs[0].count("PASSED |") == 3


def _outcome_04(folder: Path, outputs: list[str]) -> None:
    assert (folder / "identity-calib.cache").is_file()  # the second run reads it back


def _outcome_07(folder: Path, outputs: list[str]) -> None:
    assert len(Plan.load(folder / "dynamic_identity.engine").profiles.ranges) == 3
    assert "Offline runner succeeded!" in outputs[0]


def _outcome_08(folder: Path, outputs: list[str]) -> None:
    assert "Processing outputs for runner: trt" in outputs[-1] and "Processing outputs for runner: onnxrt" in outputs[-1]


OUTCOMES = {"00_inference_with_tensorrt": _outcome_00, "01_comparing_frameworks": _outcome_01,
            "04_int8_calibration_in_tensorrt": _outcome_04, "07_tensorrt_and_dynamic_shapes": _outcome_07,
            "08_working_with_run_results_and_saved_inputs_manually": _outcome_08}


@pytest.fixture(autouse=True)
def cpu_target(monkeypatch, fresh_plugins):
    example_environment(monkeypatch)


def test_the_vendored_examples():
    assert API_DIRS == ["00_inference_with_tensorrt", "01_comparing_frameworks", "02_validating_on_a_dataset",
                        "04_int8_calibration_in_tensorrt", "06_immediate_eval_api", "07_tensorrt_and_dynamic_shapes",
                        "08_working_with_run_results_and_saved_inputs_manually"]


@pytest.mark.parametrize("example", API_DIRS)
def test_api_example_runs(example, tmp_path):
    folder = copy_example(example, tmp_path, API_EXAMPLES)
    outputs = []
    for index, command in enumerate(commands((folder / "README.md").read_text(encoding="utf-8"))):
        if (example, index) in EXCEPTIONS:
            continue
        code, output = run_command(command, folder)
        assert code == 0, f"{example} command {index}: `{command.text}` exited {code}\n{output}"
        outputs.append(output)
    if example in OUTCOMES:
        OUTCOMES[example](folder, outputs)


def _script(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=folder, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("example,script", [("01_comparing_frameworks", "example.py"),
                                            ("02_validating_on_a_dataset", "example.py"),
                                            ("00_inference_with_tensorrt", "build_and_run.py")])
def test_the_examples_asserts_fail_when_the_engine_is_wrong(example, script, tmp_path):
    folder = copy_example(example, tmp_path, API_EXAMPLES)
    done = _script(folder, "-m", "tests.tools.polygraphy_examples.perturbed_engine", script)
    assert done.returncode == 1 and "AssertionError" in done.stderr, done.stdout + done.stderr
    if example == "01_comparing_frameworks":  # the gate is compare_accuracy's report, which says why
        assert "FAILED |" in done.stdout and "All outputs matched" not in done.stdout


def test_the_network_api_is_refused_with_a_reason(tmp_path):
    folder = copy_example("06_immediate_eval_api", tmp_path, API_EXAMPLES)
    done = _script(folder, "-m", "polykit.compat", "build_and_run.py")
    assert done.returncode == 1 and "network.get_output: TensorRT's INetworkDefinition API" in done.stderr

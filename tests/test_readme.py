"""The README's promises hold: its commands refer to real things, .ci/run runs its test command,
and its Python examples run."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
TEST_COMMAND = "python3 -m venv .venv && .venv/bin/python -m pip install -e '.[test,cuda]' && .venv/bin/python -m pytest -q -n auto"
RUN_COMMAND = ("python3 -m venv .venv && .venv/bin/python -m pip install -e '.[toolkit]' && "
               ".venv/bin/polykit run examples/models/mlp.onnx --trt --onnxrt")


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def test_readme_has_the_two_set_up_commands():
    commands = [line for block in _blocks("bash") for line in block.splitlines()]
    assert TEST_COMMAND in commands and RUN_COMMAND in commands


def test_ci_runs_exactly_the_readme_test_command():
    ci = (REPO / ".ci" / "run").read_text()
    assert ci.startswith("#!/usr/bin/env bash") and "set -euo pipefail" in ci
    assert f"{TEST_COMMAND} || status=$?" in ci


def test_ci_script_is_valid_bash():
    assert subprocess.run(["bash", "-n", str(REPO / ".ci" / "run")]).returncode == 0


def test_bundled_example_model_is_small_and_present():
    model = REPO / "examples" / "models" / "mlp.onnx"
    assert model.is_file() and model.stat().st_size < 100_000


@pytest.mark.parametrize("index", range(len(_blocks("python"))))
def test_python_examples_run(index, monkeypatch, tmp_path):
    monkeypatch.chdir(REPO)
    code = _blocks("python")[index]
    namespace: dict = {"__name__": "readme_example"}
    exec(compile(code, f"README.md python block {index}", "exec"), namespace)
    for name, fn in list(namespace.items()):  # the pytest examples: call the plain test functions
        if name.startswith("test_") and callable(fn) and fn.__code__.co_argcount == 0:
            fn()

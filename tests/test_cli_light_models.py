"""Acceptance: `polykit run MODEL --trt --onnxrt` passes on ONNX's light_* models (cpu target,
default fp32 tolerances). Two (FAST) run in a `-m "not slow"` pass; the others are marked slow."""

from __future__ import annotations

import os
from pathlib import Path

import onnx
import pytest

from polykit.plugins import reset_plugin_manager
from polykit.tools.cli.app import main

LIGHT = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light"
ALL = sorted(p.name for p in LIGHT.glob("light_*.onnx"))
FAST = ["light_squeezenet.onnx", "light_inception_v1.onnx"]


@pytest.fixture(autouse=True)
def fresh_plugins():
    reset_plugin_manager()
    yield
    reset_plugin_manager()


def test_light_models_are_available():
    assert len(ALL) >= 9


@pytest.mark.parametrize("name", [name if name in FAST else pytest.param(name, marks=pytest.mark.slow) for name in ALL])
def test_every_light_model_passes_trt_vs_onnxrt(name, capsys):
    assert main(["run", str(LIGHT / name), "--trt", "--onnxrt", "--target", "cpu"]) == 0
    assert "PASSED" in capsys.readouterr().out

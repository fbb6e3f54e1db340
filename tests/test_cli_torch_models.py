"""Acceptance: `polykit run MODEL --trt --onnxrt` passes on our own PyTorch exports (conv net with
BatchNorm and residuals, BERT, GPT-2, ViT; TorchScript and dynamo exporters; external data),
cpu target, default fp32 tolerances. The models come from tests/data/make_torch_models.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from polykit.plugins import reset_plugin_manager
from polykit.tools.cli.app import main

DATA = Path(__file__).parent / "data" / "torch"
MODELS = sorted(p.name for p in DATA.glob("*.onnx"))


@pytest.fixture(autouse=True)
def fresh_plugins():
    reset_plugin_manager()
    yield
    reset_plugin_manager()


def test_every_family_and_both_exporters_are_present():
    for family in ("convnet", "bert_tiny", "gpt2_tiny", "vit_tiny"):
        assert f"{family}_ts.onnx" in MODELS and f"{family}_dynamo.onnx" in MODELS
    assert (DATA / "convnet_extdata_dynamo.onnx.data").is_file()


@pytest.mark.parametrize("name", MODELS)
def test_torch_export_passes_trt_vs_onnxrt_at_default_tolerances(name, capsys):
    assert main(["run", str(DATA / name), "--trt", "--onnxrt", "--target", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "PASSED" in out and "FAILED" not in out

"""GPU: `polykit debug reduce` on the cuda target shrinks the convnet with one faulty layer (the
example fault plugin's cuda tactic) to at most 5 nodes holding it, the first node too."""

from __future__ import annotations

import json

import onnx
import pytest

from polykit.tools.cli.app import main
from tests.cli_models import REPO

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fault_plugin")]

CONVNET = str(REPO / "tests" / "data" / "torch" / "convnet_ts.onnx")


@pytest.mark.parametrize("pattern, culprit", [("stem", "/stem/stem.0/Conv"), ("blocks.1/Conv", "/blocks/blocks.1/Conv")])
def test_the_cuda_build_reduces_to_the_faulty_layer(monkeypatch, capsys, tmp_path, pattern, culprit):
    monkeypatch.setenv("POLYKIT_FAULT_LAYERS", pattern)
    out = tmp_path / "reduced.onnx"
    assert main(["debug", "reduce", CONVNET, "-o", str(out), "--target", "cuda", "--builder-optimization-level", "0",
                 "--atol", "1e-4", "--rtol", "1e-4", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert culprit in doc["reduced"]["nodes"] and len(doc["reduced"]["nodes"]) <= 5
    onnx.checker.check_model(onnx.load(str(out)), full_check=True)
    assert main(["run", str(out), "--trt", "--onnxrt", "--target", "cuda", "--builder-optimization-level", "0",
                 "--atol", "1e-4", "--rtol", "1e-4"]) == 1

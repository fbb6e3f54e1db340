"""GPU: `polykit debug precision --fp16` on the cuda target names the MatMul whose values exceed
fp16's range in a set of at most 3 nodes; `run --fp16 --layer-precisions <that set>` passes."""

from __future__ import annotations

import json

import pytest

from polykit.tools.cli import main
from tests.tools.test_debug_precision import overflow_model

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fresh_plugins")]

CUDA_FP16 = ["--target", "cuda", "--fp16", "--atol", "1e-2", "--rtol", "1e-2"]


@pytest.mark.parametrize("rank", ["layerwise", "isolated"])
def test_the_cuda_fp16_build_keeps_the_overflowing_matmul_in_fp32(capsys, tmp_path, rank):
    model = overflow_model(tmp_path / "overflow.onnx")
    run = ["run", model, "--trt", "--onnxrt", *CUDA_FP16]
    assert main(run) == 1
    capsys.readouterr()
    assert main(["debug", "precision", model, *CUDA_FP16, "--rank", rank, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    names = [n["name"] for n in doc["nodes"]]
    assert "big_mm" in names and len(names) <= 3
    assert doc["before"]["latency_ms"] > 0 and doc["after"]["latency_ms"] > 0
    assert main(run + ["--layer-precisions", doc["layer_precisions"]]) == 0

"""GPU: `polykit debug precision --fp16` on the cuda target. The cuda engine fuses the
overflowing MatMul with the scale that follows it into one GEMM, and its epilogue rounds the
product to fp16 before the scale, as the op-by-op reference and ONNX do (each node's output is of
type T; since the cuda16 round of 2026-11-24 — before it, the epilogue kept the product in fp32
and this build passed). So the fp16 build fails on cuda as it does on cpu
(tests/tools/debug/test_precision.py), and debug precision names the MatMul on cuda too."""

from __future__ import annotations

import json

import pytest

from polykit.tools.cli.app import main
from tests.tools.debug.test_precision import overflow_model

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fresh_plugins")]

CUDA_FP16 = ["--target", "cuda", "--fp16", "--atol", "1e-2", "--rtol", "1e-2"]


@pytest.mark.parametrize("rank", ["layerwise", "isolated"])
def test_the_fused_cuda_fp16_build_overflows_like_cpu_and_the_matmul_is_named(capsys, tmp_path, rank):
    model = overflow_model(tmp_path / "overflow.onnx")
    assert main(["run", model, "--trt", "--onnxrt", *CUDA_FP16]) == 1
    capsys.readouterr()
    assert main(["debug", "precision", model, *CUDA_FP16, "--rank", rank, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    names = [n["name"] for n in doc["nodes"]]
    assert "big_mm" in names and len(names) <= 3, names
    assert doc["before"]["passed"] is False and doc["after"]["passed"] is True
    value = doc["layer_precisions"]
    assert main(["run", model, "--trt", "--onnxrt", *CUDA_FP16, "--layer-precisions", value]) == 0

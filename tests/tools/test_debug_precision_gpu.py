"""GPU: `polykit debug precision --fp16` on the cuda target. The cuda engine fuses the
overflowing MatMul with the scale that follows it into one GEMM whose epilogue runs in fp32
before the fp16 store, so the fp16 build of the overflow model already passes on cuda (on the
cpu target, which stores the MatMul's fp16 output, it fails: tests/tools/test_debug_precision.py).
debug precision then reports that no node needs fp32, with the latency of the build."""

from __future__ import annotations

import json

import pytest

from polykit.tools.cli import main
from tests.tools.test_debug_precision import overflow_model

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fresh_plugins")]

CUDA_FP16 = ["--target", "cuda", "--fp16", "--atol", "1e-2", "--rtol", "1e-2"]


@pytest.mark.parametrize("rank", ["layerwise", "isolated"])
def test_the_fused_cuda_fp16_build_needs_no_fp32_node(capsys, tmp_path, rank):
    model = overflow_model(tmp_path / "overflow.onnx")
    assert main(["run", model, "--trt", "--onnxrt", *CUDA_FP16]) == 0
    capsys.readouterr()
    assert main(["debug", "precision", model, *CUDA_FP16, "--rank", rank, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["nodes"] == [] and doc["layer_precisions"] == "" and doc["before"]["passed"] is True

"""FP8 from the command line and the Polygraphy compat layer: --fp8 on convert / run / bench
(cpu target), the cache it writes, an INT8 cache refused; CreateConfig(fp8=True)."""

from __future__ import annotations

import onnx
import pytest

from polykit.compiler.builder.calibration_cache import read_calibration_cache
from polykit.compiler.plan.file import Plan
from polykit.tools.cli.app import main

from .test_int8 import INT8_VS_FP32, calibration_dir, resnet  # noqa: F401 (fixtures)

pytestmark = pytest.mark.usefixtures("fresh_plugins")


def test_convert_fp8_writes_an_fp8_cache_and_rebuilds_from_it(resnet, calibration_dir, tmp_path, capsys):  # noqa: F811
    cache, first, second = tmp_path / "r.cache", tmp_path / "a.plan", tmp_path / "b.plan"
    common = ["--fp8", "--target", "cpu", "--calibration-cache", str(cache), "--builder-optimization-level", "0"]
    assert main(["convert", resnet, "-o", str(first), "--calibration-data", calibration_dir, *common]) == 0
    assert read_calibration_cache(cache).type == "fp8"
    assert main(["convert", resnet, "-o", str(second), *common]) == 0
    assert first.read_bytes() == second.read_bytes()
    layers = [layer for layer in Plan.load(second).layers if layer.kind in ("QConv", "QMatMul")]
    assert layers and {layer.precision for layer in layers} == {"fp8"}
    # the same cache for an --int8 build: exit 2, the file named, no traceback
    capsys.readouterr()
    assert main(["convert", resnet, "-o", str(tmp_path / "c.plan"), *common[1:], "--int8"]) == 2
    err = capsys.readouterr().err
    assert "holds FP8 scales" in err and str(cache) in err and "Traceback" not in err


def test_run_fp8_against_onnxruntime_passes_at_the_int8_tolerance(resnet, calibration_dir):  # noqa: F811
    assert main(["run", resnet, "--fp8", "--trt", "--onnxrt", "--target", "cpu", "--calibration-data",
                 calibration_dir, *INT8_VS_FP32]) == 0


def test_bench_fp8_with_tensor_ranges(tmp_path):
    # every quantized input has a range, so no data is needed (a missing one is a usage error: exit 2)
    from tests.compiler.int8_models import convnet

    model = tmp_path / "convnet.onnx"
    onnx.save(convnet(), str(model))
    args = ["bench", str(model), "--fp8", "--target", "cpu", "--iterations", "2", "--duration", "0", "--warm-up", "0"]
    assert main([*args, "--tensor-ranges", "x:-2,2", "r1:0,3", "f:0,2"]) == 0
    assert main([*args, "--tensor-ranges", "x:-2,2", "r1:0,3"]) == 2


def test_polygraphy_create_config_takes_fp8():
    from polykit.compat.polygraphy.backend.trt import CreateConfig

    cfg = CreateConfig(fp8=True)()
    assert cfg.fp8 and not cfg.int8

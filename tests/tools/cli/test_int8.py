"""INT8 from the command line: --int8 with calibration data, caches, ranges and calibrators on
run, convert and bench (cpu target)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from polykit.compiler.builder.calibration_cache import read_calibration_cache
from polykit.compiler.plan.file import Plan
from polykit.errors import UsageError
from polykit.tools.cli.app import main
from polykit.tools.cli.args import builder_config_options, calibration_source, parse_tensor_ranges
from polykit.tools.data.loaders import ScriptDataLoader
from tests.compiler.int8_models import feeds_for, small_resnet

#: the tolerance INT8 against fp32 is held to (docs/INT8.md): cosine similarity >= 0.99
INT8_VS_FP32 = ["--compare", "cosine", "--cosine-tol", "0.01"]


pytestmark = pytest.mark.usefixtures("fresh_plugins")


@pytest.fixture
def resnet(tmp_path) -> str:
    path = tmp_path / "resnet.onnx"
    onnx.save(small_resnet(), str(path))
    return str(path)


@pytest.fixture
def calibration_dir(tmp_path) -> str:
    folder = tmp_path / "calibration"
    folder.mkdir()
    for seed in range(6):
        np.savez(folder / f"batch{seed}.npz", **feeds_for(small_resnet(), seed))
    return str(folder)


def test_run_int8_against_onnxruntime_passes_at_the_stated_tolerance(resnet, calibration_dir, tmp_path):
    inputs = tmp_path / "inputs.npz"
    np.savez(inputs, **{f"0/{k}": v for k, v in feeds_for(small_resnet(), 50).items()})
    argv = ["run", resnet, "--int8", "--trt", "--onnxrt", "--target", "cpu", "--calibration-data", calibration_dir,
            "--load-inputs", str(inputs)]
    assert main(argv + INT8_VS_FP32) == 0
    assert main(argv + ["--atol", "1e-6", "--rtol", "0"]) == 1  # it is INT8: not float-exact


def test_run_calibrates_with_the_data_loader_script(resnet, tmp_path, capsys):
    script = tmp_path / "loader.py"
    script.write_text("from tests.compiler.int8_models import feeds_for, small_resnet\n\n"
                      "def load_data():\n    return [feeds_for(small_resnet(), seed) for seed in range(4)]\n")
    cache = tmp_path / "c.cache"
    assert main(["run", resnet, "--int8", "--trt", "--onnxrt", "--target", "cpu", "--data-loader-script", str(script),
                 "--calibration-cache", str(cache), *INT8_VS_FP32]) == 0
    assert read_calibration_cache(cache).calibrator == "entropy"


def test_convert_writes_the_cache_and_rebuilds_from_it_alone(resnet, calibration_dir, tmp_path, capsys):
    cache, first, second = tmp_path / "r.cache", tmp_path / "a.plan", tmp_path / "b.plan"
    common = ["--int8", "--target", "cpu", "--calibration-cache", str(cache), "--builder-optimization-level", "0",
              "--calibrator", "minmax"]
    assert main(["convert", resnet, "-o", str(first), "--calibration-data", calibration_dir, *common]) == 0
    assert read_calibration_cache(cache).calibrator == "minmax"
    assert main(["convert", resnet, "-o", str(second), *common]) == 0
    assert first.read_bytes() == second.read_bytes()
    assert "QConv" in {layer.kind for layer in Plan.load(second).layers}


def test_a_bad_cache_is_an_input_error_naming_file_and_line(resnet, tmp_path, capsys):
    cache = tmp_path / "bad.cache"
    cache.write_text("polykit-calibration-cache 1 polykit=0.1.0 calibrator=entropy\nimage: 1.5\n")
    assert main(["convert", resnet, "-o", str(tmp_path / "x.plan"), "--int8", "--target", "cpu",
                 "--calibration-cache", str(cache)]) == 2
    assert f"{cache}:2" in capsys.readouterr().err.replace("\n", "")


def test_bench_int8_with_tensor_ranges(tmp_path, capsys):
    from tests.compiler.int8_models import convnet

    model = tmp_path / "convnet.onnx"
    onnx.save(convnet(), str(model))
    assert main(["bench", str(model), "--int8", "--target", "cpu", "--tensor-ranges", "x:-2,2", "r1:0,3", "f:0,2",
                 "--iterations", "2", "--duration", "0", "--warm-up", "0"]) == 0


def test_unknown_calibrator_and_percentile_are_usage_errors(resnet, tmp_path, capsys):
    out = ["-o", str(tmp_path / "x.plan"), "--target", "cpu", "--int8"]
    assert main(["convert", resnet, *out, "--calibrator", "kl"]) == 2
    assert main(["convert", resnet, *out, "--calibrator", "percentile", "--percentile", "101"]) == 2


def test_tensor_ranges_parse_names_with_colons():
    assert parse_tensor_ranges(["/conv1/Conv_output_0:0,6.5", "a:b:-1e-2,2"]) == {
        "/conv1/Conv_output_0": (0.0, 6.5), "a:b": (-0.01, 2.0)}
    with pytest.raises(UsageError, match="NAME:MIN,MAX"):
        parse_tensor_ranges(["x:[0,1]"])


def test_int8_options_are_builder_config_fields(tmp_path):
    from polykit.compiler.builder.config import BuilderConfig

    cfg = BuilderConfig(**builder_config_options(int8=True, calibrator="percentile", percentile=99.9,
                                                 calibration_data=str(tmp_path), tensor_ranges=["x:-1,1"],
                                                 calibration_cache="c.cache"))
    assert (cfg.int8, cfg.calibrator, cfg.percentile, cfg.calibration_data, cfg.tensor_ranges, cfg.calibration_cache) \
        == (True, "percentile", 99.9, str(tmp_path), {"x": (-1.0, 1.0)}, "c.cache")
    assert isinstance(calibration_source("my_loader.py:batches"), ScriptDataLoader)
    assert calibration_source(str(Path("calib") / "dir")) == str(Path("calib") / "dir")

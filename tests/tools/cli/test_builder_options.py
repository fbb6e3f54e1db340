"""The builder options run and convert share (tools/cli/args.with_builder_options): tuning
level, timing caches, workspace limit, precision flags and I/O formats, from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polykit.compiler.plan.file import Plan
from polykit.errors import UsageError
from polykit.plugins import reset_plugin_manager
from polykit.tools.cli.app import main
from polykit.tools.cli.args import builder_config_options, parse_layer_precisions, parse_memory_pool_limits, split_list

REPO = Path(__file__).resolve().parents[3]
MLP = str(REPO / "examples" / "models" / "mlp.onnx")  # x -> logits, probs


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.delenv("POLYKIT_PLUGINS", raising=False)
    reset_plugin_manager()
    yield
    reset_plugin_manager()


def test_memory_pool_limits_parse_sizes():
    assert parse_memory_pool_limits(["workspace:4096"]) == {"workspace": 4096}
    assert parse_memory_pool_limits(["workspace:64M"]) == {"workspace": 64 << 20}
    assert parse_memory_pool_limits(["workspace:1.5GiB"]) == {"workspace": 3 << 29}
    for bad in ("tactic:1M", "workspace:-1", "workspace:lots"):
        with pytest.raises(UsageError, match="--memory-pool-limit"):
            parse_memory_pool_limits([bad])


def test_layer_precisions_parse_node_names_with_colons_and_slashes():
    assert parse_layer_precisions(["/m/conv:fp32,fc:fp16", "a:b:bf16"]) == {"/m/conv": "fp32", "fc": "fp16", "a:b": "bf16"}
    with pytest.raises(UsageError, match="NAME:PRECISION") as bad:
        parse_layer_precisions(["conv:fp64"])
    assert "/conv1/Conv:fp32" in bad.value.hint


def test_builder_config_options_are_builder_config_fields():
    from polykit.compiler.builder.config import BuilderConfig

    options = builder_config_options(bf16=True, layer_precisions=["fc1:fp32"], memory_pool_limit=["workspace:1K"],
                                     builder_optimization_level=1)
    cfg = BuilderConfig(**options)
    assert (cfg.bf16, cfg.layer_precisions, cfg.workspace_limit, cfg.builder_optimization_level) == (
        True, {"fc1": "fp32"}, 1024, 1)


def test_convert_twice_with_a_timing_cache_times_nothing_the_second_time(tmp_path, capsys):
    cache, plan = tmp_path / "timing.json", tmp_path / "m.plan"
    assert main(["convert", MLP, "-o", str(plan), "--target", "cpu", "--save-timing-cache", str(cache)]) == 0
    first = capsys.readouterr().err
    assert "timing cache 0 hits" in first and json.loads(cache.read_text())["entries"]
    assert main(["convert", MLP, "-o", str(plan), "--target", "cpu", "--load-timing-cache", str(cache),
                 "--error-on-timing-cache-miss"]) == 0
    assert "0 tactics of 0 layers timed" in capsys.readouterr().err
    assert "tuning" not in Plan.load(plan).metadata  # a build report, not part of the plan bytes


def test_convert_records_level_precision_and_constraints_in_the_plan(tmp_path):
    plan = tmp_path / "m.plan"
    assert main(["convert", MLP, "-o", str(plan), "--target", "cpu", "--builder-optimization-level", "0", "--bf16",
                 "--layer-precisions", "fc2:fp32", "--precision-constraints", "prefer"]) == 0
    loaded = Plan.load(plan)
    cfg = loaded.metadata["builder_config"]
    assert (cfg["builder_optimization_level"], cfg["bf16"], cfg["layer_precisions"], cfg["precision_constraints"]) == (
        0, True, {"fc2": "fp32"}, "prefer")
    precisions = {layer.name: layer.precision for layer in loaded.layers}
    assert precisions["fc2"] == "fp32" and "bf16" in precisions.values()


def test_run_with_bf16_and_a_looser_tolerance_passes(capsys):
    assert main(["run", MLP, "--trt", "--onnxrt", "--target", "cpu", "--bf16", "--atol", "0.05", "--rtol", "0.05"]) == 0
    assert "PASSED" in capsys.readouterr().out


def test_bad_builder_options_exit_2(tmp_path, capsys):
    out = str(tmp_path / "m.plan")
    for args in (["--memory-pool-limit", "arena:1M"], ["--builder-optimization-level", "9"],
                 ["--precision-constraints", "sometimes"], ["--strongly-typed", "--fp16"],
                 ["--load-timing-cache", str(tmp_path / "missing.json")]):
        assert main(["convert", MLP, "-o", out, "--target", "cpu", *args]) == 2, args
        assert "error" in capsys.readouterr().err


def test_repeated_and_comma_separated_formats_are_one_list():
    assert split_list(["fp16:chw,fp32:chw", " bf16:chw "]) == ("fp16:chw", "fp32:chw", "bf16:chw")


def test_convert_gives_the_engine_io_the_formats_asked(tmp_path):
    out = tmp_path / "m.plan"
    assert main(["convert", MLP, "-o", str(out), "--target", "cpu", "--builder-optimization-level", "0",
                 "--input-io-formats", "fp16:chw", "--output-io-formats", "fp32:chw,fp16:chw"]) == 0
    plan = Plan.load(out)
    assert [plan.tensors[n].dtype for n in (*plan.inputs, *plan.outputs)] == ["float16", "float32", "float16"]
    assert plan.metadata["builder_config"]["output_io_formats"] == ["fp32:chw", "fp16:chw"]


def test_a_bad_io_format_is_a_usage_error_with_exit_code_2(tmp_path, capsys):
    assert main(["convert", MLP, "-o", str(tmp_path / "m.plan"), "--target", "cpu",
                 "--input-io-formats", "fp64:chw"]) == 2
    assert "DTYPE:FORMAT" in capsys.readouterr().err


def test_a_format_count_that_fits_no_io_is_a_usage_error(tmp_path, capsys):
    assert main(["convert", MLP, "-o", str(tmp_path / "m.plan"), "--target", "cpu",
                 "--output-io-formats", "fp16:chw,fp16:chw,fp16:chw"]) == 2
    assert "3 output I/O formats for 2 outputs" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["convert", "run"])
def test_device_with_the_cpu_target_is_a_usage_error(command, tmp_path, capsys):
    extra = ["-o", str(tmp_path / "m.plan")] if command == "convert" else ["--trt"]
    assert main([command, MLP, "--target", "cpu", "--device", "0", *extra]) == 2
    assert "has no devices" in capsys.readouterr().err


def test_device_must_be_a_gpu_ordinal():
    from polykit.compiler.builder.config import BuilderConfig

    with pytest.raises(UsageError, match="GPU ordinal"):
        BuilderConfig(device=-1)
    assert "device" not in BuilderConfig(device=1).to_json()  # the plan records the arch, not the ordinal


def test_a_runtime_for_a_device_refuses_a_cpu_plan(tmp_path):
    from polykit.runtime.engine import Runtime

    out = tmp_path / "m.plan"
    assert main(["convert", MLP, "-o", str(out), "--target", "cpu", "--builder-optimization-level", "0"]) == 0
    with pytest.raises(UsageError, match="runs on the host"):
        Runtime(device=0).load_engine(out)

"""`polykit bench MODEL|PLAN` as a user invokes it (cpu target)."""

from __future__ import annotations

import json

import pytest

from polykit.tools.cli.app import main

FAST = ["--warm-up", "0", "--duration", "0", "--iterations", "4"]


pytestmark = pytest.mark.usefixtures("fresh_plugins")


def test_bench_prints_throughput_and_latency_percentiles(mlp, capsys):
    assert main(["bench", mlp, "--target", "cpu", *FAST]) == 0
    out = capsys.readouterr().out
    assert "target cpu, built in" in out and "timed 4 run(s)" in out
    assert "inferences/s" in out and "samples/s" in out
    assert all(col in out for col in ("min", "mean", "median", "p90", "p95", "p99", "max"))


def test_bench_json_of_a_model_records_the_build_time(mlp, capsys):
    assert main(["bench", mlp, "--target", "cpu", *FAST, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["model"] == mlp and doc["iterations"] == 4 and doc["build_s"] > 0
    assert doc["latency_ms"]["min"] <= doc["latency_ms"]["p99"]


def test_bench_runs_a_plan_file_on_its_own_target(mlp, tmp_path, capsys):
    plan = str(tmp_path / "m.plan")
    assert main(["convert", mlp, "-o", plan, "--target", "cpu"]) == 0
    capsys.readouterr()
    assert main(["bench", plan, *FAST, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["target"] == "cpu" and doc["build_s"] is None and doc["load_s"] >= 0


def test_bench_profile_lists_every_layer(mlp, capsys):
    assert main(["bench", mlp, "--target", "cpu", *FAST, "--profile", "--builder-optimization-level", "0"]) == 0
    out = capsys.readouterr().out
    assert "per-layer profile" in out and "median of 4 run(s)" in out
    for layer in ("fc1", "fc2", "softmax"):
        assert any(layer in line and "cpu.reference" in line for line in out.splitlines()), layer


def test_bench_saves_and_loads_tactics_and_saves_the_engine(mlp, tmp_path, capsys):
    tactics, plan = str(tmp_path / "t.json"), str(tmp_path / "m.plan")
    assert main(["bench", mlp, "--target", "cpu", *FAST, "--save-tactics", tactics, "--save-engine", plan]) == 0
    assert json.loads(open(tactics).read())["layers"]["fc1"]["tactic"].startswith("cpu.")
    again = str(tmp_path / "again.plan")
    assert main(["bench", mlp, "--target", "cpu", *FAST, "--load-tactics", tactics, "--save-engine", again]) == 0
    assert open(plan, "rb").read() == open(again, "rb").read()


def test_build_options_with_a_plan_are_a_usage_error(mlp, tmp_path, capsys):
    plan = str(tmp_path / "m.plan")
    assert main(["convert", mlp, "-o", plan, "--target", "cpu"]) == 0
    assert main(["bench", plan, "--fp16", *FAST]) == 2
    assert "--fp16 steer(s) a build" in capsys.readouterr().err


def test_bench_plan_for_another_target_is_a_plan_error(mlp, tmp_path, capsys):
    plan = str(tmp_path / "m.plan")
    assert main(["convert", mlp, "-o", plan, "--target", "cpu"]) == 0
    assert main(["bench", plan, "--target", "cuda", *FAST]) == 2
    assert "built for target 'cpu', not 'cuda'" in capsys.readouterr().err


def test_zero_iterations_is_a_usage_error(mlp, capsys):
    assert main(["bench", mlp, "--target", "cpu", "--iterations", "0"]) == 2
    assert "--iterations" in capsys.readouterr().err


def _dynamic_relu(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "dyn",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])])
    path = str(tmp_path / "dyn.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_bench_times_the_inputs_load_inputs_gives(tmp_path, capsys):
    import numpy as np

    from polykit.tools.data.results_io import save_feeds

    model = _dynamic_relu(tmp_path)
    inputs = save_feeds(tmp_path / "inputs.json", [{"x": np.ones((5, 4), np.float32)}])
    assert main(["bench", model, "--target", "cpu", *FAST, "--json", "--load-inputs", str(inputs),
                 "--trt-min-shapes", "x:[1,4]", "--trt-opt-shapes", "x:[2,4]", "--trt-max-shapes", "x:[8,4]"]) == 0
    assert json.loads(capsys.readouterr().out)["batch"] == 5  # the loaded feed's batch, not the opt shape's 2


def test_bench_load_inputs_of_the_wrong_dtype_is_a_runtime_input_error(tmp_path, capsys):
    import numpy as np

    from polykit.tools.data.results_io import save_feeds

    model = _dynamic_relu(tmp_path)
    inputs = save_feeds(tmp_path / "inputs.json", [{"x": np.ones((2, 4), np.float64)}])
    assert main(["bench", model, "--target", "cpu", *FAST, "--load-inputs", str(inputs),
                 "--input-shapes", "x:[2,4]"]) == 2
    assert "float64" in capsys.readouterr().err


def test_bench_device_with_the_cpu_target_is_a_usage_error(mlp, capsys):
    assert main(["bench", mlp, "--target", "cpu", *FAST, "--device", "1"]) == 2
    assert "no devices" in capsys.readouterr().err


def test_bench_prints_the_nvtx_ranges_of_a_cuda_result(capsys):
    """render's NVTX line (a cuda run's BenchResult.nvtx); a cpu result has none."""
    from dataclasses import replace

    from polykit.tools.bench.benchmark import BenchResult, Stats
    from polykit.tools.cli.bench import render

    stats = Stats.of([1.0, 2.0])
    cuda = BenchResult("cuda", 1, 1, 2, 0.01, stats, stats, True, False, load_s=0.01,
                       nvtx="detailed (/w/nvidia/nvtx/lib/libnvToolsExt.so.1)")
    render("m.onnx", cuda)
    assert "NVTX ranges: detailed (/w/nvidia/nvtx/lib/libnvToolsExt.so.1)" in capsys.readouterr().out
    render("m.onnx", replace(cuda, target="cpu", data_transfers=None, cuda_graph=None, nvtx=None))
    assert "NVTX" not in capsys.readouterr().out

"""GPU: `polykit bench` and plans on the cuda target (CUDA events, device buffers, CUDA graphs)."""

from __future__ import annotations

import json

import pytest

from polykit.compiler.builder.config import BuilderConfig
from polykit.tools.bench.benchmark import BenchOptions, bench_model
from polykit.tools.cli.app import main

pytestmark = pytest.mark.gpu

FAST = dict(warm_up_ms=50, iterations=20, duration_s=0)


def test_compute_time_is_within_the_end_to_end_latency(mlp):
    result = bench_model(mlp, BuilderConfig(target="cuda"), BenchOptions(**FAST))
    assert result.target == "cuda" and result.data_transfers is True and result.cuda_graph is True
    assert 0 < result.compute.median <= result.latency.median
    assert result.build_s > 0


@pytest.mark.parametrize("transfers, graph", [(False, True), (True, False), (False, False)])
def test_modes_without_transfers_or_graph_run_and_report_themselves(mlp, transfers, graph):
    result = bench_model(mlp, BuilderConfig(target="cuda"),
                         BenchOptions(data_transfers=transfers, cuda_graph=graph, **FAST))
    assert (result.data_transfers, result.cuda_graph) == (transfers, graph)
    assert result.iterations == 20 and 0 < result.compute.min <= result.compute.max


def test_profile_on_cuda_times_every_layer_with_events(mlp):
    result = bench_model(mlp, BuilderConfig(target="cuda"), BenchOptions(profile_runs=3, **FAST))
    assert {row.name for row in result.profile.layers} == {"fc1", "fc2", "softmax"}
    assert all(row.ms > 0 and row.tactic.startswith("cuda.") for row in result.profile.layers)


def test_cli_bench_plan_on_cuda_as_json(mlp, tmp_path, capsys):
    plan = str(tmp_path / "m.plan")
    assert main(["convert", mlp, "-o", plan, "--target", "cuda"]) == 0
    capsys.readouterr()
    assert main(["bench", plan, "--iterations", "10", "--duration", "0", "--no-data-transfers", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["target"] == "cuda" and doc["data_transfers"] is False and doc["build_s"] is None


def test_run_and_inspect_a_cuda_plan(mlp, tmp_path, capsys):
    plan = str(tmp_path / "m.plan")
    assert main(["convert", mlp, "-o", plan, "--target", "cuda"]) == 0
    assert main(["run", plan, "--trt", "--profile"]) == 0
    capsys.readouterr()
    assert main(["inspect", "model", plan, "--profile", "--json"]) == 0
    layers = json.loads(capsys.readouterr().out)["layers"]
    assert all(layer["ms"] > 0 for layer in layers)


@pytest.mark.parametrize("graph", [True, False])
def test_a_cuda_bench_says_what_nvtx_ranges_its_runs_had(mlp, graph):
    """The verbosity and the library they go through (or why there are none), in the result and its JSON."""
    from polykit.runtime.nvtx import describe

    result = bench_model(mlp, BuilderConfig(target="cuda", profiling_verbosity="detailed"),
                         BenchOptions(cuda_graph=graph, **FAST))
    assert result.nvtx.startswith(describe("detailed")) and result.to_json()["nvtx"] == result.nvtx
    assert result.nvtx.endswith("at the graph's capture only") == graph

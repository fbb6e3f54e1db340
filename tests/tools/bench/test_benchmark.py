"""polykit.tools.bench.benchmark: the measurement API behind `polykit bench` (cpu target here; cuda in
test_benchmark_gpu.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from polykit.backends.loaders import EngineFromPlan, PlanFromOnnx
from polykit.compiler.builder.config import BuilderConfig
from polykit.errors import UsageError
from polykit.tools.bench.benchmark import BenchOptions, Stats, bench_model, benchmark, random_feeds

FAST = dict(warm_up_ms=0, duration_s=0)


@pytest.fixture
def mlp_engine(mlp):
    with EngineFromPlan(PlanFromOnnx(mlp, BuilderConfig(target="cpu")))() as engine:
        yield engine


def test_percentiles_are_nearest_rank():
    stats = Stats.of([float(v) for v in range(100, 0, -1)])
    assert (stats.min, stats.median, stats.p90, stats.p95, stats.p99, stats.max) == (1, 50.5, 90, 95, 99, 100)
    assert stats.mean == 50.5


def test_percentiles_of_one_sample_are_that_sample():
    assert Stats.of([2.5]) == Stats(2.5, 2.5, 2.5, 2.5, 2.5, 2.5, 2.5)


def test_runs_exactly_the_iterations_without_duration_or_warm_up(mlp_engine):
    result = benchmark(mlp_engine, BenchOptions(iterations=7, **FAST))
    assert result.iterations == 7 and result.warm_up_runs == 0
    assert result.latency.min <= result.latency.median <= result.latency.p99 <= result.latency.max
    assert math.isclose(result.throughput, 7 / result.wall_s)


def test_runs_for_at_least_the_duration(mlp_engine):
    result = benchmark(mlp_engine, BenchOptions(iterations=1, warm_up_ms=0, duration_s=0.05))
    assert result.wall_s >= 0.05 and result.iterations > 1


def test_warm_up_runs_for_at_least_its_milliseconds(mlp_engine):
    result = benchmark(mlp_engine, BenchOptions(warm_up_ms=20, iterations=1, duration_s=0))
    assert result.warm_up_runs >= 1


def test_cpu_latency_is_the_compute_time_and_has_no_device_modes(mlp_engine):
    result = benchmark(mlp_engine, BenchOptions(iterations=3, **FAST))
    assert result.latency == result.compute
    assert result.data_transfers is None and result.cuda_graph is None


def test_samples_per_second_count_the_batch(dyn_model):
    result = bench_model(dyn_model, BuilderConfig(target="cpu", input_shapes={"x": (6, 4)}),
                         BenchOptions(iterations=3, **FAST))
    assert result.batch == 6 and math.isclose(result.samples_per_s, 6 * result.throughput)


def test_profile_pass_times_every_layer(mlp_engine):
    result = benchmark(mlp_engine, BenchOptions(iterations=2, profile_runs=3, **FAST))
    assert result.profile.runs == 3
    assert {row.name for row in result.profile.layers} == {l.name for l in mlp_engine.plan.layers}


def test_bench_model_times_the_build_and_a_plan_file_has_none(mlp, tmp_path):
    saved = tmp_path / "m.plan"
    built = bench_model(mlp, BuilderConfig(target="cpu"), BenchOptions(iterations=2, **FAST), save_engine=saved)
    assert built.build_s > 0 and built.load_s >= 0
    loaded = bench_model(str(saved), None, BenchOptions(iterations=2, **FAST))
    assert loaded.build_s is None and loaded.target == "cpu"


def test_random_feeds_follow_the_engine_inputs_and_are_not_zero(mlp_engine):
    feeds = random_feeds(mlp_engine, seed=3)
    assert feeds["x"].shape == (1, 16) and feeds["x"].dtype == np.float32 and np.all(feeds["x"] != 0)


def test_to_json_has_every_measurement(mlp_engine):
    doc = benchmark(mlp_engine, BenchOptions(iterations=2, **FAST)).to_json()
    assert set(doc["latency_ms"]) == {"min", "mean", "median", "p90", "p95", "p99", "max"}
    assert {"throughput", "samples_per_s", "compute_ms", "build_s", "load_s", "profile", "batch"} <= set(doc)


@pytest.mark.parametrize("field, value, flag", [("iterations", 0, "--iterations"), ("warm_up_ms", -1, "--warm-up"),
                                                 ("duration_s", float("nan"), "--duration")])
def test_bad_options_are_usage_errors_naming_the_flag(field, value, flag):
    with pytest.raises(UsageError, match=flag):
        BenchOptions(**{field: value})

"""`--ranks N` on convert, run, bench and inspect: tensor-parallel plans on simulated cpu ranks."""

from __future__ import annotations

import json

import onnx
import pytest

from polykit.compiler.plan.file import Plan
from polykit.tools.cli.app import main
from tests.dynamic_models import encoder

SHAPES = ["--input-shapes", "x:[2,5,32]", "mask:[2,5]"]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("ranks") / "encoder.onnx"
    onnx.save_model(encoder(layers=2, d=32, heads=4), str(path))
    return str(path)


def test_run_trt_onnxrt_on_two_simulated_ranks_passes(model, capsys):
    assert main(["run", model, "--trt", "--onnxrt", "--target", "cpu", "--ranks", "2", *SHAPES,
                 "--val-range", "mask:[0,0]"]) == 0
    out = capsys.readouterr().out
    assert "PASSED" in out


def test_convert_writes_one_plan_per_rank(model, tmp_path, capsys):
    assert main(["convert", model, "--target", "cpu", "--ranks", "4", *SHAPES, "-o", str(tmp_path / "enc.plan")]) == 0
    plans = [Plan.load(tmp_path / f"enc.rank{r}.plan") for r in range(4)]
    assert [(p.metadata["rank"], p.metadata["ranks"]) for p in plans] == [(r, 4) for r in range(4)]
    # the message names the plan's own layer count (pack_gemms changed it: q/k/v are one GEMM a rank)
    assert f"rank 3 of 4, {len(plans[3].layers)} layers (4 collectives)" in " ".join(capsys.readouterr().err.split())
    assert main(["inspect", "model", str(tmp_path / "enc.rank1.plan"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["distributed"]["rank"] == 1 and [c["op"] for c in info["distributed"]["collectives"]] == ["all_reduce"] * 4


def test_inspect_model_with_ranks_shows_each_rank_split(model, capsys):
    assert main(["inspect", "model", model, "--ranks", "2", *SHAPES, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert [r["rank"] for r in info["ranks"]] == [0, 1]
    shards = info["ranks"][0]["split_weights"]
    # per layer: Q, K, V by columns (32x16), O by rows (16x32), the MLP's 32x64 by columns and 64x32 by rows
    assert sorted(s["local"] for s in shards.values() if len(s["full"]) == 2) == \
        [[16, 32]] * 2 + [[32, 16]] * 6 + [[32, 32]] * 4
    assert main(["inspect", "model", model, "--ranks", "2", *SHAPES]) == 0
    assert "rank 1 of 2" in capsys.readouterr().out


def test_bench_reports_latency_and_per_rank_weights(model, capsys):
    assert main(["bench", model, "--target", "cpu", "--ranks", "2", *SHAPES, "--warm-up", "0", "--iterations", "3",
                 "--duration", "0", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["ranks"] == 2 and result["iterations"] == 3 and result["latency_ms"]["median"] > 0
    assert [r["rank"] for r in result["per_rank"]] == [0, 1]
    assert all(r["collectives"] == 4 and r["weight_bytes"] > 0 for r in result["per_rank"])


def test_ranks_with_a_plan_file_is_a_usage_error(model, tmp_path):
    plan = tmp_path / "one.plan"
    assert main(["convert", model, "--target", "cpu", *SHAPES, "-o", str(plan)]) == 0
    assert main(["run", str(plan), "--trt", "--ranks", "2"]) == 2

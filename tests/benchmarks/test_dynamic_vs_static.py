"""benchmarks/dynamic_vs_static.py's `time` step (dynamic_vs_static_timing.py) on the cpu target: both
plans of a small dynamic export built at one level, checked against onnxruntime and timed at opt in
alternating rounds, with what differs between them; the table marks a ratio above 1.05 and says why;
layers named apart only by a pass's name counter are paired; a model that fails is a row, not a stop.
On a GPU machine (torch), the same step on cuda for a small convnet."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import onnx
import pytest

from benchmarks.dynamic_vs_static import main, twins
from benchmarks.dynamic_vs_static_timing import BAR, Rounds, markdown, opt_feeds, time_model
from tests.dynamic_models import convnet

RANGES = {"image": ((1, 3, 32, 32), (2, 3, 32, 32), (4, 3, 32, 32))}
QUICK = Rounds(rounds=2, warmup=1, iters=2, profile_runs=1)


def _convnet(tmp_path):
    path = tmp_path / "convnet.onnx"
    onnx.save(convnet(), str(path))
    return path, {"image": np.random.default_rng(0).standard_normal(RANGES["image"][1]).astype(np.float32)}


@pytest.mark.parametrize("level", [0, 3])
def test_both_plans_of_a_dynamic_export_are_checked_and_timed_at_opt_on_the_cpu_target(tmp_path, level):
    path, feeds = _convnet(tmp_path)
    report = time_model(path, RANGES, feeds, "cpu", level, QUICK)
    assert report["level"] == level and report["precision"] == "fp32"
    for plan in ("static", "dynamic"):
        assert report["vs_onnxruntime"][plan]["max_rel_err"] < 1e-5
        assert report["ms"][plan] > 0 and report["spread_ms"][plan] >= 0
    assert report["dynamic_over_static"] == round(report["ms"]["dynamic"] / report["ms"]["static"], 3)
    diff = report["diff"]
    assert diff["layers"]["dynamic"] == diff["layers"]["static"]  # a batch-only profile folds nothing away
    assert not diff["only_dynamic"] and not diff["only_static"] and not diff["excluded"]
    if level == 0:  # tactics by priority; at level 3 each build times its own (the table lists any other choice)
        assert not diff["tactics"]
    profile = report["layer_profile"]
    assert profile["runs"] == 1 and set(profile["total_ms"]) == {"static", "dynamic"}
    assert profile["layers"] and all(row["static_tactic"] and row["dynamic_tactic"] for row in profile["layers"])
    table = markdown([{"model": "convnet", **report}])
    assert table.startswith("| model |") and "| convnet | image 1x3x32x32 / 2x3x32x32 / 4x3x32x32 |" in table


def test_the_dynamic_build_may_start_from_the_static_builds_timing_cache(tmp_path):
    """Then a layer both plans share gets the same measured times, so the same tactic."""
    path, feeds = _convnet(tmp_path)
    report = time_model(path, RANGES, feeds, "cpu", 3, Rounds(rounds=1, warmup=0, iters=1, profile_runs=0,
                                                                timing_cache="shared"))
    assert report["timing_cache"] == "shared" and not report["diff"]["tactics"] and "layer_profile" not in report


def test_the_table_marks_a_ratio_above_the_bar_and_lists_why():
    diff = {"layers": {"static": 2, "dynamic": 3}, "tactics": [{"layer": "fc", "kind": "Gemm", "dynamic": "slow",
                                                                 "static": "fast"}],
            "kernels": [], "only_dynamic": [{"layer": "pos", "kind": "Slice", "tactic": "copy"}],
            "only_dynamic_kinds": {"Slice": 1}, "only_static": [], "excluded": []}
    report = {"model": "m", "profile": {"x": [[1, 4], [2, 4], [2, 4]]}, "ms": {"static": 1.0, "dynamic": 1.1},
              "spread_ms": {"static": 0.01, "dynamic": 0.02}, "dynamic_over_static": 1.1, "diff": diff,
              "vs_onnxruntime": {k: {"max_rel_err": 1e-6} for k in ("static", "dynamic")},
              "build_s": {"static": 1.0, "dynamic": 2.0}}
    assert 1.1 > BAR
    table = markdown([report, {"model": "n", "error": "BuildError: a | b"}])
    assert "| **1.100** |" in table and "| 2 / 3 | 1 | 0 | Slice 1 |" in table
    assert "- only in the dynamic plan: pos (Slice, copy)" in table
    assert "- other tactic: fc (Gemm): dynamic slow, static fast" in table
    assert "| n | | | | FAIL |" in table and "BuildError: a / b" in table


def test_layers_named_apart_only_by_a_pass_counter_are_twins():
    layer = lambda name, kind="MatMul": SimpleNamespace(name=name, kind=kind)  # noqa: E731
    dyn = SimpleNamespace(layers=[layer("qkv_packed__17"), layer("qkv_packed__25"), layer("pos_slice", "Slice"),
                                  layer("cast__9", "Cast")])
    static = SimpleNamespace(layers=[layer("qkv_packed__5"), layer("qkv_packed__13"), layer("cast__3", "Pointwise")])
    pairs = {name: twin.name for name, twin in twins(dyn, static).items()}
    assert pairs == {"qkv_packed__17": "qkv_packed__5", "qkv_packed__25": "qkv_packed__13"}  # a kind must match too


def test_the_feeds_at_opt_follow_the_zoo_inputs():
    feeds = opt_feeds("bert_base")
    ids, mask = feeds["input_ids"], feeds["attention_mask"]
    assert ids.shape == mask.shape == (8, 128) and ids.dtype == mask.dtype == np.int64
    assert 0 <= ids.min() and ids.max() < 30522 and np.all(mask == 1)
    assert opt_feeds("resnet50_hw")["x"].shape == (32, 3, 224, 224)


def test_the_step_times_each_model_and_a_model_that_fails_is_a_row(tmp_path, monkeypatch):
    """`time --target cpu` over a tiny profile entry (the small convnet) and resnet50 (not exported
    here): the first timed, the second an error row; the report written; exit status 1."""
    from benchmarks import dynamic_vs_static, zoo_models

    monkeypatch.setitem(dynamic_vs_static.PROFILES, "tiny", {"image": ({0: "batch"}, RANGES["image"])})
    monkeypatch.setitem(zoo_models.BY_NAME, "tiny", zoo_models.ZooModel(
        "tiny", "conv", ("test",), (zoo_models.InputSpec("image", (3, 32, 32)),), (1, 2), lambda: None))
    onnx.save(convnet(), str(tmp_path / "tiny.onnx"))
    out = tmp_path / "times"
    assert main(["time", "--dir", str(tmp_path), "--models", "tiny,resnet50", "--target", "cpu", "--level", "0",
                 "--rounds", "1", "--warmup", "0", "--iters", "1", "--profile-runs", "0", "--out", str(out)]) == 1
    tiny, failed = json.loads(out.with_suffix(".json").read_text())
    assert tiny["model"] == "tiny" and tiny["device"] == "cpu" and tiny["commit"] and tiny["ms"]["dynamic"] > 0
    assert tiny["vs_onnxruntime"]["dynamic"]["max_rel_err"] < 1e-5 and "error" not in tiny
    assert failed["model"] == "resnet50" and failed["error"]  # no export in the folder
    table = out.with_suffix(".md").read_text()
    assert "| tiny | image 1x3x32x32 / 2x3x32x32 / 4x3x32x32 |" in table and "| resnet50 | | | | FAIL |" in table


@pytest.mark.gpu
def test_both_plans_of_a_dynamic_export_are_checked_and_timed_on_cuda(tmp_path):
    torch = pytest.importorskip("torch")
    path, feeds = _convnet(tmp_path)
    report = time_model(path, RANGES, feeds, "cuda", 0, QUICK, torch)
    assert report["precision"] == "fp16" and report["ms"]["dynamic"] > 0 and report["ms"]["static"] > 0
    for plan in ("static", "dynamic"):
        assert report["vs_onnxruntime"][plan]["max_rel_err"] < 2e-2
    assert not report["diff"]["only_dynamic"] and not report["diff"]["tactics"]

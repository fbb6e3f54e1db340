"""benchmarks/zoo.py's driver: arguments, the case list, resume, incremental results, and one
child process per case whose failure, crash or timeout becomes a row (no GPU, no torch needed:
the children here are stand-ins)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import zoo
from benchmarks.zoo_models import BY_NAME, CONV, MODELS, TRANSFORMER
from benchmarks.zoo_report import load_results

REPO = Path(__file__).resolve().parents[2]


def names(cases):
    return [(m.name, b) for m, b in cases]


def test_defaults_run_every_model_at_batch_1_and_its_throughput_batch():
    cases = zoo.select_cases(zoo.parse_args([]))
    assert names(cases) == [(m.name, b) for m in MODELS for b in (1, max(m.batches))]


def test_family_models_and_batches_narrow_the_cases():
    conv = zoo.select_cases(zoo.parse_args(["--family", "conv", "--batches", "max"]))
    assert {m.family for m, _ in conv} == {CONV} and all(b == max(m.batches) for m, b in conv)
    picked = zoo.select_cases(zoo.parse_args(["--models", "gpt2,resnet50", "--batches", "1,4,1"]))
    assert names(picked) == [("resnet50", 1), ("resnet50", 4), ("gpt2", 1), ("gpt2", 4)]  # table order, no repeats
    assert zoo.select_cases(zoo.parse_args(["--models", "resnet50", "--family", "transformer"])) == []
    assert {m.family for m, _ in zoo.select_cases(zoo.parse_args(["--family", "transformer"]))} == {TRANSFORMER}


def test_unknown_model_names_are_refused_with_the_known_ones():
    with pytest.raises(SystemExit, match="unknown zoo models: resnet5000.*resnet50"):
        zoo.select_cases(zoo.parse_args(["--models", "resnet50,resnet5000"]))


def test_into_needs_render():
    with pytest.raises(SystemExit):
        zoo.parse_args(["--into", "docs/ZOO.md"])


def test_pending_skips_finished_cases_and_retries_failed_ones():
    cases = zoo.select_cases(zoo.parse_args(["--models", "resnet18"]))
    done = [{"model": "resnet18", "batch": 1, "polykit_ms": 1.0}, {"model": "resnet18", "batch": 32, "error": "x"}]
    assert names(zoo.pending(cases, done)) == [("resnet18", 32)]


def test_merge_replaces_the_row_of_the_same_case():
    rows = [{"model": "a", "batch": 1, "v": 1}, {"model": "a", "batch": 8, "v": 2}]
    assert zoo.merge(rows, {"model": "a", "batch": 1, "v": 3}) == [rows[1], {"model": "a", "batch": 1, "v": 3}]


def test_results_file_round_trips_and_a_foreign_file_is_refused(tmp_path):
    path = tmp_path / "r.json"
    zoo.write_results(path, [{"model": "a", "batch": 1}], {"rounds": 3})
    assert load_results(path)["results"] == [{"model": "a", "batch": 1}]
    assert not list(tmp_path.glob("*.tmp"))
    path.write_text(json.dumps({"results": [{"batch": 1}]}))
    with pytest.raises(SystemExit, match="not a zoo results file"):
        load_results(path)
    path.write_text("{")
    with pytest.raises(SystemExit, match="cannot read"):
        load_results(path)


def test_child_command_carries_the_measurement_options():
    args = zoo.parse_args(["--rounds", "5", "--iters", "7", "--skip-compile", "--kernel-cache", "shared"])
    cmd = zoo.child_command(args, BY_NAME["gpt2"], 8, "row.json")
    parsed = zoo.parse_args(cmd[2:])
    assert parsed.case == "gpt2:8" and parsed.row_out == "row.json"
    assert (parsed.rounds, parsed.iters, parsed.skip_compile, parsed.kernel_cache) == (5, 7, True, "shared")
    assert Path(parsed.cache_dir).is_absolute()


def test_run_child_kills_a_case_past_its_timeout():
    t0 = time.monotonic()
    assert zoo.run_child([sys.executable, "-c", "import time; time.sleep(60)"], timeout=1) is None
    assert time.monotonic() - t0 < 30
    assert zoo.run_child([sys.executable, "-c", "raise SystemExit(3)"], timeout=30) == 3


class FakeChildren:
    """Stands in for zoo.run_child: per case, a row to write, an exit code, or a timeout (None)."""

    def __init__(self, outcomes):
        self.outcomes = outcomes
        self.ran = []

    def __call__(self, cmd, timeout):
        case = cmd[cmd.index("--case") + 1]
        self.ran.append(case)
        outcome = self.outcomes.get(case, "ok")
        if outcome == "ok":
            model, batch = case.split(":")
            row = {"model": model, "family": "conv", "batch": int(batch), "polykit_ms": 1.0, "eager_ms": 2.0,
                   "speed_vs_eager": 2.0, "max_rel_err": 1e-3}
            Path(cmd[cmd.index("--row-out") + 1]).write_text(json.dumps(row))
            return 0
        return outcome  # an exit code without a row, or None: timed out


def run(monkeypatch, tmp_path, argv, outcomes=None):
    fake = FakeChildren(outcomes or {})
    monkeypatch.setattr(zoo, "run_child", fake)
    monkeypatch.chdir(tmp_path)  # the default cache dir, .zoo_cache, lands here
    rows = zoo.run_all(zoo.parse_args(argv), argv)
    return fake, rows


def test_every_case_is_written_as_it_finishes_and_failures_become_rows(monkeypatch, tmp_path):
    out = tmp_path / "zoo.json"
    fake, rows = run(monkeypatch, tmp_path, ["--models", "resnet18,resnet50", "--out", str(out)],
                     {"resnet18:32": 1, "resnet50:1": None})
    assert fake.ran == ["resnet50:32", "resnet50:1", "resnet18:32", "resnet18:1"]  # informative order
    saved = {(r["model"], r["batch"]): r for r in load_results(out)["results"]}
    assert saved[("resnet18", 1)]["polykit_ms"] == 1.0 and "case_s" in saved[("resnet18", 1)]
    assert saved[("resnet18", 32)]["error"] == "the case process exited 1"
    assert saved[("resnet50", 1)]["error"].startswith("timed out after")
    assert "error" not in saved[("resnet50", 32)] and len(rows) == 4


def test_resume_runs_only_the_cases_not_finished(monkeypatch, tmp_path):
    out = tmp_path / "zoo.json"
    run(monkeypatch, tmp_path, ["--models", "resnet18", "--out", str(out)], {"resnet18:32": 1})
    fake, rows = run(monkeypatch, tmp_path, ["--models", "resnet18,gpt2", "--out", str(out), "--resume", str(out)])
    assert fake.ran == ["gpt2:8", "gpt2:1", "resnet18:32"]
    assert sorted((r["model"], r["batch"]) for r in rows if "error" not in r) == \
        [("gpt2", 1), ("gpt2", 8), ("resnet18", 1), ("resnet18", 32)]
    fake, _ = run(monkeypatch, tmp_path, ["--models", "resnet18,gpt2", "--out", str(out), "--resume", str(out)])
    assert fake.ran == []
    commands = load_results(out)["settings"]["commands"]  # every run's command, once
    assert commands == [f"PYTHONPATH=. python3 benchmarks/zoo.py --models resnet18 --out {out}",
                        f"PYTHONPATH=. python3 benchmarks/zoo.py --models resnet18,gpt2 --out {out} --resume {out}"]


def test_deadline_stops_starting_cases_and_a_cut_case_is_not_recorded(monkeypatch, tmp_path):
    out = tmp_path / "zoo.json"
    monkeypatch.setattr(zoo, "START", time.monotonic())
    fake, rows = run(monkeypatch, tmp_path, ["--models", "resnet18", "--out", str(out), "--deadline", "100"],
                     {"resnet18:32": None})  # cut: its timeout was the deadline, not --case-timeout
    assert fake.ran == ["resnet18:32"] and rows == [] and not out.exists()
    monkeypatch.setattr(zoo, "START", time.monotonic() - 1000)
    fake, _ = run(monkeypatch, tmp_path, ["--models", "resnet18", "--out", str(out), "--deadline", "100"])
    assert fake.ran == []


def test_a_failing_case_process_writes_its_error_row_and_exits_0(tmp_path):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("")  # the ONNX cache cannot live under a file: the case fails whatever this machine has
    row_file = tmp_path / "row.json"
    cmd = [sys.executable, str(REPO / "benchmarks" / "zoo.py"), "--case", "squeezenet1_1:1", "--row-out",
           str(row_file), "--cache-dir", str(blocker / "cache"), "--skip-compile"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    row = json.loads(row_file.read_text())
    assert (row["model"], row["batch"], row["inputs"]) == ("squeezenet1_1", 1, {"x": [1, 3, 224, 224]})
    assert row["error"].split(":")[0] in ("setup", "export") and "stage" not in row


def test_the_cold_builds_tuning_summary_is_read_from_the_builders_log():
    """A real build at level 3 on the cpu target times its candidates; the row keeps what the tuner said."""
    import logging

    from onnx import TensorProto, helper

    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])
    w = helper.make_tensor("w", TensorProto.FLOAT, [64, 64], [0.5] * 4096)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [x], [y], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    level = logging.getLogger("polykit").level
    with zoo.tuning_log() as said:
        build_plan(model, BuilderConfig(target="cpu", builder_optimization_level=5))
    facts = zoo.tuning_facts(said)
    assert logging.getLogger("polykit").level == level
    assert facts["cold_timed_layers"] >= 1 and facts["cold_timed_tactics"] >= facts["cold_timed_layers"]
    assert facts["cold_compile_s"] >= 0 and facts["cold_timing_s"] >= 0  # seconds the log rounds to 0.01
    assert zoo.tuning_facts(["nothing timed"]) == {}


def test_the_profile_record_names_the_slowest_layers_with_their_output_shapes():
    from types import SimpleNamespace

    from polykit.tools.report.profile import summarize

    plan = SimpleNamespace(layers=[SimpleNamespace(name="conv1", kind="ConvNHWC", tactic="cuda.conv_nhwc.sm90_128x64",
                                                   out_shapes=[(32, 96, 96, 192)]),
                                   SimpleNamespace(name="se", kind="SqueezeExcite", tactic="cuda.squeeze_excite",
                                                   out_shapes=[(32, 24, 24, 512)]),
                                   SimpleNamespace(name="cast", kind="Cast", tactic="cuda.pointwise", out_shapes=[(32, 10)])])
    runs = [[("conv1", 0.30), ("se", 0.10), ("cast", 0.01)], [("conv1", 0.50), ("se", 0.12), ("cast", 0.01)]]
    record = zoo.top_kinds(summarize(runs, plan.layers), plan=plan, layers=2)
    assert record["top_layers"] == [["conv1", "ConvNHWC", "cuda.conv_nhwc.sm90_128x64", 0.4, 0.769, [[32, 96, 96, 192]]],
                                    ["se", "SqueezeExcite", "cuda.squeeze_excite", 0.11, 0.212, [[32, 24, 24, 512]]]]
    assert record["top_kinds"][0] == ["ConvNHWC", 0.4, 0.769] and record["profile_total_ms"] == 0.52


def test_prepared_weights_are_kept_as_npz_and_come_back_identical(tmp_path):
    """The zoo's weight cache is numpy's .npz (torch.save would be pickle): every tensor, dtype and
    value back as saved, and np.load refuses pickled objects."""
    torch = pytest.importorskip("torch")
    from benchmarks.zoo import load_state, save_state

    torch.manual_seed(0)
    saved = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Linear(4, 2))
    saved[1].running_mean.uniform_()
    path = tmp_path / "w.weights.npz"
    save_state(saved, path)
    torch.manual_seed(1)
    loaded = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Linear(4, 2))
    load_state(loaded, path, torch)
    want, got = saved.state_dict(), loaded.state_dict()
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) and want[k].dtype == got[k].dtype for k in want)


def test_prepared_weights_load_into_a_module_whose_loading_hook_wants_state_dict_metadata(tmp_path):
    """torchvision's MNASNet refuses load_state_dict without the version its metadata carries (the
    H100 zoo run of 2026-12-06 failed mnasnet1_0 so); the .npz weights are copied in place instead."""
    torch = pytest.importorskip("torch")
    from benchmarks.zoo import load_state, save_state

    class Versioned(torch.nn.Module):
        _version = 2

        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(3, 2)

        def _load_from_state_dict(self, state_dict, prefix, local_metadata, *args):
            if local_metadata.get("version") not in (1, 2):
                raise ValueError("version should be set to 1 or 2")
            super()._load_from_state_dict(state_dict, prefix, local_metadata, *args)

    torch.manual_seed(0)
    saved = Versioned()
    save_state(saved, tmp_path / "v.weights.npz")
    torch.manual_seed(1)
    loaded = Versioned()
    load_state(loaded, tmp_path / "v.weights.npz", torch)
    assert all(torch.equal(a, b) for a, b in zip(saved.state_dict().values(), loaded.state_dict().values()))
    with pytest.raises(ValueError, match="do not match"):
        load_state(torch.nn.Linear(3, 2), tmp_path / "v.weights.npz", torch)

"""benchmarks/zoo.py: arguments, the case list, resume, incremental results, and one child process
per model whose failed, crashed or timed-out case becomes a row (no GPU, no torch needed: the
children here are stand-ins); then the child itself, measuring a model's cases in one process,
with torch on the CPU (skipped without torch) and its GPU parts on polykit's cpu target; and the
real thing on the GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import zoo
from benchmarks.zoo_models import BY_NAME, CONV, MODELS, TRANSFORMER, ZooModel, image
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
    cmd = zoo.child_command(args, BY_NAME["gpt2"], [8, 1], "rows.jsonl")
    parsed = zoo.parse_args(cmd[2:])
    assert parsed.case == "gpt2:8,1" and parsed.row_out == "rows.jsonl"
    assert (parsed.rounds, parsed.iters, parsed.skip_compile, parsed.kernel_cache) == (5, 7, True, "shared")
    assert Path(parsed.cache_dir).is_absolute() and parsed.deadline == 0


@pytest.mark.parametrize("env,flag,mode", [(None, [], "off"), ("1", [], "on"), ("0", [], "off"), ("both", [], "both"),
                                           ("1", ["--pdl", "off"], "off"), (None, ["--pdl", "both"], "both")])
def test_pdl_comes_from_the_flag_else_polykit_pdl_and_reaches_the_child(monkeypatch, env, flag, mode):
    if env is None:
        monkeypatch.delenv("POLYKIT_PDL", raising=False)
    else:
        monkeypatch.setenv("POLYKIT_PDL", env)
    args = zoo.parse_args(flag)
    assert args.pdl == mode
    monkeypatch.setenv("POLYKIT_PDL", "0")  # the child is told, whatever its environment says
    assert zoo.parse_args(zoo.child_command(args, BY_NAME["gpt2"], [1], "r")[2:]).pdl == mode


def test_a_child_gets_the_time_left_before_the_deadline(monkeypatch):
    monkeypatch.setattr(zoo, "START", time.monotonic() - 100)
    parsed = zoo.parse_args(zoo.child_command(zoo.parse_args(["--deadline", "400"]), BY_NAME["gpt2"], [8], "r")[2:])
    assert 290 <= parsed.deadline <= 300  # 400 s from the parent's start, 100 of them gone


def test_run_child_kills_a_case_past_its_timeout():
    t0 = time.monotonic()
    assert zoo.run_child([sys.executable, "-c", "import time; time.sleep(60)"], timeout=1) is None
    assert time.monotonic() - t0 < 30
    assert zoo.run_child([sys.executable, "-c", "raise SystemExit(3)"], timeout=30) == 3


#: a stand-in child that writes a row line every half second, ten in all
STEADY_CHILD = """
import sys, time
for i in range(10):
    time.sleep(0.5)
    with open(sys.argv[1], "a") as fh:
        fh.write('{"batch": %d}\\n' % i)
"""


def test_run_child_gives_every_case_its_own_timeout_and_stops_at_the_deadline(tmp_path):
    rows = zoo.ChildRows(tmp_path / "rows.jsonl", lambda row: None)
    cmd = [sys.executable, "-c", STEADY_CHILD, str(rows.path)]
    assert zoo.run_child(cmd, timeout=3, progress=rows.poll) == 0  # 5 s in all, a row every 0.5 s
    assert rows.poll() == 10
    t0 = time.monotonic()
    assert zoo.run_child(cmd, timeout=60, progress=rows.poll, until=time.monotonic() + 1) is None
    assert time.monotonic() - t0 < 30


def test_child_rows_are_taken_line_by_line_each_with_its_seconds(tmp_path):
    taken = []
    rows = zoo.ChildRows(tmp_path / "rows.jsonl", taken.append)
    assert rows.poll() == 0  # nothing written yet
    rows.path.write_text('{"model": "a", "batch": 8}\n{"model": "a", "ba')  # the second is being written
    assert rows.poll() == 1 and rows.done == [8]
    with open(rows.path, "a") as fh:
        fh.write('tch": 1}\n')
    assert rows.poll() == 2 and rows.done == [8, 1]
    assert [(r["batch"], r["case_s"] >= 0) for r in taken] == [(8, True), (1, True)]


class FakeChildren:
    """Stands in for zoo.run_child. Per case (model:batch), what its child does when it gets to it:
    "ok" (a row), "error" (an error row, then the child stops, as a real child after a failed
    case), an exit code (the child dies without a row), None (it hangs: killed past the case
    timeout) or "deadline" (the deadline passes while it runs: killed)."""

    def __init__(self, outcomes):
        self.outcomes = outcomes
        self.ran = []

    def __call__(self, cmd, timeout, progress=lambda: 0, until=float("inf")):
        case = cmd[cmd.index("--case") + 1]
        self.ran.append(case)
        model, batches = case.split(":")
        for batch in map(int, batches.split(",")):
            outcome = self.outcomes.get(f"{model}:{batch}", "ok")
            if outcome in ("ok", "error"):
                row = {"model": model, "family": "conv", "batch": batch, "polykit_ms": 1.0, "eager_ms": 2.0,
                       "speed_vs_eager": 2.0, "max_rel_err": 1e-3}
                with open(cmd[cmd.index("--row-out") + 1], "a") as fh:
                    fh.write(json.dumps(row if outcome == "ok" else dict(row, error="build: RuntimeError")) + "\n")
                progress()
                if outcome == "ok":
                    continue
                return 0
            if outcome == "deadline":
                zoo.START -= 10_000  # the test set START with monkeypatch, which puts it back
                return None
            return outcome  # an exit code without a row, or None: timed out
        return 0


def run(monkeypatch, tmp_path, argv, outcomes=None):
    fake = FakeChildren(outcomes or {})
    monkeypatch.setattr(zoo, "run_child", fake)
    monkeypatch.chdir(tmp_path)  # the default cache dir, .zoo_cache, lands here
    rows = zoo.run_all(zoo.parse_args(argv), argv)
    return fake, rows


def saved_rows(out):
    return {(r["model"], r["batch"]): r for r in load_results(out)["results"]}


def test_one_child_measures_every_pending_case_of_a_model_in_informative_order(monkeypatch, tmp_path):
    out = tmp_path / "zoo.json"
    fake, rows = run(monkeypatch, tmp_path, ["--models", "resnet18,gpt2,resnet50", "--out", str(out)])
    assert fake.ran == ["resnet50:32,1", "gpt2:8,1", "resnet18:32,1"]  # the issues' models first
    saved = saved_rows(out)
    assert sorted(saved) == sorted([("resnet50", 32), ("resnet50", 1), ("gpt2", 8), ("gpt2", 1), ("resnet18", 32),
                                    ("resnet18", 1)])
    assert all(r["case_s"] >= 0 and "error" not in r for r in saved.values()) and len(rows) == 6


def test_every_case_is_written_as_it_finishes_and_failures_become_rows(monkeypatch, tmp_path):
    out = tmp_path / "zoo.json"
    fake, rows = run(monkeypatch, tmp_path, ["--models", "resnet18,resnet50", "--out", str(out)],
                     {"resnet18:32": 1, "resnet50:1": None})
    # resnet18's child died on bs32: its bs1 got a fresh child
    assert fake.ran == ["resnet50:32,1", "resnet18:32,1", "resnet18:1"]
    saved = saved_rows(out)
    assert saved[("resnet18", 1)]["polykit_ms"] == 1.0 and "case_s" in saved[("resnet18", 1)]
    assert saved[("resnet18", 32)]["error"] == "the case process exited 1"
    assert saved[("resnet50", 1)]["error"].startswith("timed out after")
    assert "error" not in saved[("resnet50", 32)] and len(rows) == 4


def test_a_failed_case_stops_its_child_and_the_models_other_cases_get_a_fresh_one(monkeypatch, tmp_path):
    out = tmp_path / "zoo.json"
    fake, _ = run(monkeypatch, tmp_path, ["--models", "gpt2", "--out", str(out)], {"gpt2:8": "error"})
    assert fake.ran == ["gpt2:8,1", "gpt2:1"]
    saved = saved_rows(out)
    assert saved[("gpt2", 8)]["error"] == "build: RuntimeError" and "error" not in saved[("gpt2", 1)]
    fake, _ = run(monkeypatch, tmp_path, ["--models", "gpt2", "--out", str(out)], {"gpt2:8": 0})  # gone quietly
    assert fake.ran == ["gpt2:8,1", "gpt2:1"]
    assert saved_rows(out)[("gpt2", 8)]["error"] == "the case process ended without writing its row"


def test_resume_runs_only_the_cases_not_finished(monkeypatch, tmp_path):
    out = tmp_path / "zoo.json"
    run(monkeypatch, tmp_path, ["--models", "resnet18", "--out", str(out)], {"resnet18:32": 1})
    fake, rows = run(monkeypatch, tmp_path, ["--models", "resnet18,gpt2", "--out", str(out), "--resume", str(out)])
    assert fake.ran == ["gpt2:8,1", "resnet18:32"]  # resnet18 half done: its child measures only bs32
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
                     {"resnet18:32": "deadline"})
    assert fake.ran == ["resnet18:32,1"] and rows == [] and not out.exists()
    monkeypatch.setattr(zoo, "START", time.monotonic() - 1000)
    fake, _ = run(monkeypatch, tmp_path, ["--models", "resnet18", "--out", str(out), "--deadline", "100"])
    assert fake.ran == []


def test_a_model_cut_at_the_deadline_keeps_its_finished_cases_and_starts_no_other(monkeypatch, tmp_path):
    out = tmp_path / "zoo.json"
    monkeypatch.setattr(zoo, "START", time.monotonic())
    argv = ["--models", "resnet18,squeezenet1_1", "--out", str(out), "--deadline", "300"]
    fake, rows = run(monkeypatch, tmp_path, argv, {"resnet18:1": "deadline"})
    assert fake.ran == ["resnet18:32,1"] and list(saved_rows(out)) == [("resnet18", 32)]
    fake, _ = run(monkeypatch, tmp_path, argv[:-2] + ["--resume", str(out)])
    assert fake.ran == ["resnet18:1", "squeezenet1_1:32,1"]


def test_a_child_whose_shared_stages_fail_writes_every_cases_error_row_and_exits_0(tmp_path):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("")  # the ONNX cache cannot live under a file: the cases fail whatever this machine has
    row_file = tmp_path / "rows.jsonl"
    cmd = [sys.executable, str(REPO / "benchmarks" / "zoo.py"), "--case", "squeezenet1_1:1,8", "--row-out",
           str(row_file), "--cache-dir", str(blocker / "cache"), "--skip-compile"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    first, second = [json.loads(line) for line in row_file.read_text().splitlines()]
    assert (first["model"], first["batch"], first["inputs"]) == ("squeezenet1_1", 1, {"x": [1, 3, 224, 224]})
    assert (second["batch"], second["inputs"]) == (8, {"x": [8, 3, 224, 224]})
    assert first["error"] == second["error"] and first["error"].split(":")[0] in ("setup", "model")
    assert "setup" in first["stage_s"] and second["stage_s"] == {}  # shared stages count in the first case
    assert "stage" not in first


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


def test_the_profile_record_sums_the_movement_layers_share():
    """Issue 30 asks movement (copies, reformats, gathers) under 5 % of every zoo model's GPU time: each row
    carries the share of the layers on a movement tactic."""
    from types import SimpleNamespace

    from polykit.tools.report.profile import summarize

    def layer(name, kind, tactic):
        return SimpleNamespace(name=name, kind=kind, tactic=tactic, out_shapes=[(8, 64)])

    plan = SimpleNamespace(layers=[layer("mm", "MatMul", "cuda.gemm.sm90_128x128"),
                                   layer("t", "Transpose", "cuda.movement.strided"),
                                   layer("g", "Gather", "cuda.gather"),
                                   layer("v", "Reshape", None)])
    runs = [[("mm", 0.8), ("t", 0.15), ("g", 0.05), ("v", 0.0)]]
    record = zoo.top_kinds(summarize(runs, plan.layers), plan=plan)
    assert record["movement_layers"] == 2 and record["movement_ms"] == 0.2 and record["movement_share"] == 0.2
    assert zoo.is_movement("cuda.movement.reformat") and not zoo.is_movement("cuda.gemm.sm90_64x64")
    assert not zoo.is_movement(None)


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


# ---- the child: one model's cases, on the CPU ------------------------------------------------------

def tiny_module():
    """A small convolutional net (conv, BatchNorm, pooling, linear) the cpu target runs in milliseconds."""
    from torch import nn

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5))

        def forward(self, x):
            return self.body(x)

    return Tiny()


TINY = ZooModel("tiny", CONV, ("test",), image(16), (1, 4), tiny_module)


def cpu_torch_model(module, inputs, torch, reference=False):
    """zoo.torch_model on the CPU: the fp32 reference, then the module converted in place to
    bfloat16 (as .half() converts it on the GPU) and the inputs in bfloat16."""
    ref = None
    if reference:
        with torch.inference_mode():
            ref = module(*inputs.values()).float()
    low = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in inputs.items()}
    net = module.to(torch.bfloat16)
    return (net, inputs, low, ref) if reference else (net, inputs, low)


def cpu_bind_plan(plan, inputs, torch, in_place=False):
    """cuda_timing.bind_plan for a cpu plan: `run()` executes it on the inputs, its output copied into `out`."""
    from benchmarks.cuda_timing import BoundPlan
    from polykit.runtime.engine import Engine

    engine = Engine(plan)
    ctx = engine.create_execution_context()
    bindings = {n: inputs[n].to(getattr(torch, plan.tensors[n].dtype)) for n in plan.inputs}
    feeds = {n: t.numpy() for n, t in bindings.items()}
    desc = plan.tensors[plan.outputs[0]]
    out = torch.empty(tuple(desc.shape), dtype=getattr(torch, desc.dtype))
    return BoundPlan(engine, ctx, lambda: out.copy_(torch.from_numpy(ctx.execute(feeds)[plan.outputs[0]])), out,
                     bindings)


def cpu_time(fn, torch, warmup, iters):
    """cuda_timing.time_cuda by the wall clock (dynamic_bert's host timer)."""
    from benchmarks.dynamic_bert import time_host

    return time_host(fn, warmup, iters)


@pytest.fixture
def cpu_child(monkeypatch, tmp_path):
    """zoo.measure_model in this process with its GPU parts on the CPU: polykit builds (twice, as
    build_twice does) for the cpu target, the plan run by a cpu engine, eager in bfloat16 and
    timed by the wall clock; the zoo entry, weights, export, release and rows are the real code.
    Calling it measures a --case of the `tiny` model and returns the rows the child wrote."""
    torch = pytest.importorskip("torch")
    from benchmarks import cuda_timing, zoo_prepare

    monkeypatch.setitem(zoo.BY_NAME, "tiny", TINY)
    build_twice = zoo.build_twice
    monkeypatch.setattr(zoo, "build_twice", lambda path, level, work, first="cold":
                        build_twice(path, level, work, first, target="cpu"))
    monkeypatch.setattr(zoo, "torch_model", cpu_torch_model)
    monkeypatch.setattr(cuda_timing, "bind_plan", cpu_bind_plan)
    monkeypatch.setattr(cuda_timing, "time_cuda", cpu_time)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "cpu (test)")
    for name in [*zoo_prepare.inductor_env(tmp_path), "POLYKIT_CACHE_DIR"]:  # the child sets them; put back after
        monkeypatch.setenv(name, "")
    cache = tmp_path / "cache"
    cache.mkdir()
    runs = iter(range(100))

    def child(case, *argv):
        out = tmp_path / f"rows{next(runs)}.jsonl"
        zoo.measure_model(zoo.parse_args(["--case", case, "--row-out", str(out), "--cache-dir", str(cache), "--level", "0",
                                          "--rounds", "1", "--iters", "2", "--warmup", "1", "--profile-runs", "1",
                                          *(argv or ["--skip-compile"])]))
        return [json.loads(line) for line in out.read_text().splitlines()]

    yield child
    if "torch._dynamo" in sys.modules:
        torch.compiler.reset()


#: a row's keys whose values are measured times (or hold them), or say what was cached
TIMED = ("_ms", "_s")


def untimed(row):
    return {k: v for k, v in row.items() if not k.endswith(TIMED) and not k.startswith(("speed_vs", "top_"))
            and k not in ("export_cached", "stage_s")}


def test_a_model_child_measures_each_batch_as_a_child_of_its_own_would(cpu_child, tmp_path):
    """One child for bs4 and bs1: each case has its own export and builds, and the bs1 row says
    what a bs1-only child says (keys, accuracy, plan) - the second case starts from the module as
    built, not from the first case's bfloat16 copy."""
    four, one = cpu_child("tiny:4,1")
    assert (four["batch"], one["batch"]) == (4, 1) and "error" not in four and "error" not in one
    assert four["inputs"] == {"x": [4, 3, 16, 16]} and one["inputs"] == {"x": [1, 3, 16, 16]}
    assert four["export_cached"] is False and one["export_cached"] is False  # an export per batch
    assert (tmp_path / "cache" / "tiny_bs4.onnx").is_file() and (tmp_path / "cache" / "tiny_bs1.onnx").is_file()
    assert "build_cold_s" in four and "build_cold_s" in one and four["layers"] == one["layers"]
    (alone,) = cpu_child("tiny:1")
    assert set(alone) == set(one)
    assert untimed(alone) == untimed(one) and one["max_rel_err"] < 0.05


def test_each_row_records_its_stage_seconds_the_shared_ones_in_the_first(cpu_child):
    four, one = cpu_child("tiny:4,1")
    assert list(four["stage_s"]) == ["setup", "model", "export", "build", "torch", "polykit", "timing", "profile"]
    assert list(one["stage_s"]) == ["reset", "export", "build", "torch", "polykit", "timing", "profile"]
    assert all(isinstance(s, float) and s >= 0 for row in (four, one) for s in row["stage_s"].values())


def test_a_failed_case_writes_its_error_row_and_stops_the_child(cpu_child, monkeypatch):
    build_twice = zoo.build_twice

    def failing(path, *args, **kwargs):
        if path.name == "tiny_bs1.onnx":
            raise RuntimeError("no tactic")
        return build_twice(path, *args, **kwargs)

    monkeypatch.setattr(zoo, "build_twice", failing)
    (one,) = cpu_child("tiny:1,4")  # bs4 is left to a fresh child (the parent's)
    assert one["error"] == "build: RuntimeError: no tactic" and list(one["stage_s"])[-1] == "build"
    four, one = cpu_child("tiny:4,1")
    assert "error" not in four and one["error"] == "build: RuntimeError: no tactic"


def test_a_child_starts_no_further_case_too_close_to_its_deadline(cpu_child, monkeypatch):
    monkeypatch.setattr(zoo, "START", time.monotonic() - 15)
    rows = cpu_child("tiny:4,1", "--skip-compile", "--deadline", str(zoo.MIN_CASE_S + 10))
    assert [r["batch"] for r in rows] == [4]  # the first case always runs


def test_each_case_gets_a_fresh_torch_compile_with_static_shapes(cpu_child, monkeypatch):
    """torch.compile of bs8 then bs4 in one child: without the reset between them dynamo would
    compile bs4 with a dynamic batch dimension (its automatic-dynamic memory of bs8)."""
    import torch

    graphs = []

    def backend(gm, example_inputs):
        graphs.append([tuple(n.meta["example_value"].shape) for n in gm.graph.nodes
                       if n.op == "placeholder" and isinstance(n.meta.get("example_value"), torch.Tensor)])
        return gm.forward

    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda net, mode=None: compile_(net, backend=backend))
    def images():  # the input's shape in each compiled graph (its parameters are placeholders too)
        return [[s for s in shapes if s[1:] == (3, 16, 16)] for shapes in graphs]

    rows = cpu_child("tiny:8,4", "--rounds", "1")
    assert all("compile_ms" in r and "torch.compile" in r["stage_s"] for r in rows)
    assert images() == [[(8, 3, 16, 16)], [(4, 3, 16, 16)]]
    graphs.clear()
    monkeypatch.setattr(zoo, "release", lambda torch: None)  # the control: dynamo remembers bs8
    cpu_child("tiny:8,4", "--rounds", "1")
    (first,), (second,) = images()
    assert first == (8, 3, 16, 16) and not isinstance(second[0], int)  # bs4 compiled for any batch


# ---- the real thing, on the GPU ---------------------------------------------------------------------

@pytest.mark.gpu
def test_one_child_measures_both_batches_of_a_model_on_the_gpu(tmp_path):
    """The zoo for real on one small model at two batches (torch on the device machine): one child,
    two complete rows, torch.compile in both (its CUDA graphs reset between them)."""
    pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    out = tmp_path / "zoo.json"
    cmd = [sys.executable, str(REPO / "benchmarks" / "zoo.py"), "--models", "squeezenet1_1", "--batches", "2,1",
           "--cache-dir", str(tmp_path / "cache"), "--out", str(out), "--rounds", "1", "--iters", "3",
           "--profile-runs", "1"]
    subprocess.run(cmd, check=True, timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)})
    rows = {r["batch"]: r for r in load_results(out)["results"]}
    assert sorted(rows) == [1, 2] and not [r["error"] for r in rows.values() if "error" in r]
    assert all(r["compile_ms"] > 0 and r["polykit_ms"] > 0 and r["max_rel_err"] < 0.05 for r in rows.values())
    assert "setup" in rows[2]["stage_s"] and "reset" in rows[1]["stage_s"]

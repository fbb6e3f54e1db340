"""benchmarks/zoo.py's two phases: the case order, the parallel prepare phase (benchmarks/zoo_prepare.py)
with stand-in workers, the deadline across both phases, what rows record of the prepare, resume, the
caches' tarball. No GPU, no torch: the workers and case children here are stand-ins; the real
prepare + measure on the GPU is the gpu test at the end."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from benchmarks import zoo, zoo_prepare
from benchmarks.zoo_models import BY_NAME, MODELS
from benchmarks.zoo_report import load_results

REPO = Path(__file__).resolve().parents[2]


def names(cases):
    return [(m.name, b) for m, b in cases]


# ---- order and arguments --------------------------------------------------------------------------

def test_informative_order_puts_the_issue_tables_models_first_each_models_cases_together():
    cases = zoo.select_cases(zoo.parse_args([]))
    order = names(zoo.ordered(cases))
    named = zoo.INFORMATIVE
    assert sorted(order) == sorted(names(cases))
    assert order[:2 * len(named)] == [(n, b) for n in named for b in (max(BY_NAME[n].batches), 1)]
    rest = [m for m in MODELS if m.name not in named]
    assert order[2 * len(named):] == [(m.name, b) for m in rest for b in (max(m.batches), 1)]
    assert names(zoo.ordered(cases, "table")) == names(cases)


def test_prepare_options_need_each_other():
    with pytest.raises(SystemExit):
        zoo.parse_args(["--prepare-only", "--kernel-cache", "shared"])
    with pytest.raises(SystemExit):  # the prepare compiles into the shared cache
        zoo.parse_args(["--prepare-workers", "4"])
    args = zoo.parse_args(["--prepare-workers", "4", "--kernel-cache", "shared", "--prepare-only"])
    assert (args.prepare_workers, args.prepare_only) == (4, True)


def test_the_child_command_carries_what_was_prepared_per_case():
    args = zoo.parse_args(["--kernel-cache", "shared"])
    cmd = zoo.child_command(args, BY_NAME["gpt2"], [8, 1], "rows.jsonl", {8: ["export", "kernels"], 1: []})
    assert json.loads(zoo.parse_args(cmd[2:]).prepared) == {"8": ["export", "kernels"]}
    assert "--prepared" not in zoo.child_command(args, BY_NAME["gpt2"], [8, 1], "rows.jsonl", {8: [], 1: []})
    assert "--prepared" not in zoo.child_command(args, BY_NAME["gpt2"], [8], "rows.jsonl")


def test_a_first_build_with_prepared_kernels_is_not_called_cold():
    said = ["tuning (level 3): timed 40 tactics of 12 layers; compiling took 0.50 s, timing 6.10 s"]
    assert zoo.tuning_facts(said, "kernels_warm") == {"kernels_warm_timed_tactics": 40, "kernels_warm_timed_layers": 12,
                                                      "kernels_warm_compile_s": 0.5, "kernels_warm_timing_s": 6.1}
    assert set(zoo.tuning_facts(said)) == {"cold_timed_tactics", "cold_timed_layers", "cold_compile_s", "cold_timing_s"}


# ---- what the prepare phase prepares ----------------------------------------------------------------

def test_cases_to_prepare_are_those_the_deadline_can_measure():
    todo = [(BY_NAME["resnet50"], b) for b in (1, 32)] * 20  # 40 cases
    assert zoo_prepare.cases_to_prepare(todo, float("inf"), 8) == 40
    per_case = zoo_prepare.MEASURE_CASE_S + zoo_prepare.PREPARE_CASE_S / 8
    assert zoo_prepare.cases_to_prepare(todo, 10 * per_case + 1, 8) == 10
    assert zoo_prepare.cases_to_prepare(todo, 5, 8) == 1


def test_jobs_group_a_models_batches_in_one_worker():
    todo = [(BY_NAME["gpt2"], 8), (BY_NAME["resnet50"], 32), (BY_NAME["gpt2"], 1)]
    assert [(m.name, b) for m, b in zoo_prepare.jobs(todo)] == [("gpt2", [8, 1]), ("resnet50", [32])]


def write_record(cache, model, batch, level=3, parts=("export", "kernels", "inductor")):
    path = zoo_prepare.record_path(cache, model, batch)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"model": model, "batch": batch, "level": level, "prepared": list(parts),
                                "prepare_s": {p: 1.5 for p in parts}, "errors": {}}))


def test_a_record_counts_only_what_the_measure_phase_can_still_use(tmp_path):
    write_record(tmp_path, "gpt2", 8)
    assert zoo_prepare.read_record(tmp_path, "gpt2", 8, 3)["prepared"] == ["kernels", "inductor"]  # no ONNX file
    (tmp_path / "gpt2_bs8.onnx").write_bytes(b"")
    assert zoo_prepare.read_record(tmp_path, "gpt2", 8, 3) == {
        "prepared": ["export", "kernels", "inductor"], "prepare_s": {"export": 1.5, "kernels": 1.5, "inductor": 1.5}}
    assert zoo_prepare.read_record(tmp_path, "gpt2", 8, 5)["prepared"] == ["export", "inductor"]  # other level
    assert zoo_prepare.read_record(tmp_path, "gpt2", 1, 3) == {}
    zoo_prepare.record_path(tmp_path, "gpt2", 1).write_text("{")
    assert zoo_prepare.read_record(tmp_path, "gpt2", 1, 3) == {}


def test_a_failing_part_is_recorded_and_the_others_still_run(monkeypatch, tmp_path):
    args = zoo.parse_args(["--cache-dir", str(tmp_path)])
    args.threads = 1
    monkeypatch.setattr(zoo, "exported", lambda model, batch, cache, torch: ("module", {}, tmp_path / "m.onnx", {}))

    def no_nvrtc(*a):
        raise RuntimeError("nvrtc missing")

    monkeypatch.setattr(zoo_prepare, "compile_kernels", no_nvrtc)
    monkeypatch.setattr(zoo_prepare, "warm_inductor", lambda module, inputs, torch: None)
    record = {"prepared": [], "prepare_s": {}, "errors": {}}
    zoo_prepare.prepare_case(BY_NAME["resnet18"], 1, args, None, record)
    assert record["prepared"] == ["export", "inductor"] and record["errors"] == {"kernels": "RuntimeError: nvrtc missing"}
    args.skip_compile = True
    record = {"prepared": [], "prepare_s": {}, "errors": {}}
    zoo_prepare.prepare_case(BY_NAME["resnet18"], 1, args, None, record)
    assert record["prepared"] == ["export"]


# ---- the prepare phase with stand-in workers ----------------------------------------------------------

#: a stand-in worker: waits (at most 30 s) until two workers have started, so the phase passes only
#: when it runs them in parallel, then writes a record per batch like the real worker
FAKE_WORKER = """
import json, pathlib, sys, time
d, name, batches = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
(d / f"start_{name}").touch()
t0 = time.monotonic()
while len(list(d.glob("start_*"))) < 2:
    if time.monotonic() - t0 > 30:
        sys.exit(1)
    time.sleep(0.05)
for b in batches.split(","):
    p = d / "prepared" / f"{name}_bs{b}.json"
    p.parent.mkdir(exist_ok=True)
    p.write_text(json.dumps({"level": 3, "prepared": ["kernels", "inductor"], "prepare_s": {"kernels": 2.0, "inductor": 3.0}}))
"""

SLEEPER = "import time; time.sleep(600)"


def fake_workers(monkeypatch, script=FAKE_WORKER):
    """Replace the worker command with `script`; the processes started, and how many of the
    others were still running as each started."""
    started, concurrent = [], []

    def command(args, model, batches, threads):
        return [sys.executable, "-c", script, str(Path(args.cache_dir).resolve()), model.name, ",".join(map(str, batches))]

    def start(cmd, env):
        concurrent.append(sum(p.poll() is None for p in started))
        assert env["POLYKIT_CACHE_DIR"].endswith("polykit") and env["TORCHINDUCTOR_CACHE_DIR"].endswith("inductor")
        started.append(subprocess.Popen(cmd, env=env, start_new_session=True))
        return started[-1]

    monkeypatch.setattr(zoo_prepare, "worker_command", command)
    monkeypatch.setattr(zoo_prepare, "start_worker", start)
    return started, concurrent


def test_the_prepare_phase_runs_its_workers_in_parallel_at_most_n_at_a_time(monkeypatch, tmp_path):
    started, concurrent = fake_workers(monkeypatch)
    args = zoo.parse_args(["--kernel-cache", "shared", "--prepare-workers", "2", "--cache-dir", str(tmp_path)])
    todo = [(BY_NAME[n], b) for n in ("resnet50", "gpt2", "swin_t") for b in (1, 8)]
    report = zoo_prepare.prepare_all(args, todo, lambda: float("inf"), lambda m: None)
    assert sorted(report["finished"]) == ["gpt2", "resnet50", "swin_t"] and report["failed"] == report["killed"] == []
    assert len(started) == 3 and max(concurrent) <= 1  # never a third while two ran
    for n in ("resnet50", "gpt2", "swin_t"):
        assert zoo_prepare.read_record(tmp_path, n, 8, 3)["prepared"] == ["kernels", "inductor"]


def test_the_prepare_phase_kills_its_workers_at_the_deadline(monkeypatch, tmp_path):
    started, _ = fake_workers(monkeypatch, SLEEPER)
    args = zoo.parse_args(["--kernel-cache", "shared", "--prepare-workers", "2", "--cache-dir", str(tmp_path)])
    todo = [(BY_NAME[n], 1) for n in ("resnet50", "gpt2", "swin_t")]
    clock = iter([100.0] * 5)
    report = zoo_prepare.prepare_all(args, todo, lambda: next(clock, 0.0), lambda m: None, reserve=30)
    assert sorted(report["killed"]) == ["gpt2", "resnet50"] and len(started) == 2  # the third never started
    assert all(p.returncode is not None for p in started)
    clock = iter([zoo_prepare.MIN_WORKER_S - 1])  # too little time to start any worker
    report = zoo_prepare.prepare_all(args, todo, lambda: next(clock, 0.0), lambda m: None)
    assert len(started) == 2 and report["finished"] == []


# ---- both phases through run_all -------------------------------------------------------------------

class Children:
    """Stands in for zoo.run_child: a row per case of the child's model, the --prepared it was given."""

    def __init__(self):
        self.ran = {}

    def __call__(self, cmd, timeout, progress=lambda: 0, until=float("inf")):
        case = cmd[cmd.index("--case") + 1]
        self.ran[case] = json.loads(cmd[cmd.index("--prepared") + 1]) if "--prepared" in cmd else {}
        model, batches = case.split(":")
        with open(cmd[cmd.index("--row-out") + 1], "a") as fh:
            for batch in map(int, batches.split(",")):
                fh.write(json.dumps({"model": model, "family": "conv", "batch": batch, "polykit_ms": 1.0,
                                     "eager_ms": 2.0, "speed_vs_eager": 2.0, "max_rel_err": 1e-3}) + "\n")
        return 0


def run_phases(monkeypatch, tmp_path, argv, prepare=None):
    children, prepared = Children(), []

    def fake_prepare(args, todo, left, say, reserve=0.0):
        prepared.append(names(todo))
        for model, batch in todo:
            (prepare or write_record)(tmp_path / "cache", model.name, batch)
        return {}

    monkeypatch.setattr(zoo, "run_child", children)
    monkeypatch.setattr(zoo_prepare, "prepare_all", fake_prepare)
    rows = zoo.run_all(zoo.parse_args(argv + ["--cache-dir", str(tmp_path / "cache")]), argv)
    return children.ran, prepared, rows


def test_rows_record_what_the_prepare_phase_did_for_their_case(monkeypatch, tmp_path):
    out = tmp_path / "zoo.json"
    argv = ["--models", "resnet18,gpt2", "--kernel-cache", "shared", "--prepare-workers", "4", "--out", str(out)]
    ran, prepared, rows = run_phases(monkeypatch, tmp_path, argv,
                                     lambda cache, m, b: m == "gpt2" and write_record(cache, m, b, parts=["kernels"]))
    assert prepared == [[("gpt2", 8), ("gpt2", 1), ("resnet18", 32), ("resnet18", 1)]]
    assert ran == {"gpt2:8,1": {"8": ["kernels"], "1": ["kernels"]}, "resnet18:32,1": {}}
    saved = {(r["model"], r["batch"]): r for r in load_results(out)["results"]}
    assert saved[("gpt2", 8)]["prepared"] == ["kernels"] and saved[("gpt2", 8)]["prepare_s"] == {"kernels": 1.5}
    assert saved[("resnet18", 1)]["prepared"] == [] and saved[("resnet18", 1)]["prepare_s"] == {}
    assert len(rows) == 4


def test_prepare_only_measures_nothing_and_resume_prepares_only_pending_cases(monkeypatch, tmp_path):
    out = tmp_path / "zoo.json"
    base = ["--models", "resnet18", "--kernel-cache", "shared", "--prepare-workers", "2", "--out", str(out)]
    ran, prepared, rows = run_phases(monkeypatch, tmp_path, base + ["--prepare-only"])
    assert ran == {} and prepared == [[("resnet18", 32), ("resnet18", 1)]] and rows == [] and not out.exists()
    ran, _, _ = run_phases(monkeypatch, tmp_path, ["--models", "resnet18", "--batches", "1", "--out", str(out)])
    assert ran == {"resnet18:1": {}}  # without --prepare-workers nothing is looked up
    ran, prepared, rows = run_phases(monkeypatch, tmp_path, base + ["--resume", str(out)])
    assert prepared == [[("resnet18", 32)]] and ran == {"resnet18:32": {"32": ["kernels", "inductor"]}}
    assert len(rows) == 2


def test_the_deadline_limits_what_is_prepared_and_leaves_time_to_measure(monkeypatch, tmp_path):
    monkeypatch.setattr(zoo, "START", time.monotonic())
    per_case = zoo_prepare.MEASURE_CASE_S + zoo_prepare.PREPARE_CASE_S / 2
    argv = ["--family", "conv", "--kernel-cache", "shared", "--prepare-workers", "2", "--out", str(tmp_path / "z.json"),
            "--deadline", str(3 * per_case + 5)]
    seen = {}

    def fake_prepare(args, todo, left, say, reserve=0.0):
        seen.update(cases=names(todo), left=left(), reserve=reserve)
        return {}

    monkeypatch.setattr(zoo_prepare, "prepare_all", fake_prepare)
    monkeypatch.setattr(zoo, "run_child", Children())
    zoo.run_all(zoo.parse_args(argv), argv)
    assert seen["cases"] == [("resnet50", 32), ("resnet50", 1), ("convnext_tiny", 32)]  # the measure phase's order
    assert seen["reserve"] == 3 * zoo_prepare.MEASURE_CASE_S  # the time to measure what it prepares
    assert 0 < seen["left"] <= 3 * per_case + 5


# ---- carrying the caches ---------------------------------------------------------------------------

def test_the_caches_tarball_round_trips_without_the_exports(tmp_path):
    cache = tmp_path / "cache"
    (cache / "polykit" / "kernels" / "sm_90").mkdir(parents=True)
    (cache / "polykit" / "kernels" / "sm_90" / "a.cubin").write_bytes(b"\x7fELF")
    (cache / "inductor" / "fxgraph").mkdir(parents=True)
    (cache / "inductor" / "fxgraph" / "g").write_text("graph")
    write_record(cache, "gpt2", 8)
    (cache / "gpt2_bs8.onnx").write_bytes(b"onnx")
    tarball = tmp_path / "caches.tar.gz"
    assert zoo_prepare.pack_caches(cache, tarball) == tarball.stat().st_size
    fresh = tmp_path / "fresh"
    assert zoo_prepare.unpack_caches(tarball, fresh) == 3
    assert (fresh / "polykit" / "kernels" / "sm_90" / "a.cubin").read_bytes() == b"\x7fELF"
    assert (fresh / "inductor" / "fxgraph" / "g").read_text() == "graph"
    assert not (fresh / "gpt2_bs8.onnx").exists()


def test_a_tarball_with_foreign_entries_is_refused(tmp_path):
    tarball = tmp_path / "bad.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        info = tarfile.TarInfo("polykit/../../escape.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(SystemExit, match="not a zoo cache entry"):
        zoo_prepare.unpack_caches(tarball, tmp_path / "cache")
    assert not (tmp_path / "escape.txt").exists()


# ---- the real thing, on the GPU ---------------------------------------------------------------------

@pytest.mark.gpu
def test_a_prepared_case_compiles_no_kernel_in_the_measure_phase(tmp_path):
    """Prepare then measure one small model for real (torch on the device machine): the row says
    what was prepared, its first build is kernels-warm, and the measure phase compiled no kernel."""
    pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    cache, out = tmp_path / "cache", tmp_path / "zoo.json"
    base = [sys.executable, str(REPO / "benchmarks" / "zoo.py"), "--models", "squeezenet1_1", "--batches", "1",
            "--kernel-cache", "shared", "--prepare-workers", "1", "--cache-dir", str(cache), "--out", str(out),
            "--rounds", "1", "--iters", "3", "--profile-runs", "0"]
    env = {**__import__("os").environ, "PYTHONPATH": str(REPO)}
    subprocess.run(base + ["--prepare-only"], check=True, timeout=300, env=env)
    cubins = sorted(p.name for p in (cache / "polykit").rglob("*.cubin"))
    assert cubins and (cache / "inductor").is_dir()
    subprocess.run(base, check=True, timeout=300, env=env)
    row = load_results(out)["results"][0]
    assert "error" not in row, row["error"]
    assert row["prepared"] == ["export", "kernels", "inductor"] and row["export_cached"] is True
    assert "build_kernels_warm_s" in row and "build_cold_s" not in row
    after = sorted(p for p in (cache / "polykit").rglob("*.cubin"))
    # a kernel the measure phase compiled is named by its entry's sidecar (nvrtc.compile_cached)
    extra = [json.loads(p.with_suffix(".json").read_text()) if p.with_suffix(".json").exists() else p.name
             for p in after if p.name not in cubins]
    assert not extra, f"the measure phase compiled kernels the prepare phase did not: {extra}"
    assert sorted(p.name for p in after) == cubins

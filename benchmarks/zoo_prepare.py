"""benchmarks/zoo.py's prepare phase: the slow CPU-bound parts of the pending cases, in parallel
worker processes, before the measure phase times the cases one at a time on a quiet GPU.

    PYTHONPATH=. python3 benchmarks/zoo.py ... --prepare-workers 8 [--prepare-only]

One worker per model (its pending batches in turn, so two workers never write one model's prepared
weights) does, per batch, what the case would otherwise do first:

- export: the ONNX export into --cache-dir (zoo.exported, as the case does);
- kernels: polykit's kernel compilation into the shared kernel cache (--cache-dir/polykit, the
  cache `--kernel-cache shared` builds with): polykit.compiler.builder.builder.compile_candidates
  compiles the kernels of every candidate the build's tuner will time and of every layer's first
  candidate, at the same level, and times nothing (NVRTC only: no GPU contention);
- inductor: torch.compile(mode="reduce-overhead") of the same fp16 module run on the same inputs,
  which fills inductor's on-disk FX-graph, AOTAutograd and Triton caches (--cache-dir/inductor,
  TORCHINDUCTOR_CACHE_DIR for both phases; skipped with --skip-compile).

The measure phase is zoo.py's case as before: the first polykit build then finds its kernels
compiled (its timing cache is still fresh, so every tactic is timed, on a quiet GPU: the plan is
the one a cold build picks) and torch.compile finds inductor's artifacts; dynamo's tracing and
the CUDA-graph recording are not cached. Each worker writes a record per finished batch
(--cache-dir/prepared/NAME_bsB.json); the measure phase puts what was prepared in the row
(`prepared`, `prepare_s`). The caches live in --cache-dir: a fresh device machine has none of
them (pack_caches / unpack_caches carry the kernel and inductor caches in a tarball).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Sequence

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.zoo_models import BY_NAME, ZooModel  # noqa: E402

PARTS = ("export", "kernels", "inductor")
#: estimates from the 2026-12-05 stage times (docs/ZOO.md "Commands"), to be replaced by the rows'
#: prepare_s and case_s once measured: seconds a worker (cpu_count / workers cores: 2 of the
#: device's 16 with 8 workers) takes to prepare one case (export 9; NVRTC of the candidates,
#: 6-14 s on 16 cores, so ~50-100 s on 2; inductor ~30) and seconds to measure a prepared one
#: (setup 4, build front end + timing ~15, eager 4, torch.compile from inductor's cache ~5, timing 2)
PREPARE_CASE_S = 120
MEASURE_CASE_S = 30
#: a worker is not started with less time than this before the prepare phase's end
MIN_WORKER_S = 20
#: the caches a tarball carries (exports are too large for a 64 MiB carry: ResNet-50 alone is ~100 MB)
CARRIED = ("polykit", "inductor", "prepared")


def inductor_env(cache_dir: str | Path) -> dict[str, str]:
    """The environment that points torch.compile's on-disk caches at --cache-dir (both phases)."""
    return {"TORCHINDUCTOR_CACHE_DIR": str(Path(cache_dir).resolve() / "inductor"),
            "TORCHINDUCTOR_FX_GRAPH_CACHE": "1", "TORCHINDUCTOR_AUTOGRAD_CACHE": "1"}


def kernel_cache(cache_dir: str | Path) -> Path:
    """POLYKIT_CACHE_DIR of `--kernel-cache shared` builds and of the prepare phase."""
    return Path(cache_dir).resolve() / "polykit"


def record_path(cache_dir: str | Path, model: str, batch: int) -> Path:
    return Path(cache_dir) / "prepared" / f"{model}_bs{batch}.json"


def read_record(cache_dir: str | Path, model: str, batch: int, level: int) -> dict:
    """What the prepare phase did for a case, as the measure phase can still use it: "export" only
    while its ONNX file is there, "kernels" only for the same builder level; {} when nothing."""
    path = record_path(cache_dir, model, batch)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    parts = [p for p in record.get("prepared", []) if p in PARTS]
    if "export" in parts and not (Path(cache_dir) / f"{model}_bs{batch}.onnx").exists():
        parts.remove("export")
    if "kernels" in parts and record.get("level") != level:
        parts.remove("kernels")
    if not parts:
        return {}
    return {"prepared": parts, "prepare_s": {p: s for p, s in record.get("prepare_s", {}).items() if p in parts}}


def cases_to_prepare(todo: Sequence[tuple[ZooModel, int]], left: float, workers: int) -> int:
    """How many of the pending cases (in order) to prepare when `left` seconds remain: those the
    measure phase can still reach after preparing them (the estimates PREPARE_CASE_S and
    MEASURE_CASE_S), at least one; all of them without a deadline (left = inf)."""
    if left == float("inf"):
        return len(todo)
    per_case = MEASURE_CASE_S + PREPARE_CASE_S / max(workers, 1)
    return max(1, min(len(todo), int(left // per_case)))


def jobs(todo: Sequence[tuple[ZooModel, int]]) -> list[tuple[ZooModel, list[int]]]:
    """One job per model, its batches in case order, the models in order of their first case."""
    by_model: dict[str, tuple[ZooModel, list[int]]] = {}
    for model, batch in todo:
        by_model.setdefault(model.name, (model, []))[1].append(batch)
    return list(by_model.values())


def worker_command(args: argparse.Namespace, model: ZooModel, batches: Sequence[int], threads: int) -> list[str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", f"{model.name}:{','.join(map(str, batches))}",
           "--cache-dir", str(Path(args.cache_dir).resolve()), "--level", str(args.level), "--threads", str(threads)]
    return cmd + (["--skip-compile"] if args.skip_compile else [])


def start_worker(cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
    """A worker in its own process group (so a kill takes inductor's compile workers too)."""
    return subprocess.Popen(cmd, env=env, start_new_session=True)


def kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def prepare_all(args: argparse.Namespace, todo: Sequence[tuple[ZooModel, int]], left: Callable[[], float],
                say: Callable[[str], None], reserve: float = 0.0) -> dict[str, Any]:
    """Run the prepare workers for `todo`, `args.prepare_workers` at a time, until all finished or
    `left()` - `reserve` runs out (then running workers are killed: what they finished is on disk).
    What happened: {"jobs", "finished", "failed" (models), "killed" (models), "seconds"}."""
    t0 = time.monotonic()
    workers = max(1, args.prepare_workers)
    threads = max(1, (os.cpu_count() or 1) // workers)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
               POLYKIT_CACHE_DIR=str(kernel_cache(args.cache_dir)), TORCHINDUCTOR_COMPILE_THREADS=str(threads),
               **inductor_env(args.cache_dir))
    queue = jobs(todo)
    report: dict[str, Any] = {"jobs": len(queue), "finished": [], "failed": [], "killed": []}
    running: dict[str, subprocess.Popen] = {}
    say(f"prepare: {len(todo)} cases of {len(queue)} models, {workers} workers of {threads} threads")
    while queue or running:
        budget = left() - reserve
        if budget <= 0:
            for name, proc in running.items():
                kill(proc)
                report["killed"].append(name)
            say(f"prepare: deadline, {len(running)} workers killed, {len(queue)} models not started")
            break
        while queue and len(running) < workers and budget >= MIN_WORKER_S:
            model, batches = queue.pop(0)
            running[model.name] = start_worker(worker_command(args, model, batches, threads), env)
        if not running:  # too little time to start another worker
            say(f"prepare: {len(queue)} models not started (too little time left)")
            break
        for name, proc in list(running.items()):
            if proc.poll() is not None:
                report["finished" if proc.returncode == 0 else "failed"].append(name)
                del running[name]
        time.sleep(0.2)
    report["seconds"] = round(time.monotonic() - t0, 1)
    say(f"prepare: done in {report['seconds']} s ({len(report['finished'])} models prepared"
        f"{', failed: ' + ', '.join(report['failed']) if report['failed'] else ''})")
    return report


# ---- carrying the caches between device calls ---------------------------------------------------

def pack_caches(cache_dir: str | Path, tarball: str | Path) -> int:
    """Write the kernel and inductor caches and the prepare records of `cache_dir` into `tarball`
    (gzip); its size in bytes."""
    cache_dir, tarball = Path(cache_dir), Path(tarball)
    tmp = tarball.with_name(tarball.name + ".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for name in CARRIED:
            if (cache_dir / name).exists():
                tar.add(cache_dir / name, arcname=name)
    tmp.replace(tarball)
    return tarball.stat().st_size


def unpack_caches(tarball: str | Path, cache_dir: str | Path) -> int:
    """Extract a pack_caches tarball into `cache_dir` (only regular files and folders under the
    carried names; anything else in it is refused); the number of files."""
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tarball, "r:gz") as tar:
        members = tar.getmembers()
        for m in members:
            parts = Path(m.name).parts
            if not (m.isfile() or m.isdir()) or not parts or parts[0] not in CARRIED or ".." in parts \
                    or Path(m.name).is_absolute():
                raise SystemExit(f"{tarball}: {m.name!r} is not a zoo cache entry; not extracted")
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # Python >= 3.11.4 checks again
        tar.extractall(cache_dir, members=members, **safe)
    return sum(m.isfile() for m in members)


# ---- the worker: one model's batches -------------------------------------------------------------

def prepare_case(model: ZooModel, batch: int, args: argparse.Namespace, torch, record: dict) -> None:
    """Prepare one case, part by part, filling `record` ("prepared", "prepare_s", "errors")."""
    from benchmarks import zoo

    cache = Path(args.cache_dir)

    def part(name: str, work: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        try:
            out = work()
        except Exception as exc:  # one part failing leaves the others (the measure phase redoes it)
            traceback.print_exc()
            record["errors"][name] = f"{type(exc).__name__}: {exc}"[:300]
            return None
        record["prepared"].append(name)
        record["prepare_s"][name] = round(time.perf_counter() - t0, 1)
        return out

    made = part("export", lambda: zoo.exported(model, batch, cache, torch))
    if made is None:
        return
    module, inputs, path, _ = made
    part("kernels", lambda: compile_kernels(path, args.level, args.threads, record))
    if not args.skip_compile:
        part("inductor", lambda: warm_inductor(module, inputs, torch))


def compile_kernels(path: Path, level: int, threads: int, record: dict) -> None:
    from polykit.compiler.builder.builder import compile_candidates
    from polykit.compiler.builder.config import BuilderConfig

    did = compile_candidates(str(path), BuilderConfig(target="cuda", fp16=True, builder_optimization_level=level),
                             workers=threads)
    record["kernel_units"] = did["kernels"]


def warm_inductor(module, inputs: dict, torch) -> None:
    """torch.compile of the fp16 module as the measure phase compiles it (zoo.torch_model), run on
    the same inputs: inductor's caches on disk then hold its graphs and kernels."""
    from benchmarks import zoo

    net, _, half_inputs = zoo.torch_model(module, inputs, torch)
    with torch.inference_mode():
        facts: dict = {}
        if zoo.compile_runner(net, half_inputs, torch, facts) is None:
            raise RuntimeError(facts.get("compile_error", "torch.compile failed"))
    net.cpu()
    torch.cuda.empty_cache()


def run_worker(args: argparse.Namespace) -> int:
    """A worker's work: every batch of one model, a record written after each."""
    import torch

    name, batches = args.worker.rsplit(":", 1)
    model = BY_NAME[name]
    torch.set_num_threads(args.threads)
    failed = 0
    for batch in map(int, batches.split(",")):
        record: dict[str, Any] = {"model": name, "batch": batch, "level": args.level, "prepared": [],
                                  "prepare_s": {}, "errors": {}}
        prepare_case(model, batch, args, torch, record)
        path = record_path(args.cache_dir, name, batch)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.with_suffix(".tmp").write_text(json.dumps(record))
        path.with_suffix(".tmp").replace(path)
        failed += bool(record["errors"])
        print(f"prepared {name} bs{batch}: {record['prepare_s']}{' errors: ' + str(record['errors']) if record['errors'] else ''}",
              flush=True)
    sys.stdout.flush()
    os._exit(1 if failed else 0)  # no teardown: inductor's compile workers go with the process group


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="one zoo prepare worker (benchmarks/zoo.py --prepare-workers starts these)")
    p.add_argument("--worker", required=True, metavar="NAME:B1,B2")
    p.add_argument("--cache-dir", required=True)
    p.add_argument("--level", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--skip-compile", action="store_true")
    run_worker(p.parse_args(argv))


if __name__ == "__main__":
    main()

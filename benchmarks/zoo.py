"""The speed yardstick: polykit's cuda engine against torch eager and torch.compile on a zoo of
convolutional and transformer architectures (benchmarks/zoo_models.py), random weights.

Run on a GPU machine with torch, torchvision, timm and transformers (no network needed):

    PYTHONPATH=. python3 benchmarks/zoo.py [--family conv|transformer|all] [--models a,b] [--batches 1,max]
        [--out zoo.json] [--resume zoo.json] [--cache-dir .zoo_cache] [--deadline 540] [--skip-compile]
        [--kernel-cache shared --prepare-workers 8 [--prepare-only]] [--load-caches T] [--save-caches T]
        [--pdl off|on|both]
    python3 benchmarks/zoo.py --render zoo.json [more.json ...] [--into docs/ZOO.md]

A case is a (model, batch). One child process per model measures the model's pending cases in
turn, sharing what no case's numbers depend on: the imports ("setup") and the prepared fp32 torch
module (seed 0, zoo_models.prepare; "model": built and its weights loaded once). Each case then has
its own everything else: the module (a copy, but for the child's last case: the GPU phase
converts it), exported to ONNX once per batch and kept in --cache-dir with its export time; polykit builds for --target cuda in fp16 twice, cold (a fresh
POLYKIT_CACHE_DIR: no compiled kernels, no timing cache) then warm (same kernel cache, the first
build's timing cache); torch runs eager under inference_mode with model.half() and as
torch.compile(mode="reduce-overhead") in the same process; polykit runs through
ExecutionContext.enqueue on torch tensors bound in place with set_tensor_address (CUDA-graph
replay; --io copies passes them to enqueue, copied through the arena). The three are timed in
alternating --rounds (CUDA events, median of --iters after --warmup runs each), the reported time
the median of the rounds. Accuracy: polykit's fp16 output against torch fp32 eager (TF32 off) on
the same input (max abs error, max abs error / max |ref|, L2 relative), and torch's own fp16 error
beside it. Then polykit's per-layer profile (polykit.tools.bench.benchmark.profile_engine) gives the
layer kinds and tactics that take the time. Between two cases the child calls
torch.compiler.reset() (torch._dynamo.reset: dynamo's compiled code, guards and automatic-dynamic
shape memory, and inductor's CUDA-graph trees with their memory pool) and empties torch's GPU cache,
so each case's torch.compile is a fresh one compiled for its own static shapes, as in a process of
its own (without the reset dynamo would compile the second batch with a dynamic batch dimension);
inductor's on-disk caches are shared as between processes.

--pdl (default: the environment's POLYKIT_PDL, 0 off / 1 on / both, else off) loads the plan with
Programmatic Dependent Launch (polykit.kernels.cuda.pdl; sm_90+): `on` times it as `polykit_ms`;
`both` loads the plan twice, times the PDL engine as a fourth runner in the same alternating rounds
(`polykit_pdl_ms`, `pdl_speedup` = polykit_ms / polykit_pdl_ms) and records whether its output is
bit-identical to the plain engine's (`pdl_identical`). The row says which (`pdl`).

Rows are as a process per case wrote them, plus `stage_s`: the seconds of each stage of the case
(setup, model, export, build, torch, torch.compile, polykit, timing, profile; "reset" before a
child's later case). The shared stages count in the child's first case only, and so does the
process's one-time warm-up inside later stages (the CUDA context and polykit's imports in the first
build, torch.compile's start-up in the first compile): a later case's build_cold_s and
compile_first_s can read a little lower than in a process of its own. `case_s` is the case's share
of its child's wall time (from the child's start, or its previous case's row, to its own row).

A failed case is recorded (an error row) and stops its child, whose CUDA context may be poisoned;
a child that crashes or runs past --case-timeout (seconds per case: the clock restarts with each
row) costs the case it was measuring; either way the model's other cases get a fresh child. A
failure in the shared stages is every case's error row. Every finished case is written to --out at
once; --resume skips the cases a results file holds (a half-done model's child measures only its
pending batches); --deadline stops starting models (and, in a child, cases: it is told the time
left) with less than MIN_CASE_S left, and cuts the running case, which --resume then retries, so
that a time-limited call keeps what it finished. Cases run in --order informative: the models the
issue tables of #29/#30 name first, each model's throughput batch then its batch 1, then the other
models in table order (a model's cases stay together: they share a child).

With --prepare-workers N (and --kernel-cache shared) a prepare phase runs first
(benchmarks/zoo_prepare.py): N worker processes export, compile polykit's candidate kernels without
timing them, and warm torch.compile's on-disk caches for the pending cases the deadline can reach;
then the measure phase runs the cases one child at a time as above. Rows say what was prepared
(`prepared`, `prepare_s`), and a first build whose kernels were prepared is `build_kernels_warm_s`
(with `kernels_warm_compile_s`, `kernels_warm_timing_s`), never `build_cold_s`. --deadline covers both
phases; --prepare-only stops after the first.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import json
import logging
import math
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # `python3 benchmarks/zoo.py` as well as `python3 -m benchmarks.zoo`
    sys.path.insert(0, str(REPO))

from benchmarks import provenance, zoo_prepare  # noqa: E402
from benchmarks.zoo_models import BY_NAME, FAMILIES, MODELS, ZooModel, make_inputs, prepare  # noqa: E402
from benchmarks.zoo_report import load_results, render_files  # noqa: E402

START = time.monotonic()
FORMAT = 1  # the results file's version
MIN_CASE_S = 30  # a case is not started with less time than this before --deadline
#: --pdl's choices, and POLYKIT_PDL's values for them
PDL_MODES = {"0": "off", "1": "on", "off": "off", "on": "on", "both": "both"}


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} +{time.monotonic() - START:5.0f}s] {message}", flush=True)


# ---- arguments and the case list ---------------------------------------------------------------

def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--render", nargs="+", metavar="RESULTS", help="write the markdown tables of these results files")
    p.add_argument("--into", metavar="MARKDOWN", help="with --render: replace the marked results section of this file")
    p.add_argument("--family", choices=[*FAMILIES, "all"], default="all")
    p.add_argument("--models", default="", help="comma-separated zoo names (default: every model of --family)")
    p.add_argument("--batches", default="1,max", help="comma-separated batch sizes; 'max' is each model's throughput batch")
    p.add_argument("--rounds", type=int, default=3, help="alternating timing rounds (median of rounds)")
    p.add_argument("--iters", type=int, default=20, help="timed runs per round and runner (median)")
    p.add_argument("--warmup", type=int, default=5, help="untimed runs before each timed set")
    p.add_argument("--skip-compile", action="store_true", help="do not time torch.compile")
    p.add_argument("--level", type=int, default=3, help="polykit builder optimization level")
    p.add_argument("--io", choices=["in-place", "copies"], default="in-place",
                   help="polykit's I/O: torch tensors bound with set_tensor_address (TensorRT's enqueueV3 way, "
                        "the default since 2026-12-05), or passed to enqueue and copied through the arena")
    p.add_argument("--kernel-cache", choices=["fresh", "shared"], default="fresh",
                   help="fresh: every case's first build is cold; shared: builds share --cache-dir's kernel "
                        "cache (faster runs; the first build is then not cold)")
    p.add_argument("--profile-runs", type=int, default=3, help="profiled runs for the layer-kind breakdown (0: none)")
    p.add_argument("--pdl", choices=["off", "on", "both"], default=PDL_MODES.get(os.environ.get("POLYKIT_PDL", ""), "off"),
                   help="load plans with Programmatic Dependent Launch (sm_90+): off, on, or both timed side by "
                        "side (default: POLYKIT_PDL=0|1|both, else off)")
    p.add_argument("--out", default="zoo.json", help="results file, rewritten after every case")
    p.add_argument("--resume", metavar="RESULTS", help="skip the cases this results file holds (errors are retried)")
    p.add_argument("--cache-dir", default=".zoo_cache", help="ONNX exports and prepared weights, kept across runs")
    p.add_argument("--case-timeout", type=float, default=420,
                   help="seconds one case may take before its child process is killed (the clock restarts with "
                        "each case the child finishes)")
    p.add_argument("--deadline", type=float, default=0, help="seconds this run may take (0: no limit)")
    p.add_argument("--order", choices=["informative", "table"], default="informative",
                   help="informative: the models the issues' tables name first (INFORMATIVE), each model's cases "
                        "together; table: table order")
    p.add_argument("--prepare-workers", type=int, default=0, metavar="N",
                   help="first prepare the pending cases in N parallel processes (exports, polykit kernels, "
                        "inductor caches; needs --kernel-cache shared), then measure")
    p.add_argument("--prepare-only", action="store_true", help="stop after the prepare phase")
    p.add_argument("--load-caches", metavar="TARBALL", help="first extract a --save-caches tarball into --cache-dir")
    p.add_argument("--save-caches", metavar="TARBALL",
                   help="at the end, write --cache-dir's kernel and inductor caches and prepare records (not the "
                        "exports) into this tarball")
    p.add_argument("--case", help=argparse.SUPPRESS)  # NAME:B1,B2,..., run by the parent in a child process
    p.add_argument("--row-out", help=argparse.SUPPRESS)  # the child appends a JSON line per case
    p.add_argument("--prepared", default="", help=argparse.SUPPRESS)  # JSON: batch -> what the prepare phase did
    args = p.parse_args(argv)
    if args.into and not args.render:
        p.error("--into goes with --render")
    if args.prepare_only and not args.prepare_workers:
        p.error("--prepare-only goes with --prepare-workers N")
    if args.prepare_workers and args.kernel_cache != "shared":
        p.error("--prepare-workers compiles into the shared kernel cache: add --kernel-cache shared")
    return args


def select_cases(args: argparse.Namespace) -> list[tuple[ZooModel, int]]:
    """The (model, batch) pairs the arguments ask for, in table order; unknown names are an error."""
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise SystemExit(f"unknown zoo models: {', '.join(unknown)} (known: {', '.join(BY_NAME)})")
    models = [m for m in MODELS if (not names or m.name in names) and args.family in ("all", m.family)]
    cases = []
    for model in models:
        batches = []
        for word in args.batches.split(","):
            batch = max(model.batches) if word == "max" else int(word)
            if batch not in batches:
                batches.append(batch)
        cases += [(model, b) for b in batches]
    return cases


#: the models the tables of issues #29 and #30 name, in their order: measured first (--order informative)
INFORMATIVE = ("resnet50", "convnext_tiny", "efficientnet_b0", "mobilenet_v3_large", "densenet121", "bert_base",
               "swin_t", "vit_b_16", "gpt2", "whisper_encoder", "t5_encoder")


def ordered(cases: Sequence[tuple[ZooModel, int]], order: str = "informative") -> list[tuple[ZooModel, int]]:
    """`cases` in the order they run, a model's cases together (one child process measures them):
    informative puts the INFORMATIVE models first, in that order, then the other models in table
    order, each model's throughput batch before its other batches (as given); table keeps them as
    they are (select_cases gives them model by model)."""
    if order == "table":
        return list(cases)
    first: dict[str, int] = {}
    for i, (model, _) in enumerate(cases):
        first.setdefault(model.name, i)

    def key(i: int) -> tuple[bool, int, bool, int]:
        model, batch = cases[i]
        named = model.name in INFORMATIVE
        rank = INFORMATIVE.index(model.name) if named else first[model.name]
        return not named, rank, batch != max(model.batches), i
    return [cases[i] for i in sorted(range(len(cases)), key=key)]


def case_key(row: dict) -> tuple[str, int]:
    return row["model"], int(row["batch"])


def pending(cases: Iterable[tuple[ZooModel, int]], done: Iterable[dict]) -> list[tuple[ZooModel, int]]:
    """The cases without a finished row (a row with an error counts as not finished)."""
    finished = {case_key(r) for r in done if "error" not in r}
    return [(m, b) for m, b in cases if (m.name, b) not in finished]


def merge(rows: list[dict], row: dict) -> list[dict]:
    """`rows` with `row` in place of an earlier row of its case."""
    return [r for r in rows if case_key(r) != case_key(row)] + [row]


def write_results(path: str | Path, rows: list[dict], settings: dict) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"format": FORMAT, "settings": settings, "results": rows}, indent=1))
    tmp.replace(path)  # a kill between cases never leaves half a file


# ---- the parent: one child process per model ---------------------------------------------------

def child_command(args: argparse.Namespace, model: ZooModel, batches: Sequence[int], row_out: str,
                  prepared: Mapping[int, Sequence[str]] | None = None) -> list[str]:
    """The child that measures `batches` of `model` in turn, appending their rows to `row_out`;
    `prepared`: what the prepare phase did, per batch."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--case", f"{model.name}:{','.join(map(str, batches))}",
           "--row-out", row_out, "--rounds", str(args.rounds), "--iters", str(args.iters), "--warmup", str(args.warmup),
           "--level", str(args.level), "--io", args.io, "--kernel-cache", args.kernel_cache, "--profile-runs", str(args.profile_runs),
           "--cache-dir", str(Path(args.cache_dir).resolve()), "--pdl", args.pdl]
    if args.deadline:  # the child starts no further case with less than MIN_CASE_S of this left
        cmd += ["--deadline", f"{max(time_left(args), 1):.1f}"]
    parts = {str(b): list(p) for b, p in (prepared or {}).items() if p}
    cmd += ["--skip-compile"] if args.skip_compile else []
    return cmd + (["--prepared", json.dumps(parts)] if parts else [])


#: seconds between two looks at a running child (its rows, its exit)
POLL_S = 0.2


def run_child(cmd: list[str], timeout: float, progress: Callable[[], int] = lambda: 0,
              until: float = math.inf) -> int | None:
    """Run `cmd` in its own process group; its exit code, or None when it was killed (the whole
    group, torch.compile's workers included): when `timeout` seconds passed without `progress()`
    (the rows it has written) growing - the clock restarts with every row, so `timeout` bounds
    each case - or at `until` (a time.monotonic() value: the deadline)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    child = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        seen, since = progress(), time.monotonic()
        while True:
            try:
                return child.wait(timeout=POLL_S)
            except subprocess.TimeoutExpired:
                pass
            now, count = time.monotonic(), progress()
            if count != seen:
                seen, since = count, now
            if now - since >= max(timeout, 1) or now >= until:
                return None
    finally:
        if child.poll() is None:  # past its time, or this process is being stopped: never leave it running
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()


def time_left(args: argparse.Namespace) -> float:
    """Seconds before --deadline (inf without one), counted from this process's start."""
    return args.deadline - (time.monotonic() - START) if args.deadline else math.inf


class ChildRows:
    """The rows a child appends to its --row-out (one JSON line per finished case), taken as they
    come: each stamped with case_s, the seconds since the child's start or its previous row (so
    a child's first case carries the stages its cases share), then handed to `record`."""

    def __init__(self, path: Path, record: Callable[[dict], None]):
        self.path, self.record = path, record
        self.done: list[int] = []
        self.mark = time.monotonic()

    def poll(self) -> int:
        """Take the rows written since the last poll; how many there are in all."""
        try:
            lines = self.path.read_text().split("\n")[:-1]  # a line without its newline is still being written
        except FileNotFoundError:
            lines = []
        for line in lines[len(self.done):]:
            row = dict(json.loads(line), case_s=self.lap())
            self.done.append(int(row["batch"]))
            self.record(row)
        return len(self.done)

    def lap(self) -> float:
        """Seconds since the child's start or the last row (and restart the count)."""
        now = time.monotonic()
        seconds, self.mark = round(now - self.mark, 1), now
        return seconds


def run_all(args: argparse.Namespace, argv: Sequence[str] | None = None) -> list[dict]:
    """Prepare (--prepare-workers) then run the pending cases one child process per model,
    rewriting --out after every case; the rows. `argv` (default sys.argv[1:]) is recorded as the
    command in the results file's settings."""
    resumed = load_results(args.resume) if args.resume and Path(args.resume).exists() else {"results": []}
    rows = resumed["results"]
    todo = ordered(pending(select_cases(args), rows), args.order)
    command = "PYTHONPATH=. python3 benchmarks/zoo.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    commands = resumed.get("settings", {}).get("commands", [])
    settings = {"commands": commands + [command] if command not in commands else commands}
    Path(args.cache_dir).mkdir(parents=True, exist_ok=True)
    if args.load_caches and Path(args.load_caches).exists():
        say(f"{zoo_prepare.unpack_caches(args.load_caches, args.cache_dir)} cached files from {args.load_caches}")
    say(f"{len(todo)} cases to run ({len(rows)} rows resumed); results to {args.out}")
    if args.prepare_workers and todo:  # what the measure phase can reach, leaving it the time to measure them
        n = len(todo) if args.prepare_only else zoo_prepare.cases_to_prepare(todo, time_left(args), args.prepare_workers)
        reserve = 0 if args.prepare_only else max(MIN_CASE_S, n * zoo_prepare.MEASURE_CASE_S)
        zoo_prepare.prepare_all(args, todo[:n], lambda: time_left(args), say, reserve)
    if not args.prepare_only:
        rows = measure_all(args, todo, rows, settings)
    if args.save_caches:
        size = zoo_prepare.pack_caches(args.cache_dir, args.save_caches)
        say(f"caches written to {args.save_caches} ({size / 2**20:.1f} MiB)")
    return rows


def measure_all(args: argparse.Namespace, todo: Sequence[tuple[ZooModel, int]], rows: list[dict],
                settings: dict) -> list[dict]:
    """The measure phase: the cases of `todo`, one child process per model (its cases in `todo`'s
    order), one child at a time; each case's row is written to --out as the child finishes it.
    The cases a child left (it died, was killed past --case-timeout, or stopped after a failed
    case) get a fresh child of their own."""
    queue = zoo_prepare.jobs(todo)
    counted = 0

    def record(row: dict) -> None:
        nonlocal rows, counted
        counted += 1
        rows = merge(rows, row)
        write_results(args.out, rows, settings)
        say(summary(row))

    while queue:
        model, batches = queue.pop(0)
        if time_left(args) < MIN_CASE_S:
            waiting = len(batches) + sum(len(b) for _, b in queue)
            say(f"deadline: {waiting} cases not started; rerun with --resume {args.out}")
            break
        which = f"{counted + 1}-{counted + len(batches)}" if len(batches) > 1 else f"{counted + 1}"
        say(f"case {which}/{len(todo)}: {model.name} bs{', bs'.join(map(str, batches))}")
        rest, cut = run_model(args, model, batches, record)
        if cut:
            say(f"{model.name} bs{rest[0]}: cut at the deadline, not recorded; rerun with --resume {args.out}")
            break
        if rest:
            queue.insert(0, (model, rest))
    return rows


def run_model(args: argparse.Namespace, model: ZooModel, batches: Sequence[int],
              record: Callable[[dict], None]) -> tuple[list[int], bool]:
    """Measure `batches` of `model` in one child process, `record` getting each case's row as it
    finishes (with what the prepare phase did for it), and an error row for the case a dead or
    killed child was measuring. (The batches left unmeasured, whether the deadline cut the
    child: then its running case, rest[0], is not recorded.)"""
    records = {b: zoo_prepare.read_record(args.cache_dir, model.name, b, args.level) for b in batches} \
        if args.prepare_workers else {}

    def finish(row: dict) -> None:
        if args.prepare_workers:  # what the prepare phase did for this case (nothing: [])
            done = records.get(int(row["batch"]), {})
            row.update(prepared=done.get("prepared", []), prepare_s=done.get("prepare_s", {}))
        record(row)

    with tempfile.TemporaryDirectory() as tmp:
        rows = ChildRows(Path(tmp) / "rows.jsonl", finish)
        parts = {b: r.get("prepared", ()) for b, r in records.items()}
        cmd = child_command(args, model, batches, str(rows.path), parts)
        code = run_child(cmd, args.case_timeout, rows.poll, START + args.deadline if args.deadline else math.inf)
        rows.poll()
    rest = [b for b in batches if b not in rows.done]
    if not rest:
        return [], False
    if code is None and time_left(args) <= 0:
        return rest, True
    if code != 0 or not rows.done:  # the child died or was killed measuring rest[0]
        why = (f"timed out after {args.case_timeout:.0f} s" if code is None else f"the case process exited {code}"
               if code else "the case process ended without writing its row")
        finish({"model": model.name, "family": model.family, "batch": rest[0], "error": why, "case_s": rows.lap()})
        rest = rest[1:]
    return rest, False


def summary(row: dict) -> str:
    head = f"{row['model']} bs{row['batch']} ({row.get('case_s', '?')} s)"
    if "error" in row:
        return f"{head}: ERROR {row['error'][:300]}"
    compile_part = f", compile {row['compile_ms']:.3f} ms ({row['speed_vs_compile']:.2f}x)" if row.get("compile_ms") else ""
    pdl_part = (f", with PDL {row['polykit_pdl_ms']:.3f} ms ({row['pdl_speedup']:.2f}x, "
                f"{'identical' if row['pdl_identical'] else 'DIFFERENT'})" if row.get("polykit_pdl_ms") else "")
    return (f"{head}: polykit {row['polykit_ms']:.3f} ms{pdl_part}, eager {row['eager_ms']:.3f} ms "
            f"({row['speed_vs_eager']:.2f}x){compile_part}, max rel err {row['max_rel_err']:.1e}")


# ---- the child: one model's cases --------------------------------------------------------------

def save_state(module: Any, path: Path) -> None:
    """`module`'s state dict as a numpy .npz (never pickle: torch.save is one), written to `path`."""
    import numpy as np

    arrays = {name: t.detach().cpu().contiguous().numpy() for name, t in module.state_dict().items()}
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)


def load_state(module: Any, path: Path, torch) -> None:
    """The state dict save_state wrote, copied into `module`'s own tensors (np.load refuses pickled
    objects). Not load_state_dict: the .npz has no state-dict metadata, and modules whose loading hook
    reads a version from it (torchvision's MNASNet) refuse a dict without one."""
    import numpy as np

    with np.load(path, allow_pickle=False) as data, torch.no_grad():
        own = module.state_dict()
        if set(data.files) != set(own):
            raise ValueError(f"{path}: saved weights {sorted(set(data.files) ^ set(own))[:4]} do not match the "
                             "module's; delete the cache folder's weights to prepare them again")
        for name, tensor in own.items():
            tensor.copy_(torch.from_numpy(data[name].copy()))


def prepared_module(model: ZooModel, cache: Path, torch) -> Any:
    """The fp32 torch module of `model` (seed 0, eval mode) with its prepared weights, kept in
    `cache` (prepared and saved the first time; new weights drop the model's exports)."""
    state = cache / f"{model.name}.weights.npz"
    torch.manual_seed(0)
    module = model.make().eval()
    if state.exists():
        load_state(module, state, torch)
    else:
        prepare(model, module, torch)
        save_state(module, state.with_suffix(".tmp"))
        for old in cache.glob(f"{model.name}_bs*.onnx"):
            old.unlink()
        state.with_suffix(".tmp").replace(state)
    return module


def export_case(model: ZooModel, module: Any, batch: int, cache: Path, torch) -> tuple[Any, Any, Path, dict]:
    """(`module` with one tensor output, its inputs at `batch`, the ONNX path, export facts). The
    export is kept in `cache` with the time it took."""
    from benchmarks.torch_export import export_onnx, single_output

    wrapped = single_output(module, tuple(s.name for s in model.inputs), torch)
    inputs = make_inputs(model, batch, torch)
    onnx_path = cache / f"{model.name}_bs{batch}.onnx"
    facts_path = onnx_path.with_suffix(".json")
    if onnx_path.exists() and facts_path.exists():
        return wrapped, inputs, onnx_path, dict(json.loads(facts_path.read_text()), export_cached=True)
    t0 = time.perf_counter()
    export_onnx(wrapped, inputs, onnx_path.with_suffix(".tmp"), torch)
    facts = {"export_s": round(time.perf_counter() - t0, 1), "torch_exported": torch.__version__}
    onnx_path.with_suffix(".tmp").replace(onnx_path)
    facts_path.write_text(json.dumps(facts))
    return wrapped, inputs, onnx_path, dict(facts, export_cached=False)


def exported(model: ZooModel, batch: int, cache: Path, torch) -> tuple[Any, Any, Path, dict]:
    """(the prepared fp32 torch module with one tensor output, its inputs at `batch`, the ONNX path,
    export facts): prepared_module, then export_case. Prepared weights and exports are kept in `cache`."""
    return export_case(model, prepared_module(model, cache, torch), batch, cache, torch)


def build_twice(path: Path, level: int, work: Path, first: str = "cold", target: str = "cuda") -> tuple[Any, dict]:
    """Build `path` for `target` fp16 first (POLYKIT_CACHE_DIR as the caller set it, a new timing
    cache) then warm (the kernels it compiled, its timing cache); the warm plan and the facts.
    `first` names the first build in the facts: "cold", or "kernels_warm" when its kernels were
    compiled beforehand (the prepare phase): build_{first}_s, {first}_compile_s, {first}_timing_s, ..."""
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig

    timing = work / "timing.json"
    t0 = time.perf_counter()
    with tuning_log() as said:
        cold = build_plan(str(path), BuilderConfig(target=target, fp16=True, builder_optimization_level=level,
                                                   save_timing_cache=timing))
    t1 = time.perf_counter()
    warm = build_plan(str(path), BuilderConfig(target=target, fp16=True, builder_optimization_level=level,
                                               load_timing_cache=timing))
    t2 = time.perf_counter()
    return warm, {f"build_{first}_s": round(t1 - t0, 1), "build_warm_s": round(t2 - t1, 1),
                  "warm_plan_identical": cold.serialize() == warm.serialize(), "layers": len(warm.layers),
                  **tuning_facts(said, first)}


#: the tuner's summary line (polykit.compiler.builder.tuner.Tuner.finish)
TUNING_LINE = re.compile(r"timed (\d+) tactics of (\d+) layers; compiling took ([\d.]+) s, timing ([\d.]+) s")


@contextlib.contextmanager
def tuning_log():
    """The messages the "polykit" logger says at INFO inside the block (the build's own log)."""
    said: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            said.append(record.getMessage())

    logger, handler = logging.getLogger("polykit"), Keep(logging.INFO)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield said
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def tuning_facts(said: Sequence[str], first: str = "cold") -> dict:
    """Where the first build's time went, from the tuner's summary line: tactics and layers timed,
    seconds compiling kernels and timing them (empty when nothing was timed), keys `first`_..."""
    for line in said:
        if m := TUNING_LINE.search(line):
            return {f"{first}_timed_tactics": int(m[1]), f"{first}_timed_layers": int(m[2]),
                    f"{first}_compile_s": float(m[3]), f"{first}_timing_s": float(m[4])}
    return {}


def errors(out, ref) -> dict:
    diff = (out.float() - ref).abs()
    scale = float(ref.abs().max())
    return {"max_abs_err": float(diff.max()), "max_rel_err": float(diff.max()) / scale if scale else float("nan"),
            "l2_rel_err": float(diff.norm() / ref.norm()) if float(ref.norm()) else float("nan"), "ref_max_abs": scale}


def top_kinds(summary, n: int = 3, plan=None, layers: int = 10) -> dict:
    """The `n` layer kinds and tactics of a polykit profile that take the most time, with shares, and
    its `layers` slowest layers ([name, kind, tactic, ms, share, output shape from `plan`]): where the
    next speed work on a model starts, without another device call to profile it."""
    def top(key):
        totals: dict[str, float] = {}
        for layer in summary.layers:
            totals[getattr(layer, key)] = totals.get(getattr(layer, key), 0.0) + layer.ms
        return [[k, round(ms, 4), round(ms / summary.total_ms, 3) if summary.total_ms else 0.0]
                for k, ms in sorted(totals.items(), key=lambda kv: -kv[1])[:n]]
    shapes = {lay.name: [list(s) for s in lay.out_shapes] for lay in getattr(plan, "layers", ())}
    slowest = [[x.name, x.kind, x.tactic, round(x.ms, 4), round(x.share, 3), shapes.get(x.name)]
               for x in summary.layers[:layers]]
    moving = [x for x in summary.layers if is_movement(x.tactic)]
    moved_ms = sum(x.ms for x in moving)
    return {"top_kinds": top("kind"), "top_tactics": top("tactic"), "top_layers": slowest,
            "profile_total_ms": round(summary.total_ms, 4), "movement_layers": len(moving),
            "movement_ms": round(moved_ms, 4),
            "movement_share": round(moved_ms / summary.total_ms, 4) if summary.total_ms else 0.0}


#: the tactics that only move or copy values (issue 30 asks them under 5 % of every zoo model's GPU time)
MOVEMENT_TACTICS = ("cuda.movement.", "cuda.gather")


def is_movement(tactic: str | None) -> bool:
    """A movement / copy / reformat / gather tactic (a view launches nothing and is charged 0 ms anyway)."""
    return bool(tactic) and tactic.startswith(MOVEMENT_TACTICS)


def torch_model(module, inputs: dict, torch, reference: bool = False) -> tuple:
    """(the module in fp16 on the GPU, the inputs on the GPU, their fp16 form[, the fp32 output
    with TF32 off when `reference`]): what eager and torch.compile run, in the measure phase and
    in the prepare phase's inductor warm-up alike."""
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    dev_inputs = {k: v.cuda() for k, v in inputs.items()}
    half_inputs = {k: v.half() if v.is_floating_point() else v for k, v in dev_inputs.items()}
    net = module.cuda()
    ref = None
    if reference:
        with torch.inference_mode():
            ref = net(*dev_inputs.values()).float()
    net = net.half()
    return (net, dev_inputs, half_inputs, ref) if reference else (net, dev_inputs, half_inputs)


def compile_runner(net, inputs: dict, torch, row: dict) -> Callable[[], Any] | None:
    """torch.compile(net, mode="reduce-overhead") compiled and its CUDA graphs recorded (the time
    it took in row["compile_first_s"]); None, with row["compile_error"], when torch cannot compile it."""
    try:
        compiled = torch.compile(net, mode="reduce-overhead")
        t0 = time.perf_counter()
        for _ in range(3):  # compile, then record its CUDA graphs
            compiled(*inputs.values())
        torch.cuda.synchronize()
    except Exception as exc:  # torch's failure, not polykit's: the row keeps polykit and eager
        traceback.print_exc()
        row["compile_error"] = f"{type(exc).__name__}: {exc}"[:500]
        return None
    row["compile_first_s"] = round(time.perf_counter() - t0, 1)
    return lambda: compiled(*inputs.values())


class Stages:
    """The child's stage clock: `start` ends the running stage and says the next; `take` ends the
    running one and hands over the seconds of those since the last take, by stage (a row's
    stage_s). `name` is the running (or last) stage as said, for an error row."""

    def __init__(self, label: str):
        self.label, self.name = label, ""
        self._key, self._t0 = "", 0.0
        self._seconds: dict[str, float] = {}

    def start(self, key: str, detail: str = "") -> None:
        self._stop()
        self._key, self.name, self._t0 = key, f"{key} ({detail})" if detail else key, time.perf_counter()
        say(f"{self.label}: {self.name}")

    def take(self) -> dict[str, float]:
        self._stop()
        taken, self._seconds = self._seconds, {}
        return taken

    def _stop(self) -> None:
        if self._key:
            self._seconds[self._key] = round(self._seconds.get(self._key, 0.0) + time.perf_counter() - self._t0, 2)
            self._key = ""


def open_model(model: ZooModel, args: argparse.Namespace, stages: Stages, facts: dict) -> tuple[Any, Any]:
    """The stages a child's cases share: setup (torch and the measuring code imported, the
    provenance into `facts`) and model (the prepared fp32 module built and its weights loaded,
    on the CPU). (torch, the module)."""
    stages.start("setup")
    os.environ.update(zoo_prepare.inductor_env(args.cache_dir))  # before torch reads inductor's config
    import torch

    import benchmarks.cuda_timing  # noqa: F401  (the first case's setup holds their import time)
    import polykit.tools.bench.benchmark  # noqa: F401

    facts.update(provenance.meta(torch))
    stages.start("model")
    return torch, prepared_module(model, Path(args.cache_dir), torch)


def release(torch) -> None:
    """Leave nothing of one case to the next in this process: torch.compile's compiled code,
    guards and automatic-dynamic memory (torch.compiler.reset, i.e. torch._dynamo.reset: without
    it the next batch's graph would be compiled with a dynamic batch dimension), its CUDA graphs
    and their memory pool (reset's cudagraph-tree reset), then torch's cached GPU memory."""
    gc.collect()
    if "torch._dynamo" in sys.modules:  # else nothing was compiled (--skip-compile), and it need not be imported
        torch.compiler.reset()
        gc.collect()
    torch.cuda.empty_cache()


def measure(model: ZooModel, base: Any, batch: int, args: argparse.Namespace, row: dict, torch, stages: Stages,
            keep: bool = False, prepared: Sequence[str] = ()) -> None:
    """Fill `row` with one case's facts, stage by stage (`stages` times them and names the one
    running), from the prepared fp32 module `base`. The torch stage moves the module it gets to the
    GPU in fp16, so with `keep` it gets a copy and `base` stays as built for the next case.
    `prepared`: what the prepare phase did for the case ("kernels": the first build is
    kernels_warm, not cold)."""
    from benchmarks.cuda_timing import bind_plan, time_cuda
    from polykit.tools.bench.benchmark import profile_engine

    stages.start("export")
    module = copy.deepcopy(base) if keep else base
    module, inputs, path, facts = export_case(model, module, batch, Path(args.cache_dir), torch)
    row.update(facts, onnx_mb=round(path.stat().st_size / 2**20, 1))
    stages.start("build")
    with tempfile.TemporaryDirectory() as work:
        if args.kernel_cache == "fresh":
            os.environ["POLYKIT_CACHE_DIR"] = str(Path(work) / "polykit")
        else:
            os.environ["POLYKIT_CACHE_DIR"] = str(zoo_prepare.kernel_cache(args.cache_dir))
        first = "kernels_warm" if "kernels" in prepared else "cold"
        plan, build = build_twice(path, args.level, Path(work), first)
        row.update(build, kernel_cache=args.kernel_cache)
        stages.start("torch")
        net, dev_inputs, half_inputs, ref = torch_model(module, inputs, torch, reference=True)
        with torch.inference_mode():
            runners = {"eager": lambda: net(*half_inputs.values())}
            row["eager_fp16_max_rel_err"] = errors(runners["eager"](), ref)["max_rel_err"]
            if not args.skip_compile:
                stages.start("torch.compile")
                compiled = compile_runner(net, half_inputs, torch, row)
                if compiled is not None:
                    runners["compile"] = compiled
            stages.start("polykit")
            bound = bind_plan(plan, dev_inputs, torch, in_place=args.io == "in-place", pdl=args.pdl == "on")
            row["io"], row["pdl"] = args.io, args.pdl
            bound.run()
            torch.cuda.synchronize()
            row.update(errors(bound.out, ref))
            runners = {"polykit": bound.run, **runners}
            with_pdl = None
            if args.pdl == "both":  # the same plan loaded again, launching with PDL: a runner of its own
                with_pdl = bind_plan(plan, dev_inputs, torch, in_place=args.io == "in-place", pdl=True)
                with_pdl.run()
                torch.cuda.synchronize()
                row["pdl_identical"] = bool(torch.equal(with_pdl.out, bound.out))
                runners = {"polykit": bound.run, "polykit_pdl": with_pdl.run, **runners}
            stages.start("timing", f"{args.rounds} alternating rounds")
            samples: dict[str, list[float]] = {k: [] for k in runners}
            for _ in range(args.rounds):
                for name, run in runners.items():
                    samples[name].append(time_cuda(run, torch, args.warmup, args.iters))
        for name, times in samples.items():
            row[f"{name}_ms"] = round(statistics.median(times), 4)
            row[f"{name}_spread_ms"] = round(max(times) - min(times), 4)
        row["speed_vs_eager"] = round(row["eager_ms"] / row["polykit_ms"], 3)
        if "polykit_pdl_ms" in row:
            row["pdl_speedup"] = round(row["polykit_ms"] / row["polykit_pdl_ms"], 3)
        if "compile_ms" in row:
            row["speed_vs_compile"] = round(row["compile_ms"] / row["polykit_ms"], 3)
        if args.profile_runs:
            stages.start("profile")
            feeds = {n: bound.bindings[n].cpu().numpy() for n in plan.inputs}
            row.update(top_kinds(profile_engine(bound.engine, feeds, args.profile_runs), plan=plan))
        bound.close()
        if with_pdl is not None:
            with_pdl.close()


def case_row(model: ZooModel, batch: int, args: argparse.Namespace) -> dict[str, Any]:
    """What a case's row says before it is measured."""
    return {"model": model.name, "family": model.family, "batch": batch, "precision": "fp16",
            "inputs": {s.name: [batch, *s.shape] for s in model.inputs}, "level": args.level,
            "rounds": args.rounds, "iters": args.iters, "warmup": args.warmup}


def append_row(path: str | Path, row: dict) -> None:
    """One JSON line in --row-out (the parent takes a line once its newline is written)."""
    with open(path, "a") as fh:
        fh.write(json.dumps(row) + "\n")


def measure_model(args: argparse.Namespace) -> None:
    """The child's work: the cases of --case (one model, NAME:B1,B2,...) in turn, each case's row
    appended to --row-out as it finishes, whatever happens to it. The shared stages run once (a
    failure there is every case's error row); a failed case stops the child, whose CUDA context
    may be poisoned (the parent measures the model's other cases in a fresh one); so does a
    case that --deadline leaves less than MIN_CASE_S. Between cases, release()."""
    name, _, words = args.case.rpartition(":")
    model, batches = BY_NAME[name], [int(w) for w in words.split(",")]
    prepared = {int(b): parts for b, parts in json.loads(args.prepared or "{}").items()}
    stages, facts = Stages(model.name), {}
    try:
        torch, base = open_model(model, args, stages, facts)
    except Exception as exc:  # every case needed what failed
        traceback.print_exc()
        error, shared = f"{stages.name}: {type(exc).__name__}: {exc}"[:800], stages.take()
        for i, batch in enumerate(batches):
            append_row(args.row_out, {**case_row(model, batch, args), **facts, "error": error,
                                      "stage_s": shared if i == 0 else {}})
        return
    for i, batch in enumerate(batches):
        if i and time_left(args) < MIN_CASE_S:
            say(f"deadline: {model.name} bs{', bs'.join(map(str, batches[i:]))} not started")
            return
        row = {**case_row(model, batch, args), **facts}
        stages.label = f"{model.name} bs{batch}"
        try:
            if i:
                stages.start("reset")
                release(torch)
            measure(model, base, batch, args, row, torch, stages, keep=i + 1 < len(batches),
                    prepared=prepared.get(batch, ()))
        except Exception as exc:  # recorded: one failing case must not stop the zoo
            traceback.print_exc()
            row["error"] = f"{stages.name}: {type(exc).__name__}: {exc}"[:800]
        row["stage_s"] = stages.take()
        append_row(args.row_out, row)
        if "error" in row:
            return


def run_case(args: argparse.Namespace) -> None:
    """The child process: measure_model, then out without interpreter teardown (torch.compile's
    workers and the CUDA state go with the process)."""
    measure_model(args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.render:
        render_files(args.render, args.into)
    elif args.case:
        run_case(args)
    else:
        run_all(args, argv)


if __name__ == "__main__":
    main()

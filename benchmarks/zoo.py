"""The speed yardstick: polykit's cuda engine against torch eager and torch.compile on a zoo of
convolutional and transformer architectures (benchmarks/zoo_models.py), random weights.

Run on a GPU machine with torch, torchvision, timm and transformers (no network needed):

    PYTHONPATH=. python3 benchmarks/zoo.py [--family conv|transformer|all] [--models a,b] [--batches 1,max]
        [--out zoo.json] [--resume zoo.json] [--cache-dir .zoo_cache] [--deadline 540] [--skip-compile]
        [--kernel-cache shared --prepare-workers 8 [--prepare-only]] [--load-caches T] [--save-caches T]
    python3 benchmarks/zoo.py --render zoo.json [more.json ...] [--into docs/ZOO.md]

Each case (model, batch) runs in its own process, so a crash or a poisoned CUDA context costs one
row: the torch model (seed 0, zoo_models.prepare) is exported to ONNX once per batch and kept in
--cache-dir with its export time; polykit builds it for --target cuda in fp16 twice, cold (a fresh
POLYKIT_CACHE_DIR: no compiled kernels, no timing cache) then warm (same kernel cache, the first
build's timing cache); torch runs eager under inference_mode with model.half() and as
torch.compile(mode="reduce-overhead") in the same process; polykit runs through
ExecutionContext.enqueue on torch tensors bound in place with set_tensor_address (CUDA-graph
replay; --io copies passes them to enqueue, copied through the arena). The three are timed in
alternating --rounds (CUDA events, median of --iters after --warmup runs each), the reported time
the median of the rounds. Accuracy: polykit's fp16 output against torch fp32 eager (TF32 off) on
the same input (max abs error, max abs error / max |ref|, L2 relative), and torch's own fp16 error
beside it. Then polykit's per-layer profile (polykit.tools.bench.benchmark.profile_engine) gives the
layer kinds and tactics that take the time. Every finished case is written to --out at once;
--resume skips the cases a results file holds; --deadline stops starting cases (and cuts the
running one, which --resume then retries) so that a time-limited call keeps what it finished.
Cases run in --order informative (the cases the issue tables of #29/#30 name first, then the rest).

With --prepare-workers N (and --kernel-cache shared) a prepare phase runs first
(benchmarks/zoo_prepare.py): N worker processes export, compile polykit's candidate kernels without
timing them, and warm torch.compile's on-disk caches for the pending cases the deadline can reach;
then the measure phase runs the cases one at a time as above. Rows say what was prepared
(`prepared`, `prepare_s`), and a first build whose kernels were prepared is `build_kernels_warm_s`
(with `kernels_warm_compile_s`, `kernels_warm_timing_s`), never `build_cold_s`. --deadline covers both
phases; --prepare-only stops after the first.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
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
from typing import Any, Callable, Iterable, Sequence

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # `python3 benchmarks/zoo.py` as well as `python3 -m benchmarks.zoo`
    sys.path.insert(0, str(REPO))

from benchmarks import provenance, zoo_prepare  # noqa: E402
from benchmarks.zoo_models import BY_NAME, FAMILIES, MODELS, ZooModel, make_inputs, prepare  # noqa: E402
from benchmarks.zoo_report import load_results, render_files  # noqa: E402

START = time.monotonic()
FORMAT = 1  # the results file's version
MIN_CASE_S = 30  # a case is not started with less time than this before --deadline


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
    p.add_argument("--out", default="zoo.json", help="results file, rewritten after every case")
    p.add_argument("--resume", metavar="RESULTS", help="skip the cases this results file holds (errors are retried)")
    p.add_argument("--cache-dir", default=".zoo_cache", help="ONNX exports and prepared weights, kept across runs")
    p.add_argument("--case-timeout", type=float, default=420, help="seconds one case may take before it is killed")
    p.add_argument("--deadline", type=float, default=0, help="seconds this run may take (0: no limit)")
    p.add_argument("--order", choices=["informative", "table"], default="informative",
                   help="informative: the cases the issues' tables name first (INFORMATIVE); table: table order")
    p.add_argument("--prepare-workers", type=int, default=0, metavar="N",
                   help="first prepare the pending cases in N parallel processes (exports, polykit kernels, "
                        "inductor caches; needs --kernel-cache shared), then measure")
    p.add_argument("--prepare-only", action="store_true", help="stop after the prepare phase")
    p.add_argument("--load-caches", metavar="TARBALL", help="first extract a --save-caches tarball into --cache-dir")
    p.add_argument("--save-caches", metavar="TARBALL",
                   help="at the end, write --cache-dir's kernel and inductor caches and prepare records (not the "
                        "exports) into this tarball")
    p.add_argument("--case", help=argparse.SUPPRESS)  # NAME:BATCH, run by the parent in a child process
    p.add_argument("--row-out", help=argparse.SUPPRESS)
    p.add_argument("--prepared", default="", help=argparse.SUPPRESS)  # what the prepare phase did for --case
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
    """`cases` in the order they run: informative puts the INFORMATIVE models' throughput batches
    first, then their batch 1, then the other models' throughput batches, then their batch 1
    (table order within each); table keeps them as they are."""
    if order == "table":
        return list(cases)

    def key(i: int) -> tuple[int, int, int]:
        model, batch = cases[i]
        named = model.name in INFORMATIVE
        return (0 if named else 2) + (batch != max(model.batches)), INFORMATIVE.index(model.name) if named else 0, i
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


# ---- the parent: one child process per case ----------------------------------------------------

def child_command(args: argparse.Namespace, model: ZooModel, batch: int, row_out: str,
                  prepared: Sequence[str] = ()) -> list[str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--case", f"{model.name}:{batch}", "--row-out", row_out,
           "--rounds", str(args.rounds), "--iters", str(args.iters), "--warmup", str(args.warmup),
           "--level", str(args.level), "--io", args.io, "--kernel-cache", args.kernel_cache, "--profile-runs", str(args.profile_runs),
           "--cache-dir", str(Path(args.cache_dir).resolve())]
    return cmd + (["--skip-compile"] if args.skip_compile else []) + (["--prepared", ",".join(prepared)] if prepared else [])


def run_child(cmd: list[str], timeout: float) -> int | None:
    """Run `cmd` in its own process group; its exit code, or None when it ran past `timeout`
    (then the whole group, torch.compile's workers included, is killed)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    child = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        return child.wait(timeout=max(timeout, 1))
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        return None


def time_left(args: argparse.Namespace) -> float:
    """Seconds before --deadline (inf without one), counted from this process's start."""
    return args.deadline - (time.monotonic() - START) if args.deadline else float("inf")


def run_all(args: argparse.Namespace, argv: Sequence[str] | None = None) -> list[dict]:
    """Prepare (--prepare-workers) then run the pending cases one child process each, rewriting
    --out after every case; the rows. `argv` (default sys.argv[1:]) is recorded as the command in
    the results file's settings."""
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
    """The measure phase: each case of `todo` in a child process, one at a time."""
    for i, (model, batch) in enumerate(todo):
        left = time_left(args)
        if left < MIN_CASE_S:
            say(f"deadline: {len(todo) - i} cases not started; rerun with --resume {args.out}")
            break
        say(f"case {i + 1}/{len(todo)}: {model.name} bs{batch}")
        record = zoo_prepare.read_record(args.cache_dir, model.name, batch, args.level) if args.prepare_workers else {}
        with tempfile.TemporaryDirectory() as tmp:
            row_file = Path(tmp) / "row.json"
            t0 = time.monotonic()
            cmd = child_command(args, model, batch, str(row_file), record.get("prepared", ()))
            code = run_child(cmd, min(args.case_timeout, left))
            if code is None and left < args.case_timeout:
                say(f"{model.name} bs{batch}: cut at the deadline, not recorded; rerun with --resume {args.out}")
                break
            if row_file.exists():
                row = json.loads(row_file.read_text())
            else:
                why = f"timed out after {args.case_timeout:.0f} s" if code is None else f"the case process exited {code}"
                row = {"model": model.name, "family": model.family, "batch": batch, "error": why}
            row["case_s"] = round(time.monotonic() - t0, 1)
            if args.prepare_workers:  # what the prepare phase did for this case (nothing: [])
                row.update(prepared=record.get("prepared", []), prepare_s=record.get("prepare_s", {}))
        rows = merge(rows, row)
        write_results(args.out, rows, settings)
        say(summary(row))
    return rows


def summary(row: dict) -> str:
    head = f"{row['model']} bs{row['batch']} ({row.get('case_s', '?')} s)"
    if "error" in row:
        return f"{head}: ERROR {row['error'][:300]}"
    compile_part = f", compile {row['compile_ms']:.3f} ms ({row['speed_vs_compile']:.2f}x)" if row.get("compile_ms") else ""
    return (f"{head}: polykit {row['polykit_ms']:.3f} ms, eager {row['eager_ms']:.3f} ms "
            f"({row['speed_vs_eager']:.2f}x){compile_part}, max rel err {row['max_rel_err']:.1e}")


# ---- the child: one case -----------------------------------------------------------------------

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


def exported(model: ZooModel, batch: int, cache: Path, torch) -> tuple[Any, Any, Path, dict]:
    """(the prepared fp32 torch module with one tensor output, its inputs at `batch`, the ONNX path,
    export facts). Prepared weights and exports are kept in `cache`; new weights drop the exports."""
    from benchmarks.torch_export import export_onnx, single_output

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


def build_twice(path: Path, level: int, work: Path, first: str = "cold") -> tuple[Any, dict]:
    """Build `path` for cuda fp16 first (POLYKIT_CACHE_DIR as the caller set it, a new timing cache)
    then warm (the kernels it compiled, its timing cache); the warm plan and the facts. `first`
    names the first build in the facts: "cold", or "kernels_warm" when its kernels were compiled
    beforehand (the prepare phase): build_{first}_s, {first}_compile_s, {first}_timing_s, ..."""
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig

    timing = work / "timing.json"
    t0 = time.perf_counter()
    with tuning_log() as said:
        cold = build_plan(str(path), BuilderConfig(target="cuda", fp16=True, builder_optimization_level=level,
                                                   save_timing_cache=timing))
    t1 = time.perf_counter()
    warm = build_plan(str(path), BuilderConfig(target="cuda", fp16=True, builder_optimization_level=level,
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
    return {"top_kinds": top("kind"), "top_tactics": top("tactic"), "top_layers": slowest,
            "profile_total_ms": round(summary.total_ms, 4)}


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


def measure(model: ZooModel, batch: int, args: argparse.Namespace, row: dict) -> None:
    """Fill `row` with the case's facts, stage by stage (row["stage"] names the one running)."""
    def stage(name: str) -> None:
        row["stage"] = name
        say(f"{model.name} bs{batch}: {name}")

    stage("setup")
    os.environ.update(zoo_prepare.inductor_env(args.cache_dir))  # before torch reads inductor's config
    import torch

    from benchmarks.cuda_timing import bind_plan, time_cuda
    from polykit.tools.bench.benchmark import profile_engine

    row.update(provenance.meta(torch))

    stage("export")
    module, inputs, path, facts = exported(model, batch, Path(args.cache_dir), torch)
    row.update(facts, onnx_mb=round(path.stat().st_size / 2**20, 1))
    stage("build")
    with tempfile.TemporaryDirectory() as work:
        if args.kernel_cache == "fresh":
            os.environ["POLYKIT_CACHE_DIR"] = str(Path(work) / "polykit")
        else:
            os.environ["POLYKIT_CACHE_DIR"] = str(zoo_prepare.kernel_cache(args.cache_dir))
        first = "kernels_warm" if "kernels" in args.prepared.split(",") else "cold"
        plan, build = build_twice(path, args.level, Path(work), first)
        row.update(build, kernel_cache=args.kernel_cache)
        stage("torch")
        net, dev_inputs, half_inputs, ref = torch_model(module, inputs, torch, reference=True)
        with torch.inference_mode():
            runners = {"eager": lambda: net(*half_inputs.values())}
            row["eager_fp16_max_rel_err"] = errors(runners["eager"](), ref)["max_rel_err"]
            if not args.skip_compile:
                stage("torch.compile")
                compiled = compile_runner(net, half_inputs, torch, row)
                if compiled is not None:
                    runners["compile"] = compiled
            stage("polykit")
            bound = bind_plan(plan, dev_inputs, torch, in_place=args.io == "in-place")
            row["io"] = args.io
            bound.run()
            torch.cuda.synchronize()
            row.update(errors(bound.out, ref))
            runners = {"polykit": bound.run, **runners}
            stage(f"timing ({args.rounds} alternating rounds)")
            samples: dict[str, list[float]] = {k: [] for k in runners}
            for _ in range(args.rounds):
                for name, run in runners.items():
                    samples[name].append(time_cuda(run, torch, args.warmup, args.iters))
        for name, times in samples.items():
            row[f"{name}_ms"] = round(statistics.median(times), 4)
            row[f"{name}_spread_ms"] = round(max(times) - min(times), 4)
        row["speed_vs_eager"] = round(row["eager_ms"] / row["polykit_ms"], 3)
        if "compile_ms" in row:
            row["speed_vs_compile"] = round(row["compile_ms"] / row["polykit_ms"], 3)
        if args.profile_runs:
            stage("profile")
            feeds = {n: bound.bindings[n].cpu().numpy() for n in plan.inputs}
            row.update(top_kinds(profile_engine(bound.engine, feeds, args.profile_runs), plan=plan))
        bound.close()
    del row["stage"]


def run_case(args: argparse.Namespace) -> None:
    """The child's work: one case, its row written to --row-out whatever happens."""
    name, batch = args.case.rsplit(":", 1)
    model, batch = BY_NAME[name], int(batch)
    row: dict[str, Any] = {"model": model.name, "family": model.family, "batch": batch, "precision": "fp16",
                           "inputs": {s.name: [batch, *s.shape] for s in model.inputs}, "level": args.level,
                           "rounds": args.rounds, "iters": args.iters, "warmup": args.warmup}
    try:
        measure(model, batch, args, row)
    except Exception as exc:  # recorded: one failing model must not stop the zoo
        traceback.print_exc()
        row["error"] = f"{row.pop('stage', '?')}: {type(exc).__name__}: {exc}"[:800]
    Path(args.row_out).write_text(json.dumps(row))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no interpreter teardown: torch.compile's workers and CUDA state go with the process


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

"""Structure-aware fuzzing of the files polykit reads: plans, ONNX models, saved data,
INT8 calibration caches, timing caches, tactic replays, ONNX external data.

    python -m polykit.testing.fuzz --cases 1000            # per file type; --kind plan|onnx|data|calibration|...
    python -m polykit.testing.fuzz --cases 200 --json      # a machine-readable report

A case takes a valid file from a small corpus built here, changes it field by field
(polykit.testing.mutate) -- a plan's JSON metadata with its lengths and checksum
recomputed, an ONNX protobuf field, a member or header of an .npz, a value of a JSON data
file, a line of a calibration cache, a value or number of a timing cache or tactic
replay, an external data entry of a model or its data file (fuzz_builder_files) -- and gives it to polykit the way a user would: a plan is loaded (its schema check)
and run on the cpu target (a cuda plan: its kernel sources rendered); a model is imported,
built, its plan round-tripped through the loader, and run; a data file is loaded, then
compared and fed to an engine; a calibration cache builds the INT8 plan it is read for, a
timing cache or replay the plan it is read for, a model with external data is imported, built
and run. The outcome must be success or a PolykitError. Anything
else is a crash, a case that runs past `timeout` seconds a hang, and a plan the builder
wrote that the loader then rejects a self-check failure. The process runs under a memory
limit (RLIMIT_AS) so that a mutated shape of 2**40 fails fast instead of swapping.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from polykit.errors import PlanError, PolykitError
from polykit.testing.fuzz_builder_files import builder_file_corpus, mutate_external, mutate_json_file
from polykit.testing.fuzz_calibration import calibration_corpus, mutate_calibration
from polykit.testing.fuzz_corpus import DataFile, data_corpus, mutate_data, plan_corpus, seed_models
from polykit.testing.mutate import pick, mutate_bytes, mutate_json, mutate_proto

KINDS = ("plan", "onnx", "data", "calibration", "timing-cache", "replay", "external")
#: outcomes that fail a fuzz run
FAILURES = ("crash", "hang", "self-check")


@dataclass(frozen=True)
class CaseResult:
    kind: str
    index: int
    source: str  # the corpus file the case mutated
    mutation: str
    outcome: str  # ok | error | crash | hang | self-check
    detail: str = ""


@dataclass
class FuzzReport:
    seed: int
    cases_per_kind: int
    results: list[CaseResult] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    def counts(self) -> dict[str, dict[str, int]]:
        out: dict[str, Counter] = {}
        for r in self.results:
            out.setdefault(r.kind, Counter())[r.outcome] += 1
        return {kind: dict(sorted(c.items())) for kind, c in out.items()}

    def failures(self) -> list[CaseResult]:
        return [r for r in self.results if r.outcome in FAILURES]

    def to_json(self) -> dict[str, Any]:
        return {"seed": self.seed, "cases_per_kind": self.cases_per_kind, "counts": self.counts(),
                "seconds": self.seconds, "failures": [asdict(r) for r in self.failures()]}


class _Timeout(BaseException):
    """Raised by the alarm in a case that runs too long (a BaseException: no handler swallows it)."""


class _SelfCheck(Exception):
    """The loader rejected a plan the builder wrote."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise _Timeout()


def run_case(action: Callable[[], None], timeout: float) -> tuple[str, str]:
    """(outcome, detail) of one case."""
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            action()
        return "ok", ""
    except _Timeout:
        return "hang", f"ran past {timeout} s"
    except _SelfCheck as exc:
        return "self-check", str(exc)
    except PolykitError as exc:
        return "error", f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    except Exception as exc:  # the fuzzer's point: any other exception is a finding
        frames = traceback.extract_tb(exc.__traceback__)
        where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?"
        return "crash", f"{type(exc).__name__}: {str(exc)[:200]} (at {where})"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


# ---- what a case does with the mutated file ------------------------------------------------------
def _run_plan_bytes(data: bytes) -> None:
    from polykit.compiler.plan.file import Plan

    plan = Plan.deserialize(data, where="fuzz.plan")
    if plan.target == "cpu":
        _execute(plan)
        return
    from polykit.runtime.cuda.target import plan_kernels
    from polykit.runtime.tactic_check import check_tactics

    check_tactics(plan, where="fuzz.plan")  # what an Engine checks before the cuda target sees the plan

    for layer in plan.layers:
        for kernel in plan_kernels(plan, layer):
            kernel.render()


def _execute(plan: Any) -> None:
    from polykit.runtime.engine import Engine
    from polykit.tools.data.loaders import DataLoader, DataLoaderOptions

    with Engine(plan) as engine, engine.create_execution_context() as ctx:
        for feed in DataLoader(DataLoaderOptions(seed=0), engine.input_metadata):
            ctx.execute(feed)


def _run_model_bytes(data: bytes, workdir: Path) -> None:
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.compiler.plan.file import Plan

    path = workdir / "fuzz.onnx"
    path.write_bytes(data)
    written = build_plan(str(path), BuilderConfig(target="cpu")).serialize()
    try:
        plan = Plan.deserialize(written, where="built plan")
    except PlanError as exc:
        raise _SelfCheck(f"the loader rejects the plan the builder wrote: {str(exc).splitlines()[0]}") from exc
    _execute(plan)


def _run_data_file(file: DataFile, data: bytes, workdir: Path, engine_plan: Any) -> None:
    from polykit.runtime.engine import Engine
    from polykit.tools.compare.comparator import Comparator, RunResults
    from polykit.tools.compare.funcs import CompareOptions, builtin_compare_funcs
    from polykit.tools.report.comparison import render_text, to_json
    from polykit.tools.data.results_io import load_feeds, load_outputs

    path = workdir / f"fuzz{file.suffix}"
    path.write_bytes(data)
    runs = load_outputs(path) if file.role == "outputs" else {"feeds": load_feeds(path)}
    results = RunResults()
    for name, iterations in runs.items():
        results.add(name, iterations)
        results.add(f"{name}-again", [{k: np.array(v, copy=True) for k, v in it.items()} for it in iterations])
    for spec in builtin_compare_funcs():
        report = Comparator.compare_accuracy(results, spec.factory(CompareOptions()), validate=True)
        render_text(report, results)
        json.dumps(to_json(report, results))
    if file.role == "feeds":
        with Engine(engine_plan).create_execution_context() as ctx:
            for feed in runs["feeds"]:
                ctx.execute(feed)


def _run_calibration_cache(data: bytes, workdir: Path, model: Any) -> None:
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig

    path = workdir / "fuzz.cache"
    path.write_bytes(data)
    _execute(build_plan(model, BuilderConfig(target="cpu", int8=True, calibration_cache=str(path))))


def _run_builder_file(kind: str, data: bytes, workdir: Path, model: Any) -> None:
    """Build (and run) the MLP reading a timing cache or a tactic replay."""
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig

    path = workdir / ("fuzz.cache" if kind == "timing-cache" else "fuzz.replay.json")
    path.write_bytes(data)
    option = {"load_timing_cache": str(path)} if kind == "timing-cache" else {"tactic_replay": str(path)}
    _execute(build_plan(model, BuilderConfig(target="cpu", builder_optimization_level=5, **option)))


def _run_external(files: tuple[bytes, bytes], workdir: Path) -> None:
    folder = workdir / "external"
    folder.mkdir(exist_ok=True)
    (folder / "weights.bin").write_bytes(files[1])
    _run_model_bytes(files[0], folder)


def cap_address_space(gigabytes: float) -> None:
    """Limit this process's address space (RLIMIT_AS) to `gigabytes` (0: leave it)."""
    if gigabytes > 0:
        import resource

        limit = int(gigabytes * (1 << 30))
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))


# ---- the run -------------------------------------------------------------------------------------
def fuzz(cases: int, kinds: tuple[str, ...] = KINDS, seed: int = 0, timeout: float = 20.0,
         progress: Callable[[str], None] | None = None) -> FuzzReport:
    """Run `cases` cases of each kind; deterministic for a seed."""
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig

    report = FuzzReport(seed, cases)
    models = seed_models()
    old_handler = signal.signal(signal.SIGALRM, _on_alarm)
    try:
        with tempfile.TemporaryDirectory(prefix="polykit-fuzz-") as tmp:
            workdir = Path(tmp)
            mlp_plan = build_plan(models["mlp"], BuilderConfig(target="cpu"))
            corpora: dict[str, list[tuple[str, Any]]] = {
                "plan": plan_corpus(models),
                "onnx": [(name, m.SerializeToString()) for name, m in models.items()],
                "data": data_corpus(workdir, mlp_plan),
                "calibration": calibration_corpus(),
                **builder_file_corpus(models),
            }
            for kind in kinds:
                rng = np.random.default_rng([seed, KINDS.index(kind)])
                start = time.perf_counter()
                for index in range(cases):
                    source, original = corpora[kind][index % len(corpora[kind])]
                    data, mutation = _mutate(kind, original, rng)
                    action = {
                        "plan": lambda: _run_plan_bytes(data),
                        "onnx": lambda: _run_model_bytes(data, workdir),
                        "data": lambda: _run_data_file(original, data, workdir, mlp_plan),
                        "calibration": lambda: _run_calibration_cache(data, workdir, models["mlp"]),
                        "timing-cache": lambda: _run_builder_file(kind, data, workdir, models["mlp"]),
                        "replay": lambda: _run_builder_file(kind, data, workdir, models["mlp"]),
                        "external": lambda: _run_external(data, workdir),
                    }[kind]
                    outcome, detail = run_case(action, timeout)
                    report.results.append(CaseResult(kind, index, source, mutation, outcome, detail))
                    if progress and outcome in FAILURES:
                        progress(f"{kind} case {index} ({source}; {mutation}): {outcome}: {detail}")
                report.seconds[kind] = round(time.perf_counter() - start, 2)
    finally:
        signal.signal(signal.SIGALRM, old_handler)
    return report


def _mutate(kind: str, original: Any, rng: np.random.Generator) -> tuple[bytes, str]:
    """One to three mutations of a corpus entry, as the bytes of the file."""
    steps = int(rng.integers(1, 4))
    if kind == "plan":
        from polykit.compiler.plan.file import decode_plan, encode_plan

        header, doc, blob = decode_plan(original)
        blob, notes = bytes(blob), []
        # half the cases change only what a layer computes (attributes, tactic parameters), so
        # they get past the structural checks and exercise shape rules and kernels
        focus = pick(rng, ("['attrs'][", "['shape'][", "['metadata'][")) if rng.random() < 0.5 else ""
        for _ in range(steps):
            doc, note = mutate_json(doc, rng, focus)
            notes.append(note)
        data = encode_plan(doc, blob, header["target"], header["gpu_arch"])
        if rng.random() < 0.05:  # now and then a damaged file too: the checksum's job
            data, note = mutate_bytes(data, rng)
            notes.append(note)
        return data, "; ".join(notes)
    if kind == "onnx":
        import onnx

        if rng.random() < 0.1:
            return mutate_bytes(original, rng)
        model = onnx.load_model_from_string(original)
        notes = []
        for _ in range(steps):
            model, note = mutate_proto(model, rng)
            notes.append(note)
        return model.SerializeToString(), "; ".join(notes)
    if kind == "calibration":
        return mutate_calibration(original, rng, steps)
    if kind in ("timing-cache", "replay"):
        return mutate_json_file(original, rng, steps)
    if kind == "external":
        return mutate_external(original, rng, steps)
    return mutate_data(original, rng, steps)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m polykit.testing.fuzz", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=100, help="cases per file type")
    parser.add_argument("--kind", action="append", choices=KINDS, help="file types to fuzz (default: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds a case may take before it is a hang")
    parser.add_argument("--max-memory-gb", type=float, default=4.0, help="address-space limit of this process")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    cap_address_space(args.max_memory_gb)
    report = fuzz(args.cases, tuple(args.kind or KINDS), args.seed, args.timeout,
                  progress=None if args.json else lambda line: print(line, file=sys.stderr))
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        for kind, counts in report.counts().items():
            print(f"{kind}: {sum(counts.values())} cases in {report.seconds[kind]} s: "
                  + ", ".join(f"{n} {outcome}" for outcome, n in counts.items()))
    return 1 if report.failures() else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

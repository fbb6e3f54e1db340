"""`dynamic_vs_static.py time`: the dynamic plan at its opt shape against the static plan of that
shape, timed (issue 33, Acceptance: <= 1.05x on BERT-base bs8 and three zoo convnets).

Per model of dynamic_vs_static.PROFILES (an export of its `export` step) it builds the static plan at
the opt shapes, then the dynamic plan for the profile, on one target (cuda: fp16; cpu: fp32) at one
builder level (--level, 3 by default: tactics timed on the device; each build with a timing cache of
its own, or with --timing-cache shared the dynamic build starting from the static build's, so that
only what the profile changes can change a choice); checks both against onnxruntime at opt (the
first output's max abs and relative error); then times both at opt in --rounds alternating rounds
in one process, so drift falls on both alike: on cuda one run is one ExecutionContext.enqueue on
torch tensors bound in place (CUDA-graph replay, as benchmarks/zoo.py; cuda_timing.time_cuda: the
median CUDA-event time of --iters runs after --warmup), on cpu one execute (host time,
dynamic_bert.time_host); the median of the rounds is reported, with their spread. Then the why of a
ratio: what differs between the two plans (dynamic_vs_static.layer_diff: layers only one plan has,
other tactics, other kernels, tactics the profile excludes) and, with --profile-runs N, both plans'
per-layer profiles (polykit.tools.bench.benchmark.profile_engine, eager launches, median of N) and
the layers whose times differ most. Writes OUT.json and OUT.md (a table, then the why per model).

    # a GPU machine with torch: the exports on its CPU, then the timing
    python3 benchmarks/dynamic_vs_static.py export --dir /tmp/dvs
    PYTHONPATH=. python3 benchmarks/dynamic_vs_static.py time --dir /tmp/dvs --out dvs_time
    # the same steps on the cpu target (no GPU, no torch for this step)
    PYTHONPATH=. python benchmarks/dynamic_vs_static.py time --dir /tmp/dvs --target cpu --level 0 --out dvs_time
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from benchmarks import provenance
from benchmarks.cuda_timing import time_cuda
from benchmarks.dynamic_bert import Runner, alternate, reference, time_host
from benchmarks.dynamic_exports import write_report
from benchmarks.dynamic_vs_static import build, layer_diff, model_of, ranges_of, twins

#: the ratio issue 33 accepts
BAR = 1.05


@dataclass(frozen=True)
class Rounds:
    """How each plan is timed: `rounds` alternating rounds of `iters` runs after `warmup`; per-layer
    profiles of `profile_runs` runs (0: none); `timing_cache` "separate" or "shared"."""

    rounds: int = 7
    warmup: int = 20
    iters: int = 100
    profile_runs: int = 3
    timing_cache: str = "separate"


def opt_feeds(name: str, seed: int = 1) -> dict[str, np.ndarray]:
    """Inputs of PROFILES[name] at its opt shapes, of the zoo model's kinds (token ids below the
    vocabulary, a mask of ones, images N(0, 1)): dynamic_exports.random_inputs."""
    from benchmarks.dynamic_exports import random_inputs
    from benchmarks.zoo_models import BY_NAME

    ranges = ranges_of(name)
    spec = {i.name: {"kind": i.kind, "high": i.high, "shapes": [list(s) for s in ranges[i.name]]}
            for i in BY_NAME[model_of(name)].inputs}
    return random_inputs(spec, 1, seed)


def errors(got: np.ndarray, want: np.ndarray) -> dict[str, float]:
    diff = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))))
    scale = float(np.max(np.abs(want)))
    return {"max_abs_err": diff, "max_rel_err": diff / scale if scale else float("nan")}


def profile_diff(runners: Mapping[str, Runner], pairs: Mapping[str, Any], feeds: Mapping[str, np.ndarray],
                 runs: int, top: int = 8) -> dict[str, Any]:
    """Both plans' per-layer profiles at `feeds`: totals, and the `top` layers whose times differ most
    (dynamic layers paired with static ones by `pairs`; a layer of one plan alone against 0)."""
    from polykit.tools.bench.benchmark import profile_engine

    dyn, static = (profile_engine(runners[k].engine, feeds, runs) for k in ("dynamic", "static"))
    theirs = {row.name: row for row in static.layers}
    rows = []
    for row in dyn.layers:
        other = theirs.pop(pairs[row.name].name, None) if row.name in pairs else None
        rows.append({"layer": row.name, "kind": row.kind, "dynamic_tactic": row.tactic, "dynamic_ms": row.ms,
                     "static_tactic": other.tactic if other else None, "static_ms": other.ms if other else 0.0})
    rows += [{"layer": row.name, "kind": row.kind, "dynamic_tactic": None, "dynamic_ms": 0.0,
              "static_tactic": row.tactic, "static_ms": row.ms} for row in theirs.values()]
    rows.sort(key=lambda r: -abs(r["dynamic_ms"] - r["static_ms"]))
    return {"runs": runs, "total_ms": {"dynamic": dyn.total_ms, "static": static.total_ms}, "layers": rows[:top]}


def time_model(path: Path, ranges: Mapping[str, Sequence[tuple[int, ...]]], feeds: Mapping[str, np.ndarray],
               target: str, level: int, how: Rounds = Rounds(), torch: Any = None) -> dict[str, Any]:
    """Build, check and time the static and the dynamic plan of the export `path` (module docstring);
    `feeds` at the opt shapes of `ranges`; `torch` on cuda."""
    report: dict[str, Any] = {"target": target, "precision": "fp16" if target == "cuda" else "fp32", "level": level,
                              "timing_cache": how.timing_cache, "profile": {n: [list(s) for s in r]
                                                                            for n, r in ranges.items()}}
    with tempfile.TemporaryDirectory() as work:
        cache = Path(work) / "timing.json"
        shared = how.timing_cache == "shared"
        static, t_static = build(path, ranges, target, False, level, **({"save_timing_cache": cache} if shared else {}))
        dyn, t_dyn = build(path, ranges, target, True, level, **({"load_timing_cache": cache} if shared else {}))
    report["build_s"] = {"static": round(t_static, 1), "dynamic": round(t_dyn, 1)}
    report["diff"] = layer_diff(dyn, static, dyn.gpu_arch)
    runners = {"dynamic": Runner(dyn, feeds, torch, in_place=True), "static": Runner(static, feeds, torch, in_place=True)}
    try:
        want = reference(path, dict(feeds))
        report["vs_onnxruntime"] = {k: errors(r.output(), want) for k, r in runners.items()}

        def timed(runner: Runner) -> float:
            if torch is None:
                return time_host(runner.run, how.warmup, how.iters)
            return time_cuda(runner.run, torch, how.warmup, how.iters)

        report["ms"], report["spread_ms"] = alternate(runners, how.rounds, timed)
        report["dynamic_over_static"] = round(report["ms"]["dynamic"] / report["ms"]["static"], 3)
        if how.profile_runs:
            report["layer_profile"] = profile_diff(runners, twins(dyn, static), feeds, how.profile_runs)
    finally:
        for runner in runners.values():
            runner.close()
    return report


def markdown(reports: Sequence[dict[str, Any]]) -> str:
    """The table (ratio per model, both errors, layer counts, what differs), then the why per model."""
    rows = ["| model | profile (min / opt / max) | static ms | dynamic ms | dynamic / static | spread ms (static / "
            "dynamic) | max rel err vs onnxruntime (static / dynamic) | layers (static / dynamic) | tactics differ | "
            "kernels differ | only in the dynamic plan | build s (static / dynamic) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    why = []
    for r in reports:
        if "error" in r:
            rows.append(f"| {r['model']} | | | | FAIL | | | | | | {r['error'][:200].replace('|', '/')} | |")
            continue
        d, ms, spread, err = r["diff"], r["ms"], r["spread_ms"], r["vs_onnxruntime"]
        profile = "; ".join(f"{n} {' / '.join('x'.join(map(str, s)) for s in shapes)}"
                            for n, shapes in r["profile"].items())
        ratio = r["dynamic_over_static"]
        rows.append(f"| {r['model']} | {profile} | {ms['static']:.3f} | {ms['dynamic']:.3f} | "
                    f"{'**' if ratio > BAR else ''}{ratio:.3f}{'**' if ratio > BAR else ''} | "
                    f"{spread['static']:.3f} / {spread['dynamic']:.3f} | "
                    f"{err['static']['max_rel_err']:.2g} / {err['dynamic']['max_rel_err']:.2g} | "
                    f"{d['layers']['static']} / {d['layers']['dynamic']} | {len(d['tactics'])} | {len(d['kernels'])} | "
                    f"{', '.join(f'{k} {v}' for k, v in d['only_dynamic_kinds'].items()) or 'none'} | "
                    f"{r['build_s']['static']} / {r['build_s']['dynamic']} |")
        why += [f"\n**{r['model']}** (dynamic / static {ratio:.3f}):"]
        why += [f"- only in the dynamic plan: {x['layer']} ({x['kind']}, {x['tactic']})" for x in d["only_dynamic"][:12]]
        why += [f"- only in the static plan: {x['layer']} ({x['kind']})" for x in d["only_static"][:12]]
        why += [f"- other tactic: {x['layer']} ({x['kind']}): dynamic {x['dynamic']}, static {x['static']}"
                for x in d["tactics"][:12]]
        why += [f"- excluded by the profile: {x['layer']} ({x['kind']}): {', '.join(x['excluded'])}; took {x['chosen']}"
                for x in d["excluded"][:12]]
        if "layer_profile" in r:
            p = r["layer_profile"]
            why.append(f"- per-layer profile (eager, median of {p['runs']}): dynamic {p['total_ms']['dynamic']:.3f} ms, "
                       f"static {p['total_ms']['static']:.3f} ms; the layers that differ most:")
            why += [f"  - {x['layer']} ({x['kind']}): dynamic {x['dynamic_ms']:.4f} ms ({x['dynamic_tactic']}), "
                    f"static {x['static_ms']:.4f} ms ({x['static_tactic']})" for x in p["layers"]]
    return "\n".join(rows) + "\n" + "\n".join(why) + "\n"


def run(folder: Path, names: Sequence[str], target: str, level: int, how: Rounds, out: Path | None) -> list[dict]:
    """`time_model` over PROFILES' `names` (exports in `folder`); a model that fails is an error row."""
    from polykit.errors import PolykitError

    torch = None
    if target == "cuda":
        import torch
    meta = provenance.meta(torch) if torch is not None else \
        {"date": time.strftime("%Y-%m-%d"), "device": "cpu", "commit": provenance.commit()}
    reports = []
    for name in names:
        start = time.perf_counter()
        try:
            report = {"model": name, **meta, **time_model(folder / f"{name}.onnx", ranges_of(name), opt_feeds(name),
                                                          target, level, how, torch)}
        except PolykitError as exc:
            report = {"model": name, **meta, "error": f"{type(exc).__name__}: {exc.what} [{exc.where or ''}]"}
        except Exception as exc:  # an internal error: reported, the other models go on
            report = {"model": name, **meta, "error": f"internal {type(exc).__name__}: {exc}"[:400]}
        report["seconds"] = round(time.perf_counter() - start, 1)
        print(f"{name}: {report.get('dynamic_over_static', 'FAIL')} {report.get('ms', report.get('error'))} "
              f"({report['seconds']} s)", flush=True)
        reports.append(report)
        if out is not None:  # after every model: a call cut short keeps what it finished
            write_report(reports, markdown, out)
    print(markdown(reports))
    return reports

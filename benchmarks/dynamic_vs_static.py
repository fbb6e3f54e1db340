"""Where a dynamic plan differs from the static plan of its opt shape (issue 33, Deliver 4).

For a model exported with dynamic axes, builds the plan for a min/opt/max profile and the static
plan of the opt shape (the same export, `input_shapes` at opt) and reports, layer by layer,
where they differ:

- the layer counts, and the layers only the dynamic plan has (shape arithmetic, Cast/Where/Expand
  of masks: what the static build folds to constants), by kind;
- per layer both have (matched by name): a different tactic, different kernels
  (polykit.runtime.tactic_check.plan_kernels: the sources and defines each declares), and
  which of the dynamic plan's kernels read sizes at run time (its tactic has dynamic_sizes and
  the layer touches a dynamic tensor) against the static plan's baked ones;
- the host-side work an enqueue adds: ShapeBinder.bind on a new shape set and on a cached one,
  the target's bind_shapes and the staged shape values (count, bytes), timed with perf_counter
  over many calls on cpu-target plans of the same model (these costs live in
  polykit/runtime/shapes.py and the engine: target-independent).

Cuda plans build without a GPU (builder level 0: no timing, tactics by priority and estimate).
The `time` step builds both plans on the machine's own GPU (or the cpu target) at one level, checks
them against onnxruntime and times them at opt (benchmarks/dynamic_vs_static_timing.py).

    # export (torch): DIR/<model>.onnx with dynamic axes (bert: batch, sequence; convnets: batch)
    /work/zoovenv/bin/python benchmarks/dynamic_vs_static.py export --dir /tmp/dvs --models bert_base,resnet50
    # compare (polykit)
    PYTHONPATH=. python benchmarks/dynamic_vs_static.py compare --dir /tmp/dvs --models bert_base --out dvs.json
    # time (a GPU machine with torch; --target cpu without)
    PYTHONPATH=. python3 benchmarks/dynamic_vs_static.py time --dir /tmp/dvs --out dvs_time
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Mapping, Sequence

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

OPSET = 17
#: model -> {input: (axes names, (min, opt, max) of the full shape)}
PROFILES: dict[str, dict[str, Any]] = {
    "bert_base": {n: ({0: "batch", 1: "sequence"}, ((1, 16), (8, 128), (8, 128)))
                  for n in ("input_ids", "attention_mask")},
    **{name: {"x": ({0: "batch"}, ((1, 3, 224, 224), (32, 3, 224, 224), (32, 3, 224, 224)))}
       for name in ("resnet50", "efficientnet_b0", "mobilenet_v3_large")},
    #: the same convnets with a dynamic image size too (not in the issue's comparison): what a
    #: profile over image sizes costs the tactics
    **{f"{name}_hw": {"x": ({0: "batch", 2: "height", 3: "width"},
                            ((1, 3, 160, 160), (32, 3, 224, 224), (32, 3, 256, 256)))}
       for name in ("resnet50", "efficientnet_b0", "mobilenet_v3_large")},
}
DEFAULT_MODELS = ("bert_base", "resnet50", "efficientnet_b0", "mobilenet_v3_large")


def model_of(name: str) -> str:
    """The zoo model a PROFILES entry exports (`resnet50_hw`: resnet50)."""
    return name[:-3] if name.endswith("_hw") else name


# ---- export (torch) ------------------------------------------------------------------------------
def export(name: str, folder: Path) -> None:
    import warnings

    import torch

    from benchmarks.dynamic_exports import make_module
    from benchmarks.zoo_models import BY_NAME

    module = make_module(model_of(name), torch)
    spec = PROFILES[name]
    feeds = {}
    for inp in BY_NAME[model_of(name)].inputs:
        shape = spec[inp.name][1][1]
        if inp.kind == "ids":
            feeds[inp.name] = torch.randint(0, inp.high, shape, generator=torch.Generator().manual_seed(0))
        elif inp.kind == "ones":
            feeds[inp.name] = torch.ones(shape, dtype=torch.int64)
        else:
            feeds[inp.name] = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    axes = {n: dict(a) for n, (a, _) in spec.items()}
    axes["out"] = {0: "batch"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, tuple(feeds.values()), str(folder / f"{name}.onnx"), input_names=list(feeds),
                          output_names=["out"], opset_version=OPSET, dynamo=False, dynamic_axes=axes)



# ---- compare (polykit) ---------------------------------------------------------------------------
def ranges_of(name: str) -> dict[str, tuple[tuple[int, ...], ...]]:
    """(min, opt, max) of each input of PROFILES[name]."""
    return {n: r for n, (_, r) in PROFILES[name].items()}


def build(path: Path, ranges: Mapping[str, Sequence[tuple[int, ...]]], target: str, dynamic: bool, level: int = 0,
          **config: Any) -> tuple[Any, float]:
    """The plan of `path` for the profile `ranges` ((min, opt, max) per input; dynamic) or for its opt
    shapes (static): fp16 on cuda, builder level `level`, more BuilderConfig fields in `config`;
    and its build seconds."""
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.compiler.plan.profiles import Profile

    extra: dict[str, Any] = ({"profiles": [Profile({n: tuple(r) for n, r in ranges.items()})]} if dynamic
                             else {"input_shapes": {n: r[1] for n, r in ranges.items()}})
    start = time.perf_counter()
    plan = build_plan(str(path), BuilderConfig(target=target, fp16=target == "cuda", builder_optimization_level=level,
                                               **extra, **config))
    return plan, time.perf_counter() - start


def pretend_gpu(arch: str, sm_count: int = 132) -> None:
    """Build cuda plans as for a GPU of `arch` without one (level 0 times and compiles nothing):
    its arch-specific tactics (sm90 wgmma GEMMs, convolutions, attention) become candidates."""
    from polykit.compiler.builder import builder as builder_module
    from polykit.compiler.builder import tuner as tuner_module
    from polykit.runtime.cuda.driver import DeviceInfo

    gpu = DeviceInfo(0, f"{arch} (pretended)", arch, sm_count, 80 << 30, 227 << 10)
    builder_module.build_device = lambda target, device=None: gpu if target == "cuda" else None
    tuner_module.Tuner.device = lambda self: gpu


def dynamic_tensors(plan: Any) -> set[str]:
    return {n for n, t in plan.tensors.items() if t.dims}


def kernel_label(source: Any) -> str:
    defines = ",".join(f"{k}={v}" for k, v in source.defines)
    return f"{source.name}[{source.file or 'generated'}]({defines})"


#: the counter a pass appends to the names it makes (`MatMul_packed__17`): two builds count apart
FRESH_SUFFIX = re.compile(r"__\d+$")


def twins(dyn: Any, static: Any) -> dict[str, Any]:
    """Each layer of `dyn` (by name) paired with the static plan's layer of that name or, where the
    names differ only by FRESH_SUFFIX, the first unpaired static layer of that stem and kind."""
    by_name = {layer.name: layer for layer in static.layers}
    pairs = {layer.name: by_name[layer.name] for layer in dyn.layers if layer.name in by_name}
    spare: dict[tuple[str, str], list[Any]] = {}
    for layer in static.layers:
        if layer.name not in pairs:
            spare.setdefault((FRESH_SUFFIX.sub("", layer.name), layer.kind), []).append(layer)
    for layer in dyn.layers:
        left = spare.get((FRESH_SUFFIX.sub("", layer.name), layer.kind))
        if layer.name not in pairs and left:
            pairs[layer.name] = left.pop(0)
    return pairs


def layer_diff(dyn: Any, static: Any, arch: str = "") -> dict[str, Any]:
    """Per layer where the dynamic plan differs from the static one (layers paired by `twins`)."""
    from polykit.kernels.tactics import find_tactic

    moving = dynamic_tensors(dyn)
    by_name = twins(dyn, static)
    paired = {id(layer) for layer in by_name.values()}
    extra = [layer for layer in dyn.layers if layer.name not in by_name]
    missing = [layer for layer in static.layers if id(layer) not in paired]
    tactics, kernels, run_time, baked = [], [], Counter(), Counter()
    excluded = excluded_tactics(dyn, static, arch) if dyn.target == "cuda" else []
    for layer in dyn.layers:
        other = by_name.get(layer.name)
        tactic = find_tactic(dyn.target, layer.kind, layer.tactic)
        touches = any(n in moving for n in layer.inputs + layer.outputs if n)
        (run_time if touches and getattr(tactic, "dynamic_sizes", False) else baked)[layer.kind] += 1
        if other is None:
            continue
        if other.tactic != layer.tactic:
            tactics.append({"layer": layer.name, "kind": layer.kind, "dynamic": layer.tactic, "static": other.tactic})
        if dyn.target == "cuda":
            mine, theirs = kernel_names(dyn, layer), kernel_names(static, other)
            if mine != theirs:
                kernels.append({"layer": layer.name, "kind": layer.kind, "dynamic": mine, "static": theirs})
    return {"layers": {"dynamic": len(dyn.layers), "static": len(static.layers)},
            "only_dynamic": [{"layer": l.name, "kind": l.kind, "tactic": l.tactic} for l in extra],
            "only_dynamic_kinds": dict(Counter(l.kind for l in extra)),
            "only_static": [{"layer": l.name, "kind": l.kind} for l in missing],
            "tactics": tactics, "kernels": kernels, "excluded": excluded,
            "excluded_tactics": dict(Counter(t for row in excluded for t in row["excluded"])),
            "sizes_at_run_time": dict(run_time), "sizes_baked": dict(baked),
            "dynamic_tensors": len(moving),
            "host_values": {"tensors": sum(1 for t in dyn.tensors.values() if t.value),
                            "bytes": sum(int(t.nbytes) for t in dyn.tensors.values() if t.value)}}


def excluded_tactics(dyn: Any, static: Any, arch: str) -> list[dict[str, Any]]:
    """Per layer of `dyn` that touches a dynamic tensor: the tactics that support its static twin (`twins`)
    at the opt shapes (at the dynamic layer's precision) but cannot serve the profile
    (tuner.serves_corners: no dynamic_sizes, a corner unsupported, or a size baked into the kernels),
    with the priorities of the best excluded one and of the dynamic plan's pick."""
    from dataclasses import replace

    from polykit.compiler.builder.tuner import serves_corners
    from polykit.kernels.profile_tactics import profile_groups, profile_views
    from polykit.kernels.tactics import candidates, find_tactic

    every, _ = profile_views(dyn.tensors, profile_groups(dyn.profiles))
    moving = dynamic_tensors(dyn)
    pairs = twins(dyn, static)
    rows = []
    for layer in dyn.layers:
        twin = pairs.get(layer.name)
        if twin is None or not any(n in moving for n in layer.inputs + layer.outputs if n):
            continue
        found = candidates(dyn.target, twin.kind, replace(twin, precision=layer.precision), arch=arch or None)
        out = [t for t in found if not serves_corners(t, layer, every.corners, every.generic)]
        if out:
            chosen = find_tactic(dyn.target, layer.kind, layer.tactic)
            rows.append({"layer": layer.name, "kind": layer.kind, "excluded": [t.name for t in out],
                         "best_excluded_priority": max(t.priority for t in out),
                         "chosen": layer.tactic, "chosen_priority": getattr(chosen, "priority", None)})
    return rows


def kernel_names(plan: Any, layer: Any) -> list[str]:
    from polykit.runtime.tactic_check import plan_kernels

    return sorted(kernel_label(k) for k in plan_kernels(plan, layer))


def per_call_us(fn: Any, calls: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def host_work(dyn: Any, static: Any, name: str, calls: int) -> dict[str, Any]:
    """Microseconds of the host work one enqueue of `dyn` adds over `static` (cpu-target plans)."""
    from polykit.runtime.shapes import ShapeBinder

    spec = PROFILES[name]
    shapes = {n: r[1] for n, (_, r) in spec.items()}
    out: dict[str, Any] = {}
    binder = ShapeBinder(dyn)
    few = max(calls // 100, 5)
    out["bind_new_shape_us"] = per_call_us(lambda: ShapeBinder(dyn).bind(shapes, 0), few)
    out["bind_cached_us"] = per_call_us(lambda: binder.bind(shapes, 0), calls)
    out["bind_static_us"] = per_call_us(lambda: ShapeBinder(static).bind(shapes, 0), calls)
    bound = binder.bind(shapes, 0)
    out["shapes_per_set"] = len(bound.shapes)
    out["values_per_set"] = len(bound.values)
    from polykit.runtime.engine import Engine

    for label, plan in (("dynamic", dyn), ("static", static)):
        with Engine(plan) as engine, engine.create_execution_context() as ctx:
            ctx._input_shapes.update(shapes)  # noqa: SLF001 - what enqueue does before its launches
            out[f"context_bind_{label}_us"] = per_call_us(ctx._bind, calls)  # noqa: SLF001
    # the cuda target's DeviceTensors: rebuilt for every dynamic tensor each run (before
    # polykit.runtime.cuda.bound_shapes), or once per shape set
    from polykit.kernels.cuda.base import DeviceTensor
    from polykit.runtime.cuda.bound_shapes import BoundShapes

    tensors = BoundShapes.emulated(dyn)

    def every_run() -> None:
        for tensor, shape in bound.shapes.items():
            t = tensors[tensor]
            tensors[tensor] = DeviceTensor(t.ptr, tuple(shape), t.dtype)

    out["cuda_bind_shapes_every_run_us"] = per_call_us(every_run, calls)
    rebinding = BoundShapes(tensors)
    out["cuda_bind_shapes_per_set_us"] = per_call_us(lambda: rebinding.bind(bound), calls)
    return out


def compare(path: Path, name: str, calls: int, cuda: bool = True, arch: str = "") -> dict[str, Any]:
    report: dict[str, Any] = {"model": name, "profile": ranges_of(name)}
    if cuda:
        dyn, t_dyn = build(path, ranges_of(name), "cuda", True)
        static, t_static = build(path, ranges_of(name), "cuda", False)
        report["cuda"] = layer_diff(dyn, static, arch)
        report["cuda"]["build_s"] = {"dynamic": round(t_dyn, 1), "static": round(t_static, 1)}
        del dyn, static
    dyn, _ = build(path, ranges_of(name), "cpu", True)
    static, _ = build(path, ranges_of(name), "cpu", False)
    report["cpu"] = {k: v for k, v in layer_diff(dyn, static).items() if k in ("layers", "only_dynamic_kinds")}
    report["host"] = host_work(dyn, static, name, calls)
    return report


def text(report: dict[str, Any]) -> str:
    lines = [f"== {report['model']} {report['profile']}"]
    for target in ("cuda", "cpu"):
        if target not in report:
            continue
        r = report[target]
        lines.append(f"{target}: layers dynamic {r['layers']['dynamic']} / static {r['layers']['static']}; "
                     f"only in the dynamic plan: {r.get('only_dynamic_kinds')}")
        for row in r.get("only_dynamic", [])[:40]:
            lines.append(f"  + {row['layer']} ({row['kind']}, {row['tactic']})")
        for row in r.get("only_static", [])[:20]:
            lines.append(f"  - {row['layer']} ({row['kind']})")
        if "tactics" in r:
            lines.append(f"  tactics differ on {len(r['tactics'])} layers; kernels differ on {len(r['kernels'])}; "
                         f"sizes read at run time {r['sizes_at_run_time']}; baked {r['sizes_baked']}; "
                         f"dynamic tensors {r['dynamic_tensors']}; host values {r['host_values']}")
            for row in r["tactics"][:40]:
                lines.append(f"  ~ {row['layer']} ({row['kind']}): dynamic {row['dynamic']}, static {row['static']}")
            lines.append(f"  excluded from the dynamic plan (serve the static layer, not the profile): "
                         f"{r['excluded_tactics']}")
            for row in r["excluded"][:30]:
                lines.append(f"  x {row['layer']} ({row['kind']}): {row['excluded']} (priority "
                             f"{row['best_excluded_priority']}); took {row['chosen']} ({row['chosen_priority']})")
            for row in r["kernels"][:20]:
                lines.append(f"  k {row['layer']} ({row['kind']}): dynamic {row['dynamic']} / static {row['static']}")
    if "host" in report:
        lines.append("host: " + ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
                                          for k, v in report["host"].items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=("export", "compare", "time"),
                        help="time: benchmarks/dynamic_vs_static_timing.py (its docstring)")
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS))
    parser.add_argument("--out", type=Path, default=None, help="JSON report (time: OUT.json and OUT.md)")
    parser.add_argument("--calls", type=int, default=2000, help="calls per host-time measurement")
    parser.add_argument("--arch", default="sm_90",
                        help="GPU the cuda plans are built for without one (132 SMs; '' = no GPU: no sm90 tactics)")
    parser.add_argument("--no-cuda", action="store_true", help="skip the cuda plans (host timing only)")
    timing = parser.add_argument_group("time")
    timing.add_argument("--target", default="cuda", choices=("cuda", "cpu"), help="cpu: host timing, no torch")
    timing.add_argument("--level", type=int, default=3, help="builder optimization level of both plans")
    timing.add_argument("--rounds", type=int, default=7)
    timing.add_argument("--warmup", type=int, default=20)
    timing.add_argument("--iters", type=int, default=100)
    timing.add_argument("--profile-runs", type=int, default=3, help="per-layer profile runs of each plan (0: none)")
    timing.add_argument("--timing-cache", default="separate", choices=("separate", "shared"),
                        help="shared: the dynamic build starts from the static build's timing cache")
    args = parser.parse_args(argv)
    names = [n for n in args.models.split(",") if n]
    unknown = sorted(set(names) - set(PROFILES))
    if unknown:
        parser.error(f"unknown models {unknown}; known: {', '.join(PROFILES)}")
    args.dir.mkdir(parents=True, exist_ok=True)
    if args.step == "export":
        for name in names:
            start = time.perf_counter()
            export(name, args.dir)
            print(f"{name}: exported in {time.perf_counter() - start:.0f} s", flush=True)
        return 0
    if args.step == "time":  # on the machine's own GPU (or the cpu target): nothing pretended
        from benchmarks.dynamic_vs_static_timing import Rounds, run

        how = Rounds(args.rounds, args.warmup, args.iters, args.profile_runs, args.timing_cache)
        reports = run(args.dir, names, args.target, args.level, how, args.out)
        return 0 if reports and all("error" not in r for r in reports) else 1
    if args.arch:
        pretend_gpu(args.arch)
    reports = [compare(args.dir / f"{name}.onnx", name, args.calls, cuda=not args.no_cuda, arch=args.arch)
               for name in names]
    for report in reports:
        print(text(report), flush=True)
    if args.out:
        args.out.write_text(json.dumps(reports, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

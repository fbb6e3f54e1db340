"""Screen the dynamic cuda plans of benchmarks/dynamic_exports.py's exports without a GPU (issue 33).

A dynamic layer's tactic is chosen where it serves the profile's corners and the builder's witness
points (polykit.compiler.plan.witnesses); a property of the shapes that holds there may still fail
between them (Swin-T at 83 x 109, Faster R-CNN at 279 x 279: a Pad kernel that grows only the last
axis). Binding a shape set checks every dynamic layer's tactic at the bound shapes
(polykit.runtime.shapes.ShapeBinder.tactics_serve), and neither the cuda build at level 0 nor the
binding needs a GPU, so this script runs that check here for every export: per model and precision
(fp32, fp16) it builds the cuda plan for the export's min/opt/max profile at builder level 0 (a
level-3 build times tactics on a GPU; level 0 takes each layer's first eligible tactic by priority,
so a GPU build may choose others), serializes and reloads it (Plan.deserialize), and binds it at
min, opt, odd, max, the detectors' float32-rounding sizes (dynamic_exports.rounding_sizes) and at
least `INTERIOR` interior shape sets (`interior_shapes`: every dynamic dim varied over its range,
odd and even). A shape set whose bind raises PlanError is a failure: every layer whose tactic does
not serve it is listed (ShapeBinder.unserved). Writes a JSON list and a markdown table.

    python benchmarks/dynamic_exports.py export --dir DIR --models swin_t,gpt2    # torch
    PYTHONPATH=. python benchmarks/dynamic_screen.py --dir DIR --models swin_t,gpt2 --out screen

Nothing is timed but the builds' wall time (reported, not compared).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # `python benchmarks/dynamic_screen.py` as well as `-m benchmarks.dynamic_screen`
    sys.path.insert(0, str(REPO))

from benchmarks.dynamic_exports import chosen_models, model_names, report  # noqa: E402

#: interior shape sets bound per model (fewer where the profile has fewer distinct points: a batch of 1..4)
INTERIOR = 24
#: dims a model takes only at multiples of a step (UNet's four poolings: sides divisible by 16)
STEPS = {"unet": {"height": 16, "width": 16}}
PRECISIONS = ("fp32", "fp16")
#: the GPU whose tactics the candidates' screen asks (the lead's H100: sm_90, 132 SMs; an H200 is sm_90 too)
ARCH, SM_COUNT = "sm_90", 132


def dim_ranges(spec: dict[str, dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """Each dynamic dim's (min, max) over the export's profile (`shape_plan`'s shapes 0 and 2)."""
    out: dict[str, tuple[int, int]] = {}
    for s in spec.values():
        for axis, dim in s["axes"].items():
            out[dim] = (s["shapes"][0][int(axis)], s["shapes"][2][int(axis)])
    return out


def interior_shapes(name: str, spec: dict[str, dict[str, Any]], taken: list[dict[str, tuple]],
                    count: int = INTERIOR) -> list[dict[str, tuple]]:
    """`count` distinct input shape sets of the profile other than `taken` where it has that many
    (deterministic): witnesses.sample_points spreads the dims over their ranges, then point k gives the
    i-th dim the parity of bit i of k (every mix of odd and even dims), or rounds it to the dim's step
    (STEPS)."""
    from polykit.compiler.plan.witnesses import sample_points

    ranges = dim_ranges(spec)
    steps = STEPS.get(name, {})
    corners = [{d: r[0] for d, r in ranges.items()}, {d: r[1] for d, r in ranges.items()}]
    found: dict[tuple, dict[str, tuple]] = {}
    for k, env in enumerate(sample_points(corners, 16 * count)):
        for i, dim in enumerate(sorted(env)):
            low, high = ranges[dim]
            step = steps.get(dim, 1)
            if step > 1:
                env[dim] = low + round((env[dim] - low) / step) * step
            elif high > low and env[dim] % 2 != (k >> i) & 1:
                env[dim] += 1 if env[dim] < high else -1
        shapes = _inputs(spec, env)
        if shapes not in taken:
            found.setdefault(tuple(sorted(env.items())), shapes)
        if len(found) == count:
            break
    return list(found.values())


def _inputs(spec: dict[str, dict[str, Any]], env: dict[str, int]) -> dict[str, tuple]:
    """Input shapes with each dynamic axis at `env`'s value (the others as at the profile's min)."""
    return {n: tuple(env[s["axes"][a]] if a in s["axes"] else d for a, d in
                     ((str(a), d) for a, d in enumerate(s["shapes"][0]))) for n, s in spec.items()}


def shape_sets(name: str, spec: dict[str, dict[str, Any]]) -> list[tuple[str, dict[str, tuple]]]:
    """(label, input shapes): min, opt, odd, max, the float32-rounding sizes, then the interior ones."""
    corner = [("min", 0), ("opt", 1), ("odd", 3), ("max", 2)]
    extra = len(next(iter(spec.values()))["shapes"]) - 4
    labeled = [(label, {n: tuple(s["shapes"][k]) for n, s in spec.items()})
               for label, k in corner + [(f"f32 {j + 1}", 4 + j) for j in range(extra)]]
    inside = interior_shapes(name, spec, [shapes for _, shapes in labeled])
    return labeled + [(f"in {j + 1}", shapes) for j, shapes in enumerate(inside)]


def screen_plan(plan: Any, sets: list[tuple[str, dict[str, tuple]]]) -> dict[str, Any]:
    """Bind `plan` at every shape set; the layers whose tactic does not serve one, with the sets."""
    from polykit.errors import PlanError, RuntimeInputError
    from polykit.runtime.shapes import ShapeBinder

    binder = ShapeBinder(plan)
    dynamic = {n for n, t in plan.tensors.items() if t.dims}
    failures: dict[str, dict[str, Any]] = {}
    bound, refused = 0, []
    for label, shapes in sets:
        try:
            binder.bind(shapes)
            bound += 1
        except PlanError:
            bound += 1
            for layer, stamped in binder.unserved(binder.evaluate(shapes)):
                entry = failures.setdefault(layer.name, {"layer": layer.name, "kind": layer.kind,
                                                         "tactic": layer.tactic, "shapes": []})
                entry["shapes"].append({"set": label, "inputs": {n: list(v) for n, v in shapes.items()},
                                        "layer_in": [list(s) for s in stamped.in_shapes],
                                        "layer_out": [list(s) for s in stamped.out_shapes]})
        except RuntimeInputError as exc:  # a shape the model itself cannot take
            refused.append({"set": label, "inputs": {n: list(v) for n, v in shapes.items()}, "error": exc.what})
    return {"layers": len(plan.layers),
            "dynamic_layers": sum(any(n in dynamic for n in (*lay.inputs, *lay.outputs) if n) for lay in plan.layers),
            "bound": bound, "refused": refused, "failures": list(failures.values())}


def screen_candidates(plan: Any, cfg: Any, sets: list[tuple[str, dict[str, tuple]]], arch: str = ARCH,
                      sm_count: int = SM_COUNT) -> dict[str, Any]:
    """Every (precision, tactic) pair the builder lets a build on a GPU of `arch` choose for each dynamic
    layer of `plan` (tuner.candidate_pairs: those that serve the profile's corners and the layer's witness
    points), asked at every shape set as `ShapeBinder.unserved` asks the chosen one: a pair that fails is a
    tactic a timed (level 3) build may choose and then run wrong."""
    from polykit.compiler.builder.tuner import candidate_pairs
    from polykit.compiler.plan.witnesses import Witnesses
    from polykit.kernels.profile_tactics import profile_groups, profile_views, touches
    from polykit.runtime.shapes import ShapeBinder, unserved_at

    binder = ShapeBinder(plan)
    bound = [(label, binder.evaluate(shapes).shapes) for label, shapes in sets]
    every, _ = profile_views(plan.tensors, profile_groups(plan.profiles))
    search = Witnesses(plan.tensors, every.envs)
    failures: dict[tuple[str, str, str], dict[str, Any]] = {}
    checked = 0
    for layer in plan.layers:
        if not touches(layer, every.opt):
            continue
        pairs = candidate_pairs(layer, "cuda", cfg, plan.tensors, arch, sm_count,
                                every.corners + search.corners(layer), every.generic)
        names = [n for n in (*layer.inputs, *layer.outputs) if n and n in every.opt]
        for variant, tactic in pairs:
            checked += 1
            for label, shapes in bound:
                if any(n not in shapes for n in names):
                    continue  # waits for a data-dependent size
                stamped = unserved_at(tactic, variant, shapes)
                if stamped is not None:
                    entry = failures.setdefault((layer.name, variant.precision, tactic.name), {
                        "layer": layer.name, "kind": layer.kind, "precision": variant.precision,
                        "tactic": tactic.name, "chosen": layer.tactic, "shapes": []})
                    entry["shapes"].append({"set": label, "layer_in": [list(s) for s in stamped.in_shapes],
                                            "layer_out": [list(s) for s in stamped.out_shapes]})
    return {"candidates_checked": checked, "candidate_failures": list(failures.values())}


def screen_one(folder: Path, name: str, precision: str) -> dict[str, Any]:
    """Build the level-0 cuda plan of one export at `precision`, reload it, bind it at every shape set."""
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.compiler.plan.file import Plan
    from polykit.compiler.plan.profiles import Profile
    from polykit.errors import PolykitError

    spec = json.loads((folder / f"{name}.json").read_text())["inputs"]
    result: dict[str, Any] = {"model": name, "precision": precision,
                              "dynamic": sorted({d for s in spec.values() for d in s["axes"].values()}), "error": None}
    stage = "build"
    try:
        start = time.time()
        profile = Profile({n: tuple(tuple(s["shapes"][k]) for k in range(3)) for n, s in spec.items()})
        cfg = BuilderConfig(target="cuda", profiles=[profile], builder_optimization_level=0, fp16=precision == "fp16")
        built = build_plan(str(folder / f"{name}.onnx"), cfg)
        result["build_s"] = round(time.time() - start, 1)
        sets = shape_sets(name, spec)
        result["sets"] = [label for label, _ in sets]
        stage = "candidates"
        result.update(screen_candidates(built, cfg, sets))
        stage = "bind"
        try:
            plan = Plan.deserialize(built.serialize(), expect_target="cuda")
        except PolykitError as exc:  # the built plan is screened all the same
            result["load_error"] = f"{type(exc).__name__}: {exc.what} [{exc.where or ''}]"[:600]
            plan = built
        result.update(screen_plan(plan, sets))
    except PolykitError as exc:
        result["error"] = f"{stage}: {type(exc).__name__}: {exc.what} [{exc.where or ''}]"[:600]
    except Exception as exc:  # an internal error: reported, the others go on
        result["error"] = f"{stage}: internal {type(exc).__name__}: {exc}"[:400]
        result["traceback"] = traceback.format_exc()[-2000:]
    return result


def markdown(results: list[dict[str, Any]]) -> str:
    rows = ["| model | dynamic dims | precision | layers | dynamic layers | shape sets bound | refused | "
            "failures (layer, kind, tactic: sets) | eligible tactics checked | failing eligible tactics | build s |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        failed = "; ".join(f"{f['layer']} ({f['kind']}, {f['tactic']}: {_labels([s['set'] for s in f['shapes']])})"
                           for f in r.get("failures", [])) or "none"
        if r.get("load_error"):
            failed += f" (the built plan: loading it failed, {r['load_error']})"
        if r.get("error"):
            failed = f"error: {r['error']}"
        others = "; ".join(f"{f['layer']} ({f['kind']}, {f['precision']} {f['tactic']}: "
                           f"{_labels([s['set'] for s in f['shapes']])})" for f in r.get("candidate_failures", []))
        cells = [r["model"], ", ".join(r["dynamic"]), r["precision"], r.get("layers", "-"), r.get("dynamic_layers", "-"),
                 r.get("bound", "-"), len(r.get("refused", [])), failed, r.get("candidates_checked", "-"),
                 others or ("none" if "candidates_checked" in r else "-"), r.get("build_s", "-")]
        rows.append("| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |")
    return "\n".join(rows) + "\n"


def _labels(sets: list[str], shown: int = 4) -> str:
    return ", ".join(sets) if len(sets) <= shown else f"{', '.join(sets[:shown])} and {len(sets) - shown} more"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True, help="dynamic_exports.py's export folder")
    parser.add_argument("--models", default=",".join(model_names()), help="comma-separated names")
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--out", type=Path, default=None, help="write OUT.json and OUT.md")
    args = parser.parse_args(argv)
    names = chosen_models(parser, args.models)
    results = []
    for name in names:
        for precision in args.precisions.split(","):
            if not (args.dir / f"{name}.onnx").exists():
                result = {"model": name, "precision": precision, "dynamic": [], "error": "not exported"}
            else:
                result = screen_one(args.dir, name, precision)
            print(f"{name} {precision}: {len(result.get('failures', []))} failing layers, {result.get('bound')} sets, "
                  f"{len(result.get('refused', []))} refused {result.get('error') or ''}", flush=True)
            results.append(result)
    report(results, markdown, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

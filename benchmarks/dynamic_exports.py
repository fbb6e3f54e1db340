"""Real exports with dynamic axes (issue 33, Acceptance 1): each zoo model (benchmarks/zoo_models.py
MODELS) and two torchvision detectors, exported by PyTorch's TorchScript exporter (opset 17,
random weights, fixed seeds) with a dynamic batch, a dynamic image size for the convnets (and
detectors) that take one, a dynamic sequence length for the token and audio transformers; then
ONE plan per model built for a min/opt/max profile, saved and loaded again (serialize ->
deserialize with its load check: what `polykit convert` + `polykit run --load-engine` do), run at
min, an odd shape and max, and compared with onnxruntime; Faster R-CNN also at image sizes where
its transform's float32 resize size differs from the exact one (rounding_sizes). Writes a JSON list
and a markdown table (pass/fail, max abs error, the error message of a build, load or run that
failed).

Two steps, since the export needs torch and the check needs polykit (one environment may hold both):

    # export (torch, torchvision, timm, transformers): writes DIR/<model>.onnx and DIR/<model>.json
    python benchmarks/dynamic_exports.py export --dir /tmp/dyn --models resnet18,gpt2   # --static: at opt
    # check (polykit): one subprocess per model; --target cuda on a GPU machine
    PYTHONPATH=. python benchmarks/dynamic_exports.py check --dir /tmp/dyn --target cpu --out results
    # both, exporting with another interpreter:
    PYTHONPATH=. python benchmarks/dynamic_exports.py all --dir /tmp/dyn --torch-python /path/to/python

Shapes are kept small for the cpu target (images 64-128 px, sequences 8-32 tokens); `--models`
takes names from MODELS and DETECTORS (default: all). A model passes when every output has
onnxruntime's shape at the three shapes and differs by at most 1e-3 x max(1, max |reference|).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
import traceback
from fractions import Fraction
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # `python benchmarks/dynamic_exports.py` as well as `-m benchmarks.dynamic_exports`
    sys.path.insert(0, str(REPO))

from benchmarks.zoo_models import BY_NAME, MODELS, InputSpec, ZooModel  # noqa: E402

OPSET = 17
RELATIVE_TOLERANCE = 1e-3
#: detectors (torchvision, weights=None): batch 1 (a list of one image), a dynamic image size
DETECTORS = ("ssdlite320_mobilenet_v3_large", "fasterrcnn_mobilenet_v3_large_320_fpn")
#: the std of a detector's redrawn class head: SSDLite's 91-way softmax over weak features needs wide logits
HEAD_STD = {"ssdlite320_mobilenet_v3_large": 0.3, "fasterrcnn_mobilenet_v3_large_320_fpn": 0.2}
#: image models whose architecture fixes the image size (position embeddings), or whose pooling the
#: exporter takes only at a static size (VGG's AdaptiveAvgPool2d to 7x7): batch only
FIXED_IMAGE = frozenset({"vit_b_16", "deit_small", "dinov2_small", "vgg11_bn"})
#: (min, opt, max, odd) of each varying dim
BATCH, SEQUENCE, SAMPLES = (1, 2, 4, 3), (8, 16, 32, 13), (4000, 8000, 16000, 12345)
IMAGE = {"default": ((64, 64), (96, 96), (128, 128), (83, 109)), "inception_v3": ((80, 80), (96, 96), (128, 128), (83, 109)),
         "unet": ((64, 64), (96, 96), (128, 128), (80, 112)),  # 4 poolings: sides divisible by 16
         "detector": ((256, 256), (320, 320), (384, 384), (300, 340))}
#: a detector whose transform resizes by a scale computed in float32 from the image size (torchvision's
#: GeneralizedRCNNTransform: floor(d * min(min_size / min(h, w), max_size / max(h, w)))): (min_size, max_size)
FLOAT_RESIZE = {"fasterrcnn_mobilenet_v3_large_320_fpn": (320, 640)}
#: image sizes checked besides min/odd/max where that float32 size differs from the exact one
ROUNDING_SHAPES = 4


def rounding_sizes(name: str, count: int = ROUNDING_SHAPES) -> list[tuple[int, int]]:
    """`count` (h, w) in the detector profile, spread over all those where the transform's float32
    resize size (as the graph computes it: 1 / side * min_size, then h * scale, floored) differs
    from the exact floor(h * min(min_size / min, max_size / max)): where a dim expression evaluated
    with exact fractions would be wrong."""
    import numpy as np

    if name not in FLOAT_RESIZE:
        return []
    low, high = IMAGE["detector"][0][0], IMAGE["detector"][2][0]
    small, large = FLOAT_RESIZE[name]
    f = np.float32
    found = []
    for h in range(low, high + 1):
        for w in range(low, high + 1):
            scale = min(f(1) / f(min(h, w)) * f(small), f(1) / f(max(h, w)) * f(large))
            exact = min(Fraction(small, min(h, w)), Fraction(large, max(h, w)))
            if any(int(np.floor(f(d) * scale)) != math.floor(d * exact) for d in (h, w)):
                found.append((h, w))
    return [found[i * (len(found) - 1) // max(count - 1, 1)] for i in range(count)] if found else []


def model_names() -> list[str]:
    return [m.name for m in MODELS] + list(DETECTORS)


def shape_plan(name: str) -> dict[str, dict[str, Any]]:
    """Per input: kind/high (benchmarks.zoo_models.InputSpec), the min/opt/max/odd shapes and the
    dynamic axes' names."""
    if name in DETECTORS:
        (h0, w0), (h1, w1), (h2, w2), (h3, w3) = IMAGE["detector"]
        return {"x": {"kind": "uniform", "high": 0, "axes": {2: "height", 3: "width"},
                      "shapes": [[1, 3, h0, w0], [1, 3, h1, w1], [1, 3, h2, w2], [1, 3, h3, w3]]
                      + [[1, 3, h, w] for h, w in rounding_sizes(name)]}}
    model: ZooModel = BY_NAME[name]
    out = {}
    for spec in model.inputs:
        dims: list[Any] = [("batch", BATCH)]
        if len(spec.shape) == 3 and spec.shape[0] == 3 and name not in FIXED_IMAGE:  # an image
            sides = IMAGE.get(name, IMAGE["default"])
            dims += [spec.shape[0], ("height", tuple(s[0] for s in sides)), ("width", tuple(s[1] for s in sides))]
        elif spec.kind in ("ids", "ones"):
            dims.append(("sequence", SEQUENCE))
        elif spec.shape == (80000,):  # raw audio
            dims.append(("samples", SAMPLES))
        else:
            dims += list(spec.shape)
        out[spec.name] = {"kind": spec.kind, "high": spec.high,
                          "axes": {a: d[0] for a, d in enumerate(dims) if isinstance(d, tuple)},
                          "shapes": [[d[1][k] if isinstance(d, tuple) else d for d in dims] for k in range(4)]}
    return out


# ---- export (torch) ------------------------------------------------------------------------------
def make_module(name: str, torch):
    """The model in eval mode, seeded; a detector with its BatchNorm statistics estimated on random
    images and its class head redrawn (N(0, HEAD_STD)) so that scores differ (no near-ties that
    two correct implementations may order either way) and some boxes pass."""
    from benchmarks.torch_export import single_output
    from benchmarks.zoo_models import prepare

    torch.manual_seed(0)
    if name not in DETECTORS:
        model = BY_NAME[name]
        return single_output(prepare(model, model.make().eval(), torch), tuple(s.name for s in model.inputs), torch)
    from benchmarks.torchvision_ops import install
    from torchvision.models import detection

    install()
    net = getattr(detection, name)(weights=None, weights_backbone=None).eval()
    head = net.head.classification_head if hasattr(net, "head") else net.roi_heads.box_predictor.cls_score
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0.0, HEAD_STD[name])
        norms = [m for m in net.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
        for bn in norms:
            bn.reset_running_stats()
            bn.momentum = None
            bn.train()
        g = torch.Generator().manual_seed(7)
        for _ in range(2):
            net.backbone(torch.randn((2, 3, 320, 320), generator=g))
    net.eval()

    class Detections(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, x):
            found = self.net(list(x))[0]
            return found["boxes"], found["scores"], found["labels"]

    return Detections().eval()


def random_inputs(plan: dict[str, dict[str, Any]], which: int, seed: int) -> dict[str, Any]:
    """numpy inputs at shape `which` (0 min, 1 opt, 2 max, 3 odd)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = {}
    for name, spec in plan.items():
        shape = tuple(spec["shapes"][which])
        if spec["kind"] == "ids":
            out[name] = rng.integers(0, spec["high"], shape, dtype=np.int64)
        elif spec["kind"] == "ones":
            out[name] = np.ones(shape, np.int64)
        elif spec["kind"] == "uniform":
            out[name] = rng.random(shape, dtype=np.float32)
        else:
            out[name] = rng.standard_normal(shape, dtype=np.float32)
    return out


def static_plan(plan: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """`plan` with every shape at its opt and no dynamic axes (a static export)."""
    return {n: {**spec, "axes": {}, "shapes": [spec["shapes"][1]] * 4} for n, spec in plan.items()}


def export(name: str, folder: Path, dynamic: bool = True) -> None:
    """Write folder/<name>.onnx and its shape plan folder/<name>.json (`dynamic` False: static, at opt)."""
    import warnings

    import torch

    plan = shape_plan(name) if dynamic else static_plan(shape_plan(name))
    module = make_module(name, torch)
    feeds = {n: torch.from_numpy(v) for n, v in random_inputs(plan, 1, seed=1).items()}
    outputs = ["boxes", "scores", "labels"] if name in DETECTORS else ["out"]
    axes = {n: {int(a): d for a, d in spec["axes"].items()} for n, spec in plan.items()}
    if name not in DETECTORS and dynamic:
        axes["out"] = {0: "batch"}
    with warnings.catch_warnings():  # grad on, as benchmarks/torch_export.py: no_grad takes MultiheadAttention's
        warnings.simplefilter("ignore")  # fast path, aten::_native_multi_head_attention, which does not export
        torch.onnx.export(module, tuple(feeds.values()), str(folder / f"{name}.onnx"), input_names=list(feeds),
                          output_names=outputs, opset_version=OPSET, dynamo=False, dynamic_axes=axes)
    (folder / f"{name}.json").write_text(json.dumps({"model": name, "inputs": plan}, indent=1))


# ---- check (polykit) -----------------------------------------------------------------------------
def check_one(folder: Path, name: str, target: str, opt_level: int) -> dict[str, Any]:
    """Build one plan for the profile, save and load it (the table covers saved plans), run it at min,
    odd and max against onnxruntime."""
    import numpy as np
    import onnxruntime as ort

    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.compiler.plan.file import Plan
    from polykit.compiler.plan.profiles import Profile
    from polykit.errors import PolykitError
    from polykit.runtime.engine import Runtime

    path = folder / f"{name}.onnx"
    plan_spec = json.loads((folder / f"{name}.json").read_text())["inputs"]
    result: dict[str, Any] = {"model": name, "target": target, "dynamic": sorted({d for s in plan_spec.values()
                                                                                   for d in s["axes"].values()}),
                              "runs": {}, "passed": False, "error": None}
    stage = "build"
    try:
        start = time.time()
        dynamic = any(s["axes"] for s in plan_spec.values())
        profile = Profile({n: tuple(tuple(s["shapes"][k]) for k in range(3)) for n, s in plan_spec.items()})
        plan = build_plan(str(path), BuilderConfig(target=target, profiles=[profile] if dynamic else [],
                                                   builder_optimization_level=opt_level))
        result["build_s"] = round(time.time() - start, 1)
        stage = "save and load"
        data = plan.serialize()
        plan = Plan.deserialize(data, expect_target=target)
        result["plan_bytes"] = len(data)
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        worst = 0.0
        with Runtime().deserialize_engine(plan) as engine, engine.create_execution_context() as ctx:
            extra = len(next(iter(plan_spec.values()))["shapes"]) - 4  # float32-rounding shapes (rounding_sizes)
            labels = [("min", 0), ("odd", 3), ("max", 2)] + [(f"f32 {k + 1}", 4 + k) for k in range(extra)]
            for label, which in labels:
                stage = f"run at {label}"
                feeds = random_inputs(plan_spec, which, seed=10 + which)
                want = dict(zip(names, sess.run(None, feeds)))
                got = ctx.execute(feeds)
                run = {"shapes": {n: list(v.shape) for n, v in feeds.items()}, "ok": True}
                if name in DETECTORS and all(np.shape(got[n]) == want[n].shape for n in want):
                    got = pair_detections(want, got)
                    run["reordered"] = int(np.sum(got["order"] != np.arange(len(got["order"]))))
                for out, ref in want.items():
                    have = np.asarray(got[out])
                    if have.shape != ref.shape:
                        run.update(ok=False, mismatch=f"{out}: shape {list(have.shape)} vs onnxruntime's {list(ref.shape)}")
                        break
                    if ref.size:
                        err = float(np.max(np.abs(have.astype(np.float64) - ref.astype(np.float64))))
                        scale = max(1.0, float(np.max(np.abs(ref.astype(np.float64)))))
                        run["max_abs_error"] = max(run.get("max_abs_error", 0.0), err)
                        worst = max(worst, err)
                        if not err <= RELATIVE_TOLERANCE * scale:
                            run.update(ok=False, mismatch=f"{out}: max abs error {err:.3g} (scale {scale:.3g})")
                result["runs"][label] = run
        result["max_abs_error"] = worst
        result["passed"] = all(r["ok"] for r in result["runs"].values()) and len(result["runs"]) == len(labels)
        if not result["passed"]:
            result["error"] = next(f"{k}: {r['mismatch']}" for k, r in result["runs"].items() if not r["ok"])
    except PolykitError as exc:
        result["error"] = f"{stage}: {type(exc).__name__}: {exc.what} [{exc.where or ''}]"[:600]
    except Exception as exc:  # an internal error: the harness reports it and goes on
        result["error"] = f"{stage}: internal {type(exc).__name__}: {exc}"[:400]
        result["traceback"] = traceback.format_exc()[-2000:]
    return result


def pair_detections(want: dict[str, Any], got: dict[str, Any]) -> dict[str, Any]:
    """`got`'s detections reordered to pair with `want`'s: each reference detection (in order) takes
    the unpaired one of its label nearest in score and box. Two correct implementations may rank
    detections whose scores differ by less than their rounding either way (a random-weight
    detector has many); "order" says which of `got`'s rows each row is."""
    import numpy as np

    free = np.ones(len(want["scores"]), bool)
    order = np.zeros(len(want["scores"]), np.int64)
    span = max(1.0, float(np.abs(want["boxes"]).max(initial=0.0)))
    for i in range(len(order)):
        cost = np.abs(got["scores"] - want["scores"][i]) + np.abs(got["boxes"] - want["boxes"][i]).max(axis=1) / span
        cost[~free | (got["labels"] != want["labels"][i])] = np.inf
        j = int(np.argmin(cost)) if np.isfinite(cost).any() else i  # none of its label left: compare in place
        order[i], free[j] = j, False
    return {**{n: np.asarray(got[n])[order] for n in ("boxes", "scores", "labels")}, "order": order}


def check(folder: Path, names: list[str], target: str, opt_level: int, timeout: int,
          out: Path | None = None) -> list[dict[str, Any]]:
    """check-one of each model in a subprocess of its own (at most `timeout` seconds); with `out`,
    OUT.json and OUT.md rewritten after every model, so that a call cut short keeps what it finished."""
    results = []
    for name in names:
        if not (folder / f"{name}.onnx").exists():
            results.append({"model": name, "target": target, "passed": False, "error": "not exported"})
            continue
        start = time.time()
        cmd = [sys.executable, __file__, "check-one", "--dir", str(folder), "--models", name, "--target", target,
               "--opt-level", str(opt_level)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            line = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
            result = json.loads(line) if line.startswith("{") else \
                {"model": name, "target": target, "passed": False, "error": f"exit {done.returncode}: {done.stderr[-300:]}"}
        except subprocess.TimeoutExpired:
            result = {"model": name, "target": target, "passed": False, "error": f"timed out after {timeout} s"}
        result["seconds"] = round(time.time() - start, 1)
        print(f"{name}: {'pass' if result['passed'] else 'FAIL'} {result.get('max_abs_error', '')} "
              f"{result.get('error') or ''} ({result['seconds']} s)", flush=True)
        results.append(result)
        if out is not None:
            write_report(results, markdown, out)
    return results


def markdown(results: list[dict[str, Any]]) -> str:
    rows = ["| model | dynamic dims | result | min | odd | max | float32-rounding sizes | max abs error | error |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        runs = r.get("runs", {})
        cells = ["ok" if runs.get(k, {}).get("ok") else ("fail" if k in runs else "-") for k in ("min", "odd", "max")]
        rounding = [(v["shapes"], v["ok"]) for k, v in runs.items() if k.startswith("f32 ")]
        cells.append(", ".join(f"{'x'.join(map(str, next(iter(shapes.values()))[2:]))} {'ok' if ok else 'fail'}"
                               for shapes, ok in rounding) or "-")
        err = r.get("max_abs_error")
        rows.append(f"| {r['model']} | {', '.join(r.get('dynamic', []))} | {'pass' if r['passed'] else 'FAIL'} | "
                    f"{' | '.join(cells)} | {'' if err is None else f'{err:.2g}'} | "
                    f"{(r.get('error') or '').replace('|', '/')} |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("export", "check", "check-one", "all"))
    parser.add_argument("--dir", type=Path, required=True, help="where the exports (.onnx + .json) live")
    parser.add_argument("--models", default=",".join(model_names()), help="comma-separated names")
    parser.add_argument("--target", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--opt-level", type=int, default=None, help="builder optimization level (cpu: 0, cuda: 3)")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per model's check")
    parser.add_argument("--out", type=Path, default=None, help="write OUT.json and OUT.md")
    parser.add_argument("--torch-python", default=sys.executable, help="the interpreter that exports (step all)")
    parser.add_argument("--static", action="store_true", help="export without dynamic axes (at the opt shape)")
    args = parser.parse_args(argv)
    names = chosen_models(parser, args.models)
    opt_level = args.opt_level if args.opt_level is not None else (0 if args.target == "cpu" else 3)
    args.dir.mkdir(parents=True, exist_ok=True)
    if args.step == "check-one":
        print(json.dumps(check_one(args.dir, names[0], args.target, opt_level)))
        return 0
    if args.step in ("export", "all"):
        for name in names:
            if args.step == "all" and args.torch_python != sys.executable:
                subprocess.run([args.torch_python, __file__, "export", "--dir", str(args.dir), "--models", name]
                               + ["--static"] * args.static)
                continue
            try:
                export(name, args.dir, dynamic=not args.static)
                print(f"exported {name}", flush=True)
            except Exception as exc:  # an export the exporter refuses: reported, the others go on
                print(f"export of {name} failed: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
    if args.step in ("check", "all"):
        report(check(args.dir, names, args.target, opt_level, args.timeout, args.out), markdown, args.out)
    return 0


def chosen_models(parser: argparse.ArgumentParser, models: str) -> list[str]:
    """The comma-separated `models`, each one of model_names() (else the parser's usage error)."""
    names = [n for n in models.split(",") if n]
    unknown = sorted(set(names) - set(model_names()))
    if unknown:
        parser.error(f"unknown models {unknown}; known: {', '.join(model_names())}")
    return names


def report(results: list[dict[str, Any]], table: Any, out: Path | None) -> None:
    """Print `table(results)` (markdown); with `out`, write OUT.json (the results) and OUT.md (the table)."""
    if out is not None:
        write_report(results, table, out)
    print(table(results))


def write_report(results: list[dict[str, Any]], table: Any, out: Path) -> None:
    out.with_suffix(".json").write_text(json.dumps(results, indent=1))
    out.with_suffix(".md").write_text(table(results))


if __name__ == "__main__":
    sys.exit(main())

"""INT8 and FP8 ResNet-50 against fp16 on polykit's cuda target (issues 14 and 35), in one process.

Run on a GPU machine with torch and torchvision installed:

    PYTHONPATH=. python3 benchmarks/int8_resnet.py [--batch 32] [--precisions int8,fp8] [--calibrator entropy] \
        [--out int8.json] [--profile 15]

Exports torchvision's ResNet-50 (random weights, fixed seed; cuda_models.py's export), calibrates on
smooth structured images (bilinear upsamplings of coarse random grids, ImageNet-normalized: non-zero
and spatially correlated like photographs, unlike white noise), builds an fp16 plan and, per
--precisions, an INT8 plan (--int8, --calibrator) and an FP8 plan (--fp8: e4m3, minmax scales from the
same images), the layers that are not quantized in fp16 (TensorRT's int8+fp16 builds), all at the same
batch; checks each against torch's strict fp32 output on a held-out batch (cosine similarity, the
acceptance needs >= 0.99) and times them with CUDA events (median of --iters, alternating --rounds
so drift falls on all). Prints JSON (and writes it with --out): times, speed vs fp16, cosines, build
seconds, and per plan the count of its convolution / GEMM layers by kind, precision and tactic
(`products_by_tactic`: a layer that fell back to fp16 or float shows there). The calibration caches
are kept with --cache (DIR/resnet50.<precision>.cache). --profile N also prints, for every plan,
per-tactic totals and the N slowest layers of one eager profiled run (cuda_models.py's print_profile).
--torch eager|compile also times torch's fp16 model (eager; and torch.compile(mode="reduce-overhead")) in the
same rounds: `torch_fp16_*_ms` and each precision's speed against them.

`--target cpu --model PATH` runs the same steps without torch on an exported classifier (one input
[batch, 3, size, size]; --size): the cpu target's plans (ExecutionContext.execute, host timing), cosines
to onnxruntime's fp32 output: a check of the whole path on a machine without a GPU
(tests/benchmarks/test_lowp_benchmarks.py).
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import re
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.cuda_models import export, make_model, print_profile, profile_times
from benchmarks.cuda_timing import bind_host, bind_plan, time_cuda, time_host

MEAN = np.array([0.485, 0.456, 0.406], np.float32).reshape(1, 3, 1, 1)
STD = np.array([0.229, 0.224, 0.225], np.float32).reshape(1, 3, 1, 1)
PRECISIONS = ("int8", "fp8")
#: the layer kinds that hold a model's products (convolutions, GEMMs: float, fused or quantized)
PRODUCT_KINDS = ("Conv", "Gemm", "MatMul")


def smooth_images(seed: int, batch: int, size: int = 224, grid: int = 8) -> np.ndarray:
    """[batch, 3, size, size] float32: coarse uniform grids upsampled bilinearly, plus faint noise,
    normalized with ImageNet's mean and std (what torchvision's models expect)."""
    rng = np.random.default_rng(seed)
    grid = min(grid, size)
    coarse = rng.uniform(0.0, 1.0, (batch, 3, grid, grid)).astype(np.float32)
    pos = np.linspace(0, grid - 1, size, dtype=np.float32)
    lo = np.minimum(pos.astype(np.int64), grid - 2)
    frac = pos - lo
    rows = coarse[:, :, lo, :] * (1 - frac)[:, None] + coarse[:, :, lo + 1, :] * frac[:, None]
    img = rows[..., lo] * (1 - frac) + rows[..., lo + 1] * frac
    img = np.clip(img + rng.normal(0, 0.02, img.shape).astype(np.float32), 0, 1)
    return ((img - MEAN) / STD).astype(np.float32)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float((a @ b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def products_by_tactic(plan) -> dict[str, int]:
    """'kind precision tactic' -> count over the plan's convolution / GEMM layers."""
    return dict(collections.Counter(f"{layer.kind} {layer.precision} {layer.tactic}" for layer in plan.layers
                                    if any(k in layer.kind for k in PRODUCT_KINDS)))


#: the build log's lines that time a build's phases (polykit.compiler.builder.quantize, tuner.Tuner.finish)
PHASE_LINES = {"calibrate_s": re.compile(r"^calibration: .* in ([0-9.]+) s$"),
               "compile_s": re.compile(r"^tuning .*compiling took ([0-9.]+) s"),
               "time_s": re.compile(r"^tuning .*timing ([0-9.]+) s$")}


class BuildPhases(logging.Handler):
    """Collects a build's phase seconds from polykit's INFO log (calibration, the tuner's compiling and timing):
    `with BuildPhases() as phases: build_plan(...)`, then phases.seconds; the rest of a build (passes, lowering,
    the plan's own compile) is its total less these."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seconds: dict[str, float] = {}
        self._logger = logging.getLogger("polykit")

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        for key, pattern in PHASE_LINES.items():
            if m := pattern.search(text):
                self.seconds[key] = round(self.seconds.get(key, 0.0) + float(m[1]), 1)

    def __enter__(self) -> "BuildPhases":
        self._level = self._logger.level
        self._logger.addHandler(self)
        if self._logger.getEffectiveLevel() > logging.INFO:
            self._logger.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._level)


def report(result: dict, out: Path | None) -> None:
    """Print the result as JSON, and write it to `out` when given."""
    text = json.dumps(result, indent=2)
    print(text)
    if out is not None:
        out.write_text(text + "\n")


def build_configs(precisions, target: str, calibration, calibrator: str, cache_dir: Path) -> dict:
    """name -> BuilderConfig: fp16, then the quantized builds of `precisions` (fp16 for what they leave)."""
    from polykit.compiler.builder.config import BuilderConfig

    configs = {"fp16": BuilderConfig(target=target, fp16=True)}
    for name in precisions:
        configs[name] = BuilderConfig(target=target, fp16=True, int8=name == "int8", fp8=name == "fp8",
                                      calibration_data=calibration, calibrator=calibrator,
                                      calibration_cache=cache_dir / f"resnet50.{name}.cache")
    return configs


def faster_in_rounds(samples: dict, name: str) -> str:
    return f"{sum(q < f for f, q in zip(samples['fp16'], samples[name]))} of {len(samples['fp16'])}"


def first_outputs(bound: dict, torch) -> dict[str, np.ndarray]:
    """Each bound plan (cuda_timing.bind_plan / bind_host) run once: its first output, float32 numpy."""
    outs = {}
    for name, b in bound.items():
        b.run()
        if torch is not None:
            torch.cuda.synchronize()
        outs[name] = b.out.float().cpu().numpy() if torch is not None else np.asarray(b.out, np.float32)
    return outs


def timed_rounds(bound: dict, plans: dict, args, torch, title: str,
                 others: dict | None = None) -> tuple[dict[str, list[float]], dict]:
    """ms of each bound plan (and of each of `others`: name -> callable, torch's runs) in each of args.rounds
    rounds, all alternating within a round (drift or a neighbour's load falls on all alike): CUDA events on cuda,
    the host clock on cpu. Then, with
    args.profile on cuda, each plan's profile (print_profile, titled "<plan> <title>") and the layers of each
    plan beside their namesakes in the fp16 plan (compare_layers, printed; returned, else {}); the plans are
    closed."""
    runs = {**{name: b.run for name, b in bound.items()}, **(others or {})}
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, run in runs.items():
            samples[name].append(time_cuda(run, torch, args.warmup, args.iters) if torch is not None
                                 else time_host(run, args.warmup, args.iters))
    layers: dict = {}
    if args.profile and torch is not None:
        times = {name: profile_times(plans[name], b.engine, b.bindings, torch) for name, b in bound.items()}
        for name, b in bound.items():
            print_profile(f"{name} {title}", plans[name], b.engine, b.bindings, torch, args.profile, times=times[name])
        if "fp16" in times and len(times) > 1:
            layers = compare_layers(times, {name: {layer.name: layer.tactic for layer in plan.layers}
                                            for name, plan in plans.items()})
            print_comparison(layers, args.profile, title)
    for b in bound.values():
        b.close()
    return samples, layers


def torch_runs(model, dev_x, which: str, torch) -> dict:
    """torch's fp16 ResNet-50 (the exported model's weights) on `dev_x` as callables: eager, and with `which`
    "compile" torch.compile(mode="reduce-overhead") too (compiled and its CUDA graphs recorded here)."""
    fp16 = model.cuda().half().eval()
    x16 = dev_x.half()

    def eager():
        with torch.inference_mode():
            return fp16(x16)

    runs = {"torch_fp16_eager": eager}
    if which == "compile":
        compiled = torch.compile(fp16, mode="reduce-overhead")

        def graphs():
            with torch.inference_mode():
                return compiled(x16)

        for _ in range(3):  # compile, record the graphs
            graphs()
        runs["torch_fp16_compile"] = graphs
    return runs


def compare_layers(times: dict[str, list[tuple[str, float]]], tactics: dict[str, dict[str, str]],
                   base: str = "fp16") -> dict:
    """Each layer of the `base` plan beside its namesakes in the other plans (the compiler keeps a conv's or
    GEMM's node name whatever its precision): `rows`, one a base layer, {"layer", "<plan>_ms", "<plan>_tactic"}
    for every plan (None where a plan has no such layer), the layers where another plan loses most first;
    `unmatched_ms` / `unmatched_layers` per plan, its layers with no namesake in the base (the quantize, cast and
    reformat layers a low-precision plan adds) and the base's layers with none in any other; `total_ms` per plan
    (one eager run with per-layer events: launches included, so not the replayed plan's time)."""
    ms = {name: dict(t) for name, t in times.items()}
    others = [name for name in times if name != base]
    rows = []
    for layer, base_ms in times[base]:
        row = {"layer": layer}
        for name in (base, *others):
            row[f"{name}_ms"] = round(ms[name][layer], 4) if layer in ms[name] else None
            row[f"{name}_tactic"] = tactics[name].get(layer) if layer in ms[name] else None
        rows.append(row)

    def loss(row: dict) -> float:
        return max((row[f"{n}_ms"] - row[f"{base}_ms"] for n in others if row[f"{n}_ms"] is not None), default=0.0)

    rows.sort(key=loss, reverse=True)
    unmatched = {name: [(layer, t) for layer, t in times[name] if layer not in ms[base]] for name in others}
    unmatched[base] = [(layer, t) for layer, t in times[base] if not any(layer in ms[n] for n in others)]
    return {"base": base, "rows": rows,
            "unmatched_ms": {name: round(sum(t for _, t in v), 4) for name, v in unmatched.items()},
            "unmatched_layers": {name: len(v) for name, v in unmatched.items()},
            "total_ms": {name: round(sum(t for _, t in v), 4) for name, v in times.items()}}


def print_comparison(cmp: dict, top: int, title: str) -> None:
    """compare_layers' totals and its `top` rows (the layers where another plan loses most to the base)."""
    base = cmp["base"]
    names = list(cmp["total_ms"])
    print(f"-- layers beside {base}'s ({title}; one eager run each, ms): totals "
          + ", ".join(f"{n} {cmp['total_ms'][n]:.3f}" for n in names)
          + "; without a namesake " + ", ".join(f"{n} {cmp['unmatched_ms'][n]:.3f} ({cmp['unmatched_layers'][n]})"
                                               for n in names))
    for row in cmp["rows"][:top]:
        cells = "  ".join(f"{n} {row[f'{n}_ms']:.4f} {row[f'{n}_tactic'] or ''}" if row[f"{n}_ms"] is not None
                          else f"{n} -" for n in names)
        print(f"   {row['layer'][:44]:44} {cells}")


def round_stats(samples: dict[str, list[float]]) -> dict[str, dict]:
    """The median, the spread and every round's ms of each plan."""
    return {"ms": {name: round(statistics.median(ts), 3) for name, ts in samples.items()},
            "spread_ms": {name: round(max(ts) - min(ts), 3) for name, ts in samples.items()},
            "rounds_ms": {name: [round(t, 3) for t in ts] for name, ts in samples.items()}}


def main() -> None:
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.ops.quant.int8 import is_int8_layer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--precisions", default=",".join(PRECISIONS), help="quantized builds timed against fp16")
    parser.add_argument("--calibrator", default="entropy", choices=["entropy", "minmax", "percentile"],
                        help="INT8's (FP8 takes minmax scales whatever this says)")
    parser.add_argument("--calibration-batches", type=int, default=8)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cache", type=Path, default=None,
                        help="a folder for the calibration caches (read or written)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="also print per-tactic totals and the N slowest layers of each plan")
    parser.add_argument("--target", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--model", type=Path, default=None, help="an exported classifier instead of ResNet-50's export")
    parser.add_argument("--size", type=int, default=224, help="the image size of --model")
    parser.add_argument("--torch", default="", choices=("", "eager", "compile"),
                        help="cuda: also time torch's fp16 model in the same rounds: eager, or eager and "
                             "torch.compile(mode='reduce-overhead')")
    args = parser.parse_args()
    if args.torch and args.target != "cuda":
        parser.error("--torch times torch's fp16 model on the GPU: it needs --target cuda")
    precisions = [p for p in args.precisions.split(",") if p]
    if not set(precisions) <= set(PRECISIONS):
        parser.error(f"--precisions takes {', '.join(PRECISIONS)}; got {args.precisions!r}")
    torch = None
    if args.target == "cuda":
        import torch
    x = smooth_images(10_000, args.batch, args.size)
    calibration = [{"x": smooth_images(seed, args.batch, args.size)} for seed in range(args.calibration_batches)]
    plans, build_s, build_phases = {}, {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        path = args.model or Path(tmp) / f"resnet50_bs{args.batch}.onnx"
        if args.model is None:
            model = make_model("resnet50", torch)
            export("resnet50", model, {"x": torch.from_numpy(x)}, path, torch)
        cache_dir = args.cache or Path(tmp)
        cache_dir.mkdir(parents=True, exist_ok=True)
        for name, config in build_configs(precisions, args.target, calibration, args.calibrator, cache_dir).items():
            if name != "fp16":  # the model's input name, whatever the export called it
                config = type(config)(**{**config.__dict__, "calibration_data": [
                    {plans["fp16"].inputs[0]: b["x"]} for b in calibration]})
            t0 = time.perf_counter()
            with BuildPhases() as phases:
                plans[name] = build_plan(str(path), config)
            build_s[name] = round(time.perf_counter() - t0, 1)
            build_phases[name] = phases.seconds
        feeds = {plans["fp16"].inputs[0]: x}
        if torch is None:
            import onnxruntime as ort

            reference = "onnxruntime_fp32"
            ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    if torch is not None:
        reference = "torch_fp32"
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        dev_x = torch.from_numpy(x).cuda()
        with torch.inference_mode():
            ref = model.cuda()(dev_x).float().cpu().numpy()
        bound = {name: bind_plan(plan, {plan.inputs[0]: dev_x}, torch) for name, plan in plans.items()}
    else:
        bound = {name: bind_host(plan, feeds) for name, plan in plans.items()}
    cosines = {name: round(cosine(out, ref), 6) for name, out in first_outputs(bound, torch).items()}
    others = torch_runs(model, dev_x, args.torch, torch) if torch is not None and args.torch else {}
    samples, layers = timed_rounds(bound, plans, args, torch, f"bs{args.batch}", others)
    stats = round_stats(samples)
    ms = stats.pop("ms")
    result = {
        "model": "resnet50" if args.model is None else str(args.model), "batch": args.batch, "target": args.target,
        "device": torch.cuda.get_device_name() if torch is not None else "cpu",
        "calibrator": args.calibrator, "calibration_batches": args.calibration_batches, "fp16_ms": ms["fp16"],
    }
    for name in others:
        result[f"{name}_ms"] = ms[name]
    if others:
        result["torch"] = torch.__version__
    for name in precisions:
        result[f"{name}_ms"] = ms[name]
        result[f"speedup_{name}_vs_fp16"] = round(ms["fp16"] / ms[name], 3)
        for other in others:
            result[f"speedup_{name}_vs_{other}"] = round(ms[other] / ms[name], 3)
        # the rounds alternate the plans, so drift falls on all: compare them round by round
        result[f"{name}_faster_in_rounds"] = faster_in_rounds(samples, name)
    quantized = {name: [layer for layer in plans[name].layers if is_int8_layer(layer)] for name in precisions}
    result.update({
        **stats, f"cosine_vs_{reference}": cosines, "build_s": build_s, "build_phases_s": build_phases,
        **{f"{name}_layers_by_tactic": dict(collections.Counter(layer.tactic for layer in quantized[name]))
           for name in precisions},
        "products_by_tactic": {name: products_by_tactic(plan) for name, plan in plans.items()},
        "layer_kinds": {name: dict(collections.Counter(layer.kind for layer in plan.layers))
                        for name, plan in plans.items()},
    })
    if layers:
        result["layers_vs_fp16"] = layers
    report(result, args.out)


if __name__ == "__main__":
    main()

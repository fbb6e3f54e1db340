"""INT8 ResNet-50 against fp16 on polykit's cuda target (issue 14's acceptance), in one process.

Run on a GPU machine with torch and torchvision installed:

    PYTHONPATH=. python3 benchmarks/int8_resnet.py [--batch 32] [--calibrator entropy] [--out int8.json] [--profile 15]

Exports torchvision's ResNet-50 (random weights, fixed seed; cuda_models.py's export), calibrates on
smooth structured images (bilinear upsamplings of coarse random grids, ImageNet-normalized: non-zero
and spatially correlated like photographs, unlike white noise), builds an INT8 plan (--int8, the
layers that are not quantized in fp16, as TensorRT's int8+fp16 builds) and an fp16 plan at the same
batch, checks both against torch's strict fp32 output on a held-out batch (cosine similarity, the
acceptance needs >= 0.99 for INT8) and times them with CUDA events (median of --iters, alternating
--rounds so drift falls on both). Prints JSON (and writes it with --out): times, speedup, cosines,
INT8 layer counts by tactic, build seconds. The calibration cache is kept with --cache. --profile N
also prints, for both plans, per-tactic totals and the N slowest layers of one eager profiled run
(cuda_models.py's print_profile).
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.cuda_models import export, make_model, print_profile
from benchmarks.cuda_timing import bind_plan, time_cuda

MEAN = np.array([0.485, 0.456, 0.406], np.float32).reshape(1, 3, 1, 1)
STD = np.array([0.229, 0.224, 0.225], np.float32).reshape(1, 3, 1, 1)


def smooth_images(seed: int, batch: int, size: int = 224, grid: int = 8) -> np.ndarray:
    """[batch, 3, size, size] float32: coarse uniform grids upsampled bilinearly, plus faint noise,
    normalized with ImageNet's mean and std (what torchvision's models expect)."""
    rng = np.random.default_rng(seed)
    coarse = rng.uniform(0.0, 1.0, (batch, 3, grid, grid)).astype(np.float32)
    pos = np.linspace(0, grid - 1, size, dtype=np.float32)
    lo = np.minimum(pos.astype(np.int64), grid - 2)
    frac = pos - lo
    rows = coarse[:, :, lo, :] * (1 - frac)[:, None] + coarse[:, :, lo + 1, :] * frac[:, None]
    img = rows[..., lo] * (1 - frac) + rows[..., lo + 1] * frac
    img = np.clip(img + rng.normal(0, 0.02, img.shape).astype(np.float32), 0, 1)
    return ((img - MEAN) / STD).astype(np.float32)


def cosine(a, b) -> float:
    a, b = a.double().flatten(), b.double().flatten()
    return float((a @ b) / (a.norm() * b.norm()))


def main() -> None:
    import torch

    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.compiler.ops.quant.int8 import is_int8_layer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--calibrator", default="entropy", choices=["entropy", "minmax", "percentile"])
    parser.add_argument("--calibration-batches", type=int, default=8)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cache", type=Path, default=None, help="calibration cache to read or write")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="also print per-tactic totals and the N slowest layers of each plan")
    args = parser.parse_args()

    model = make_model("resnet50", torch)
    x = torch.from_numpy(smooth_images(10_000, args.batch))
    calibration = [{"x": smooth_images(seed, args.batch)} for seed in range(args.calibration_batches)]
    plans, build_s = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"resnet50_bs{args.batch}.onnx"
        export("resnet50", model, {"x": x}, path, torch)
        cache = args.cache or Path(tmp) / "resnet50.cache"
        configs = {"fp16": BuilderConfig(target="cuda", fp16=True),
                   "int8": BuilderConfig(target="cuda", fp16=True, int8=True, calibration_data=calibration,
                                         calibrator=args.calibrator, calibration_cache=cache)}
        for name, config in configs.items():
            t0 = time.perf_counter()
            plans[name] = build_plan(str(path), config)
            build_s[name] = round(time.perf_counter() - t0, 1)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    dev_x = x.cuda()
    with torch.inference_mode():
        ref = model.cuda()(dev_x).float()
    bound = {name: bind_plan(plan, {plan.inputs[0]: dev_x}, torch) for name, plan in plans.items()}
    cosines = {}
    for name, b in bound.items():
        b.run()
        torch.cuda.synchronize()
        cosines[name] = round(cosine(b.out.float(), ref), 6)
    samples = {name: [] for name in bound}
    for _ in range(args.rounds):
        for name, b in bound.items():
            samples[name].append(time_cuda(b.run, torch, args.warmup, args.iters))
    if args.profile:
        for name, b in bound.items():
            print_profile(f"{name} bs{args.batch}", plans[name], b.engine, b.bindings, torch, args.profile)
    for b in bound.values():
        b.close()
    ms = {name: round(statistics.median(ts), 3) for name, ts in samples.items()}
    int8_layers = [layer for layer in plans["int8"].layers if is_int8_layer(layer)]
    result = {
        "model": "resnet50", "batch": args.batch, "device": torch.cuda.get_device_name(),
        "calibrator": args.calibrator, "calibration_batches": args.calibration_batches,
        "fp16_ms": ms["fp16"], "int8_ms": ms["int8"], "speedup_int8_vs_fp16": round(ms["fp16"] / ms["int8"], 3),
        "spread_ms": {name: round(max(ts) - min(ts), 3) for name, ts in samples.items()},
        # the rounds alternate fp16 and int8, so drift falls on both: compare them round by round
        "rounds_ms": {name: [round(t, 3) for t in ts] for name, ts in samples.items()},
        "int8_faster_in_rounds": f"{sum(i < f for f, i in zip(samples['fp16'], samples['int8']))} of {args.rounds}",
        "cosine_vs_torch_fp32": cosines, "build_s": build_s,
        "int8_layers_by_tactic": dict(collections.Counter(layer.tactic for layer in int8_layers)),
        "layer_kinds": {name: dict(collections.Counter(layer.kind for layer in plan.layers)) for name, plan in plans.items()},
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()

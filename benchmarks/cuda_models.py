"""Time polykit's cuda target against PyTorch eager and torch.compile on ResNet-50 and BERT-base.

Run on a GPU machine with torch, torchvision and transformers installed:

    PYTHONPATH=. python3 benchmarks/cuda_models.py [--models resnet50,bert] [--out results.json]

For each model, batch size and precision (fp32, fp16, tf32) it exports the torch model to ONNX
(opset 21, random weights, fixed seed), builds a polykit plan for --target cuda, checks the
outputs against torch (fp32: max abs / relative error reported), then times both sides with
CUDA events: warm-up, then the median of `--iters` runs. polykit runs through
ExecutionContext.enqueue on torch tensors (CUDA-graph replay, no host copies); torch runs
eager under torch.inference_mode (fp16: model.half()) and, with --compile, as
torch.compile(mode="reduce-overhead") (its CUDA graphs) in the same process. Random weights,
fixed seed. Prints a table and writes JSON. Precision fp32 is strict float32 on both sides
(torch's allow_tf32 flags off, for cuDNN too); tf32 builds polykit with --tf32 and turns both of
torch's allow_tf32 flags on. `--levels 0,3` builds each case at several builder optimization
levels and times them in alternating rounds (`--rounds`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks import provenance
from benchmarks.cuda_timing import bind_plan, time_cuda
from benchmarks.torch_export import export_onnx

CASES = {"resnet50": [1, 32], "bert": [1, 8]}
SEQ = 128


def make_model(name: str, torch):
    """BERT-base for "bert", else the torchvision classifier of that name (resnet50,
    resnext50_32x4d, regnet_y_800mf, ...: cuda_kernels.py's cases), random weights."""
    torch.manual_seed(0)
    if name != "bert":
        import torchvision

        return getattr(torchvision.models, name)(weights=None).eval()
    from transformers import BertConfig, BertModel

    return BertModel(BertConfig()).eval()


def make_inputs(name: str, batch: int, torch, size: int = 224):
    g = torch.Generator().manual_seed(batch)
    if name != "bert":
        return {"x": torch.randn(batch, 3, size, size, generator=g)}
    return {"input_ids": torch.randint(0, 30522, (batch, SEQ), generator=g),
            "attention_mask": torch.ones(batch, SEQ, dtype=torch.int64)}


def export(name: str, model, inputs, path: Path, torch) -> None:
    export_onnx(model if name != "bert" else _BertOut(model, torch), inputs, path, torch)


class _BertOut:  # returns last_hidden_state only (a plain tensor output for ONNX)
    def __new__(cls, model, torch):
        class Wrap(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = model

            def forward(self, input_ids, attention_mask):
                return self.m(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

        return Wrap().eval()


def bench_case(name: str, batch: int, precision: str, args, torch) -> dict:
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig

    model = make_model(name, torch)
    inputs = make_inputs(name, batch, torch)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{name}_bs{batch}.onnx"
        export(name, model, inputs, path, torch)
        plans, build_s = {}, {}
        for level in args.levels:
            t0 = time.perf_counter()
            plans[level] = build_plan(str(path), BuilderConfig(target="cuda", fp16=precision == "fp16",
                                                               tf32=precision == "tf32",
                                                               fuse=not args.no_fuse,
                                                               builder_optimization_level=level))
            build_s[level] = round(time.perf_counter() - t0, 1)
    dev_model = model.cuda()
    if precision == "fp16":
        dev_model = dev_model.half()
    dev_inputs = {k: v.cuda() for k, v in inputs.items()}
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision == "tf32"
    torch_inputs = {k: (v.half() if v.is_floating_point() and precision == "fp16" else v) for k, v in dev_inputs.items()}
    with torch.inference_mode():
        call = (lambda: dev_model(torch_inputs["x"])) if name != "bert" else \
            (lambda: dev_model(**torch_inputs).last_hidden_state)
        ref = call().float()
        torch_ms = time_cuda(call, torch, args.warmup, args.iters)
        compile_ms = None
        if args.compile:
            compiled = torch.compile(dev_model, mode="reduce-overhead")
            ccall = (lambda: compiled(torch_inputs["x"])) if name != "bert" else \
                (lambda: compiled(**torch_inputs).last_hidden_state)
            for _ in range(3):  # compile, record the graphs
                ccall()
            compile_ms = time_cuda(ccall, torch, args.warmup, args.iters)
    runs, errors, closers = {}, {}, []
    for level, plan in plans.items():
        bound = bind_plan(plan, dev_inputs, torch)
        runs[level] = bound.run
        bound.run()
        torch.cuda.synchronize()
        err = (bound.out.float() - ref).abs()
        errors[level] = (float(err.max()), float(err.norm() / ref.norm()))
        if args.profile:
            print_profile(f"{name} bs{batch} {precision} level {level}", plan, bound.engine, bound.bindings, torch,
                          args.profile)
        closers.append(bound.close)
    # levels timed in alternating rounds, so clock drift or a neighbour's load falls on all of them alike
    samples = {level: [] for level in runs}
    for _ in range(args.rounds):
        for level, run in runs.items():
            samples[level].append(time_cuda(run, torch, args.warmup, args.iters))
    for close in closers:
        close()
    by_level = {level: round(statistics.median(ts), 3) for level, ts in samples.items()}
    main_level = args.levels[-1]
    polykit_ms = by_level[main_level]
    return {"model": name, "batch": batch, "precision": precision, "polykit_ms": polykit_ms,
            "polykit_ms_by_level": by_level, "spread_ms_by_level": {k: round(max(v) - min(v), 3) for k, v in samples.items()},
            "torch_eager_ms": round(torch_ms, 3), "speedup_vs_torch": round(torch_ms / polykit_ms, 3),
            "torch_compile_ms": None if compile_ms is None else round(compile_ms, 3),
            "max_abs_err": errors[main_level][0], "rel_err": errors[main_level][1], "build_s": build_s,
            "layers": len(plans[main_level].layers)}


def profile_times(plan, engine, bindings, torch, profile: int = 0) -> list[tuple[str, float]]:
    """(layer name, ms) of one eager run with per-layer CUDA events on optimization profile `profile` (a plan
    built for profiles runs the bindings' shapes)."""
    ctx = engine.create_execution_context(profile=True)
    ctx.set_optimization_profile(profile)
    for name in plan.inputs:
        ctx.set_input_shape(name, tuple(bindings[name].shape))
    ctx.enqueue(bindings, torch.cuda.current_stream())
    torch.cuda.synchronize()
    times = list(ctx.profile)
    ctx.close()
    return times


def print_profile(title: str, plan, engine, bindings, torch, top: int, profile: int = 0,
                  times: list[tuple[str, float]] | None = None) -> None:
    """Per-layer times of one eager run on optimization profile `profile` (profile_times, or `times`: such a
    run's): totals per tactic (that profile's), then the slowest layers."""
    if times is None:
        times = profile_times(plan, engine, bindings, torch, profile)
    layers = {lay.name: lay for lay in engine.profile_layers[profile]}
    total = sum(ms for _, ms in times)
    per_tactic: dict[str, list[float]] = {}
    for lname, ms in times:
        per_tactic.setdefault(layers[lname].tactic, []).append(ms)
    print(f"-- profile {title}: {total:.3f} ms in {len(times)} layers (eager launches)")
    for tac, v in sorted(per_tactic.items(), key=lambda kv: -sum(kv[1])):
        print(f"   {tac:28} {sum(v):8.3f} ms {100 * sum(v) / total:5.1f}%  x{len(v)}")
    for lname, ms in sorted(times, key=lambda t: -t[1])[:top]:
        lay = layers[lname]
        shapes = " ".join(str(tuple(plan.tensors[t].shape)) for t in (*lay.inputs[:2], *lay.outputs[:1]) if t in plan.tensors)
        print(f"   {ms:8.3f} ms  {lay.kind:12} {lay.tactic:20} {lname[:40]:40} {shapes}")


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,bert")
    parser.add_argument("--precisions", default="fp32,fp16")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--out", default="cuda_models.json")
    parser.add_argument("--no-fuse", action="store_true", help="build without the fusion passes")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="also print per-tactic totals and the N slowest layers of each case")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile(mode='reduce-overhead')")
    parser.add_argument("--cases", default="", help="only these cases, e.g. bert:8:fp16,resnet50:32:fp16")
    parser.add_argument("--levels", default="3", help="builder optimization levels to build and time, e.g. 0,3 "
                        "(the last is the one reported as polykit_ms)")
    parser.add_argument("--rounds", type=int, default=1, help="alternating timing rounds per level (median of rounds)")
    args = parser.parse_args()
    args.levels = [int(x) for x in args.levels.split(",")]
    rows = []
    todo = [(n, b, p) for n in args.models.split(",") for b in CASES[n] for p in args.precisions.split(",")]
    if args.cases:
        todo = [(n, int(b), p) for n, b, p in (c.split(":") for c in args.cases.split(","))]
    for name, batch, precision in todo:
        try:
            rows.append(bench_case(name, batch, precision, args, torch))
        except Exception as exc:  # record and go on: one failing case must not hide the others
            rows.append({"model": name, "batch": batch, "precision": precision,
                         "error": f"{type(exc).__name__}: {exc}"[:500]})
        print(json.dumps(rows[-1]), flush=True)
    meta = provenance.meta(torch, command="PYTHONPATH=. python3 benchmarks/cuda_models.py " + " ".join(os.sys.argv[1:]))
    Path(args.out).write_text(json.dumps({"meta": meta, "results": rows}, indent=2))
    print(f"\n{meta}")
    print(f"{'model':10} {'bs':>3} {'prec':5} {'polykit ms':>11} {'eager ms':>9} {'compile ms':>10} {'rel err':>9}")
    for r in rows:
        if "error" in r:
            print(f"{r['model']:10} {r['batch']:>3} {r['precision']:5} ERROR {r['error'][:80]}")
        else:
            cms = "-" if r.get("torch_compile_ms") is None else f"{r['torch_compile_ms']:.3f}"
            print(f"{r['model']:10} {r['batch']:>3} {r['precision']:5} {r['polykit_ms']:>11.3f} "
                  f"{r['torch_eager_ms']:>9.3f} {cms:>10} {r['rel_err']:>9.2e}  by level {r['polykit_ms_by_level']}")


if __name__ == "__main__":
    np.set_printoptions(precision=4)
    main()

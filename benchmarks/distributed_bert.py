"""BERT-base and BERT-large split tensor-parallel over 2 GPUs against the 1-GPU plan (issue 16).

Run on a machine with two or more GPUs (device kind nvidia-h200-x2 or larger), torch,
transformers and nccl4py installed (pip install 'polykit[multi-gpu]'):

    PYTHONPATH=. python3 benchmarks/distributed_bert.py [--models base,large] [--precision fp16]
        [--batch 1] [--iters 50] [--rounds 3] [--out distributed_bert.json]

For each model it exports the encoder (random weights, fixed seed; batch x 128 tokens) to ONNX,
builds the 1-GPU cuda plan and the two rank plans (BuilderConfig(ranks=2): polykit.compiler.
distributed), and runs them as rank processes (polykit.backends.rank_processes: one process per GPU, NCCL
between them) in alternating rounds: 1 rank on GPU 0, then 2 ranks on GPUs 0 and 1. Reported:
per-query latency (host to host, each round's median over --iters queries after warm-up; the
median of the rounds), each rank's weight bytes, and rank 0's output against the 1-GPU plan's
(max abs and relative L2 error; fp16 tolerance). With fewer than two GPUs it exits 2 saying so.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

SEQ = 128
#: transformers BertConfig arguments of each model (BERT-base is BertConfig's default)
MODELS = {"base": {}, "large": {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
                                "intermediate_size": 4096}}


def export(name: str, batch: int, path: Path) -> dict[str, np.ndarray]:
    """The model exported to `path`; the feeds of one query."""
    import torch
    from transformers import BertConfig, BertModel

    from benchmarks.cuda_models import _BertOut

    torch.manual_seed(0)
    model = BertModel(BertConfig(**MODELS[name])).eval()
    g = torch.Generator().manual_seed(batch)
    ids = torch.randint(0, 30522, (batch, SEQ), generator=g)
    mask = torch.ones(batch, SEQ, dtype=torch.int64)
    torch.onnx.export(_BertOut(model, torch), (ids, mask), str(path), input_names=["input_ids", "attention_mask"],
                      output_names=["out"], opset_version=21, dynamo=False)
    return {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}


def build(model: Path, folder: Path, precision: str, feeds: dict) -> tuple[list[Path], list[Path], float]:
    """(the 1-GPU plan, the rank plans, seconds the rank build took)."""
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.compiler.builder.distributed import build_rank_plans

    config = BuilderConfig(target="cuda", fp16=precision == "fp16",
                           input_shapes={n: tuple(a.shape) for n, a in feeds.items()})
    single = folder / f"{model.stem}.plan"
    build_plan(str(model), config).save(single)
    start = time.perf_counter()
    ranks = []
    for rank, plan in enumerate(build_rank_plans(str(model), replace(config, ranks=2))):
        ranks.append(folder / f"{model.stem}.rank{rank}.plan")
        plan.save(ranks[-1])
    return [single], ranks, round(time.perf_counter() - start, 1)


def accuracy(got: np.ndarray, want: np.ndarray) -> dict:
    g, w = got.astype(np.float64), want.astype(np.float64)
    return {"max_abs": float(np.max(np.abs(g - w))), "rel_l2": float(np.linalg.norm(g - w) / np.linalg.norm(w))}


def bench_model(name: str, args, folder: Path) -> dict:
    from polykit.backends.rank_processes import run_rank_processes

    model = folder / f"bert_{name}.onnx"
    feeds = export(name, args.batch, model)
    single, ranks, build_s = build(model, folder, args.precision, feeds)
    lat: dict[str, list[float]] = {"1": [], "2": []}
    runs = {}
    for _ in range(args.rounds):  # alternate, so drift (clocks, other tenants) hits both alike
        for key, paths in (("1", single), ("2", ranks)):
            runs[key] = run_rank_processes(paths, feeds, target="cuda", devices=list(range(len(paths))),
                                           timeout_s=args.timeout, iterations=args.iters, warmup=args.warmup)
            lat[key].append(statistics.median(runs[key][0].times_ms))
    return {
        "model": f"bert-{name}", "batch": args.batch, "seq": SEQ, "precision": args.precision,
        "rank_build_s": build_s,
        "latency_ms": {k: round(statistics.median(v), 3) for k, v in lat.items()},
        "latency_rounds_ms": {k: [round(x, 3) for x in v] for k, v in lat.items()},
        "weight_bytes": {k: [r.weight_bytes for r in runs[k]] for k in runs},
        "rank0_vs_1gpu": accuracy(runs["2"][0].outputs["out"], runs["1"][0].outputs["out"]),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="base,large")
    p.add_argument("--precision", choices=("fp32", "fp16"), default="fp16")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--timeout", type=float, default=900.0, help="seconds each run of the ranks may take")
    p.add_argument("--out", type=Path, default=Path("distributed_bert.json"))
    args = p.parse_args()
    from polykit.runtime.cuda.driver import device_count
    from polykit.runtime.cuda.nccl import unusable_reason

    gpus = device_count()
    if gpus < 2:
        print(f"distributed_bert needs 2 GPUs (device kind nvidia-h200-x2 or larger); this machine has {gpus}",
              file=sys.stderr)
        return 2
    reason = unusable_reason()
    if reason:
        print(f"distributed_bert needs NCCL: {reason}", file=sys.stderr)
        return 2
    results = []
    with tempfile.TemporaryDirectory(prefix="polykit-dist-bert-") as tmp:
        for name in args.models.split(","):
            results.append(bench_model(name.strip(), args, Path(tmp)))
            print(json.dumps(results[-1], indent=1))
    args.out.write_text(json.dumps({"gpus": gpus, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""BERT-base with explicit FP8 Q/DQ of its GEMMs against fp16 on polykit's cuda target (issue 35), in one process.

Run on a GPU machine with torch and transformers installed:

    PYTHONPATH=. python3 benchmarks/fp8_bert.py [--batch 8] [--seq 128] [--out fp8_bert.json] [--profile 15]

Exports BERT-base (random weights, fixed seed; cuda_models.py's export, static batch x seq), then
quantizes it as ModelOpt / onnxruntime export an FP8 model (polykit.tools.model.fp8_qdq): per-tensor
e4m3 scales (amax / 448) of every linear layer's input from a calibration pass of the float model's own
activations (--calibration-batches batches of random token ids, on the target), `Q -> DQ` on those
inputs, the weights as e4m3 initializers (per output channel) behind a DequantizeLinear; attention and
softmax stay as they are. Builds the fp16 plan of the float model and the fp16 plan of the Q/DQ model
(its linear layers FP8, the rest fp16), checks the FP8 plan against onnxruntime's reading of the same
Q/DQ model (CPU, float32) and against the fp16 plan, the fp16 plan against onnxruntime's float model,
and times both in alternating --rounds (median of --iters, CUDA events). Prints JSON (and writes it
with --out): times, speed vs fp16, the checks (cosine, max abs error), build seconds and per plan its
GEMM layers by kind, precision and tactic (int8_resnet.products_by_tactic).

`--target cpu --model PATH --vocab V` runs the same steps without torch on an exported BERT (inputs
input_ids and attention_mask, output out; dynamic axes are fixed at --batch x --seq): the cpu
target's plans and host timing, a check of the whole path on a machine without a GPU
(tests/benchmarks/test_lowp_benchmarks.py).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.cuda_models import export, make_model
from benchmarks.cuda_timing import bind_host, bind_plan
from benchmarks.dynamic_bert import VOCAB
from benchmarks.int8_resnet import (cosine, faster_in_rounds, first_outputs, products_by_tactic, report,
                                    round_stats, timed_rounds)


def token_feeds(seed: int, shape: tuple[int, int], vocab: int) -> dict[str, np.ndarray]:
    """Random token ids below `vocab` and an all-ones attention mask of `shape`."""
    ids = np.random.default_rng(seed).integers(0, vocab, shape).astype(np.int64)
    return {"input_ids": ids, "attention_mask": np.ones(shape, np.int64)}


def onnxruntime_output(model, feeds) -> np.ndarray:
    """onnxruntime's (CPU) first output with basic graph optimizations: its Q/DQ run as written (the extended
    level's ReluQuantFusion drops a Relu before a float8 QuantizeLinear, measured on 1.32)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def main() -> None:
    import onnx

    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.tools.model.fp8_qdq import calibrate_fp8, insert_fp8_qdq

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--calibration-batches", type=int, default=4)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--save-qdq", type=Path, default=None, help="also write the Q/DQ model here")
    parser.add_argument("--save-float", type=Path, default=None, help="also write the float model (fp16's) here")
    parser.add_argument("--save-only", action="store_true",
                        help="write --save-qdq / --save-float and stop (no plans built, nothing timed)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="also print per-tactic totals and the N slowest layers of each plan")
    parser.add_argument("--target", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--model", type=Path, default=None, help="an exported BERT instead of BERT-base's export")
    parser.add_argument("--vocab", type=int, default=VOCAB, help="the vocabulary size of --model")
    args = parser.parse_args()
    if args.save_only and args.save_qdq is None and args.save_float is None:
        parser.error("--save-only writes --save-qdq and / or --save-float: give at least one of them")
    torch = None
    if args.target == "cuda":
        import torch
    shape = (args.batch, args.seq)
    shapes = {"input_ids": shape, "attention_mask": shape}
    feeds = token_feeds(10_000, shape, args.vocab)
    calibration = [token_feeds(seed, shape, args.vocab) for seed in range(args.calibration_batches)]
    with tempfile.TemporaryDirectory() as tmp:
        path = args.model or Path(tmp) / f"bert_bs{args.batch}_s{args.seq}.onnx"
        if args.model is None:
            export("bert", make_model("bert", torch), {k: torch.from_numpy(v) for k, v in feeds.items()}, path, torch)
        model = onnx.load(str(path))
    t0 = time.perf_counter()
    scales = calibrate_fp8(model, calibration, input_shapes=shapes, target=args.target)
    calibrate_s = round(time.perf_counter() - t0, 1)
    qdq = insert_fp8_qdq(model, scales)
    if args.save_qdq is not None:
        onnx.save(qdq, str(args.save_qdq))
    if args.save_float is not None:
        onnx.save(model, str(args.save_float))
    if args.save_only:
        print(f"saved the models (calibration {calibrate_s} s); --save-only: nothing built")
        return
    plans, build_s = {}, {}
    for name, source in (("fp16", model), ("fp8", qdq)):
        t0 = time.perf_counter()
        plans[name] = build_plan(source, BuilderConfig(target=args.target, fp16=True, input_shapes=shapes))
        build_s[name] = round(time.perf_counter() - t0, 1)
    refs = {"fp16": onnxruntime_output(model, feeds), "fp8": onnxruntime_output(qdq, feeds)}
    if torch is not None:
        bound = {name: bind_plan(plan, {k: torch.from_numpy(v).cuda() for k, v in feeds.items()}, torch)
                 for name, plan in plans.items()}
    else:
        bound = {name: bind_host(plan, feeds) for name, plan in plans.items()}
    outs = first_outputs(bound, torch)
    checks = {
        "fp8_vs_onnxruntime_qdq": {"cosine": round(cosine(outs["fp8"], refs["fp8"]), 6),
                                   "max_abs_err": float(np.abs(outs["fp8"] - refs["fp8"]).max())},
        "fp8_vs_fp16_plan": {"cosine": round(cosine(outs["fp8"], outs["fp16"]), 6),
                             "max_abs_err": float(np.abs(outs["fp8"] - outs["fp16"]).max())},
        "fp16_vs_onnxruntime_fp32": {"cosine": round(cosine(outs["fp16"], refs["fp16"]), 6),
                                     "max_abs_err": float(np.abs(outs["fp16"] - refs["fp16"]).max())},
        "onnxruntime_qdq_vs_fp32": {"cosine": round(cosine(refs["fp8"], refs["fp16"]), 6)},
    }
    samples, layers = timed_rounds(bound, plans, args, torch, f"bert {args.batch}x{args.seq}")
    stats = round_stats(samples)
    ms = stats.pop("ms")
    result = {
        "model": "bert-base" if args.model is None else str(args.model), "batch": args.batch, "seq": args.seq,
        "target": args.target, "device": torch.cuda.get_device_name() if torch is not None else "cpu",
        "fp16_ms": ms["fp16"], "fp8_ms": ms["fp8"], "speedup_fp8_vs_fp16": round(ms["fp16"] / ms["fp8"], 3),
        "fp8_faster_in_rounds": faster_in_rounds(samples, "fp8"),
        **stats, "checks": checks, "quantized_inputs": len(scales), "calibrate_s": calibrate_s, "build_s": build_s,
        "products_by_tactic": {name: products_by_tactic(plan) for name, plan in plans.items()},
        "layers": {name: len(plan.layers) for name, plan in plans.items()},
    }
    if layers:
        result["layers_vs_fp16"] = layers
    report(result, args.out)


if __name__ == "__main__":
    main()

"""Time a BERT-base plan built for an optimization profile against the static plan of one shape.

Run on a GPU machine with torch and transformers installed:

    PYTHONPATH=. python3 benchmarks/dynamic_bert.py [--precision fp32|fp16] [--out dynamic_bert.json]

It exports BERT-base (random weights, fixed seed) to ONNX with dynamic batch and sequence axes,
builds one cuda plan for the profile batch 1-8 / sequence 16-512 / opt 8x128 and one static plan
for 8x128 (benchmarks/cuda_models.py's export and timing helpers), checks both against torch at
8x128, then times both at 8x128 in alternating rounds in one process (ExecutionContext.enqueue on
torch tensors, CUDA-graph replay; the median of --iters runs per round, the median of the
rounds reported), and the dynamic plan alone at other shapes of the profile. Prints the numbers
and writes JSON: the acceptance bar is dynamic within 10 % of static at 8x128.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.cuda_models import _BertOut, make_model, time_cuda

OPT = (8, 128)
PROFILE = ((1, 16), OPT, (8, 512))
OTHER_SHAPES = ((1, 16), (1, 128), (4, 77), (8, 512))


def export_dynamic(model, path: Path, torch) -> None:
    ids = torch.randint(0, 30522, OPT, generator=torch.Generator().manual_seed(0))
    axes = {0: "batch", 1: "seq"}
    torch.onnx.export(_BertOut(model, torch), (ids, torch.ones_like(ids)), str(path),
                      input_names=["input_ids", "attention_mask"], output_names=["out"], opset_version=21,
                      dynamic_axes={"input_ids": axes, "attention_mask": axes, "out": axes}, dynamo=False)


def build(path: Path, precision: str, dynamic: bool):
    from polykit.compiler.builder import build_plan
    from polykit.compiler.config import BuilderConfig
    from polykit.compiler.profiles import Profile

    shapes = {"input_ids": OPT, "attention_mask": OPT}
    extra = ({"profiles": [Profile({n: PROFILE for n in shapes})]} if dynamic else {"input_shapes": shapes})
    start = time.perf_counter()
    plan = build_plan(str(path), BuilderConfig(target="cuda", fp16=precision == "fp16", **extra))
    return plan, round(time.perf_counter() - start, 1)


class Runner:
    """A context of `plan` bound to torch tensors of one shape: run() enqueues on torch's stream."""

    def __init__(self, plan, shape: tuple[int, int], torch):
        from polykit.runtime.engine import Engine

        self.engine = Engine(plan)
        self.ctx = self.engine.create_execution_context()
        g = torch.Generator().manual_seed(shape[0] * 1000 + shape[1])
        self.feeds = {"input_ids": torch.randint(0, 30522, shape, generator=g).cuda(),
                      "attention_mask": torch.ones(shape, dtype=torch.int64).cuda()}
        for name, value in self.feeds.items():
            self.ctx.set_input_shape(name, tuple(value.shape))
        out = plan.outputs[0]
        self.out = torch.empty(self.ctx.get_tensor_shape(out), dtype=getattr(torch, plan.tensors[out].dtype),
                               device="cuda")
        self.bindings = {**self.feeds, out: self.out}
        self.stream = torch.cuda.current_stream()

    def run(self) -> None:
        self.ctx.enqueue(self.bindings, self.stream)

    def close(self) -> None:
        self.ctx.close()
        self.engine.close()


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", default="fp32", choices=("fp32", "fp16"))
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default="dynamic_bert.json")
    args = parser.parse_args()
    model = make_model("bert", torch)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bert_dynamic.onnx"
        export_dynamic(model, path, torch)
        (dynamic, dynamic_build_s), (static, static_build_s) = build(path, args.precision, True), \
            build(path, args.precision, False)
    runners = {"dynamic": Runner(dynamic, OPT, torch), "static": Runner(static, OPT, torch)}
    dev_model = model.cuda().half() if args.precision == "fp16" else model.cuda()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    with torch.inference_mode():
        ref = dev_model(**runners["static"].feeds).last_hidden_state.float()
    errors = {}
    for name, runner in runners.items():
        runner.run()
        torch.cuda.synchronize()
        errors[name] = float((runner.out.float() - ref).abs().max())
    samples = {name: [] for name in runners}
    for _ in range(args.rounds):  # alternating, so drift or a neighbour's load falls on both alike
        for name, runner in runners.items():
            samples[name].append(time_cuda(runner.run, torch, args.warmup, args.iters))
    at_opt = {name: round(statistics.median(ts), 3) for name, ts in samples.items()}
    others = {}
    for shape in OTHER_SHAPES:
        runner = Runner(dynamic, shape, torch)
        others[f"{shape[0]}x{shape[1]}"] = round(time_cuda(runner.run, torch, args.warmup, args.iters), 3)
        runner.close()
    for runner in runners.values():
        runner.close()
    result = {
        "precision": args.precision, "profile": {"min": PROFILE[0], "opt": PROFILE[1], "max": PROFILE[2]},
        "ms_at_8x128": at_opt, "dynamic_over_static": round(at_opt["dynamic"] / at_opt["static"], 3),
        "spread_ms": {k: round(max(v) - min(v), 3) for k, v in samples.items()},
        "dynamic_ms_at": others, "max_abs_err_vs_torch": errors,
        "build_s": {"dynamic": dynamic_build_s, "static": static_build_s},
        "layers": {"dynamic": len(dynamic.layers), "static": len(static.layers)},
        "device": torch.cuda.get_device_name(),
    }
    print(json.dumps(result, indent=2))
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

"""Time a BERT-base plan built for an optimization profile against the static plan of one shape.

Run on a GPU machine with torch and transformers installed:

    PYTHONPATH=. python3 benchmarks/dynamic_bert.py [--precision fp32|fp16] [--out dynamic_bert.json]

It exports BERT-base (random weights, fixed seed) to ONNX with dynamic batch and sequence axes,
builds one cuda plan for the profile batch 1-8 / sequence 16-512 / opt 8x128 and one static plan
for 8x128 (benchmarks/cuda_models.py's export and timing helpers), checks both against
onnxruntime at 8x128, then times both at 8x128 in alternating rounds in one process
(ExecutionContext.enqueue on torch tensors, CUDA-graph replay; the median of --iters runs per
round, the median of the rounds reported), and the dynamic plan alone at other shapes of the
profile. Prints the numbers and writes JSON: the acceptance bar is dynamic within 10 % of static
at 8x128.

`--profiles two` builds one plan for two optimization profiles instead (profile 0: batch 1-2 x
sequence 16-512, opt 1x128; profile 1: batch 1-8 x sequence 16-512, opt 8x128), whose layers
get a tactic per profile (polykit.kernels.profile_tactics), and times 1x128 on profile 0 and 8x128
on profile 1 against the static plans of those shapes (the same alternating rounds).

`--model PATH` takes an exported dynamic BERT instead (inputs input_ids, attention_mask with
dynamic batch/seq, output out; `--vocab` its vocabulary size), and `--target cpu` runs the same
steps on the cpu target without torch (ExecutionContext.execute, host timing): a check of the
whole path on a machine without a GPU, e.g. with the test suite's tiny BERT:

    PYTHONPATH=. python3 benchmarks/dynamic_bert.py --target cpu --vocab 1000 --iters 3 --rounds 1 \
        --model tiny_bert.onnx     # python3 -c "from tests.dynamic_models import tiny_bert; import onnx; \
                                   #   onnx.save(tiny_bert(), 'tiny_bert.onnx')"
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.cuda_models import _BertOut, make_model, print_profile
from benchmarks.cuda_timing import bind_plan, time_cuda, time_host

OPT = (8, 128)
PROFILE = ((1, 16), OPT, (8, 512))
OTHER_SHAPES = ((1, 16), (1, 128), (4, 77), (8, 512))
#: --profiles two: (min, opt, max) of each profile, and the shape timed on each (its opt)
TWO_PROFILES = (((1, 16), (1, 128), (2, 512)), ((1, 16), OPT, (8, 512)))
VOCAB = 30522


def export_dynamic(model, path: Path, torch) -> None:
    ids = torch.randint(0, VOCAB, OPT, generator=torch.Generator().manual_seed(0))
    axes = {0: "batch", 1: "seq"}
    torch.onnx.export(_BertOut(model, torch), (ids, torch.ones_like(ids)), str(path),
                      input_names=["input_ids", "attention_mask"], output_names=["out"], opset_version=21,
                      dynamic_axes={"input_ids": axes, "attention_mask": axes, "out": axes}, dynamo=False)


def build(path: Path, target: str, precision: str, profiles=None, shape=OPT):
    """A plan for `profiles` ((min, opt, max) of (batch, seq) each), or static for `shape` (None)."""
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.compiler.plan.profiles import Profile

    shapes = {"input_ids": shape, "attention_mask": shape}
    extra = ({"profiles": [Profile({n: r for n in shapes}) for r in profiles]} if profiles else {"input_shapes": shapes})
    start = time.perf_counter()
    plan = build_plan(str(path), BuilderConfig(target=target, fp16=precision == "fp16", **extra))
    return plan, round(time.perf_counter() - start, 1)


def feeds_for(shape: tuple[int, int], vocab: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(shape[0] * 1000 + shape[1])
    return {"input_ids": rng.integers(0, vocab, shape).astype(np.int64),
            "attention_mask": np.ones(shape, dtype=np.int64)}


class Runner:
    """A context of `plan` with `feeds` (numpy arrays by input name); run() runs it once: on cuda,
    enqueue on torch tensors on torch's stream (benchmarks/cuda_timing.bind_plan: copied through
    the arena, or with `in_place` bound with set_tensor_address as benchmarks/zoo.py times it); on
    cpu, execute."""

    def __init__(self, plan, feeds, torch=None, profile: int = 0, in_place: bool = False):
        from polykit.runtime.engine import Engine

        self.feeds = dict(feeds)
        self.torch = torch
        self.name = plan.outputs[0]
        if torch is None:
            self.engine = Engine(plan)
            self.ctx = self.engine.create_execution_context()
            self.ctx.set_optimization_profile(profile)
            return
        self.bound = bind_plan(plan, {k: torch.from_numpy(v).cuda() for k, v in self.feeds.items()}, torch, in_place,
                               profile)
        self.engine, self.ctx, self.out, self.bindings = self.bound.engine, self.bound.ctx, self.bound.out, \
            self.bound.bindings

    def run(self) -> None:
        if self.torch is None:
            self.out = self.ctx.execute(self.feeds)[self.name]
        else:
            self.bound.run()

    def output(self) -> np.ndarray:
        self.run()
        if self.torch is None:
            return np.asarray(self.out, dtype=np.float32)
        self.torch.cuda.synchronize()
        return self.out.float().cpu().numpy()

    def close(self) -> None:
        self.ctx.close()
        self.engine.close()


def reference(path: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def alternate(runners: dict, rounds: int, timed) -> tuple[dict, dict]:
    """(median ms, spread ms) per runner over `rounds` alternating rounds, so drift or a
    neighbour's load falls on all alike."""
    samples = {name: [] for name in runners}
    for _ in range(rounds):
        for name, runner in runners.items():
            samples[name].append(timed(runner))
    return ({name: round(statistics.median(ts), 3) for name, ts in samples.items()},
            {name: round(max(ts) - min(ts), 3) for name, ts in samples.items()})


def two_profiles(path: Path, args, torch, timed) -> dict:
    """--profiles two: one plan for TWO_PROFILES against the static plan of each profile's opt."""
    dynamic, dynamic_build_s = build(path, args.target, args.precision, TWO_PROFILES)
    result = {"profiles": [{"min": r[0], "opt": r[1], "max": r[2]} for r in TWO_PROFILES],
              "layers_with_per_profile_tactics": sum(bool(l.profile_tactics) for l in dynamic.layers),
              "layers": len(dynamic.layers), "build_s": {"dynamic": dynamic_build_s}, "ms": {}, "spread_ms": {},
              "dynamic_over_static": {}, "max_abs_err_vs_onnxruntime": {}}
    for profile, (_, shape, _) in enumerate(TWO_PROFILES):
        static, static_build_s = build(path, args.target, args.precision, None, shape)
        feeds = feeds_for(shape, args.vocab)
        runners = {"dynamic": Runner(dynamic, feeds, torch, profile), "static": Runner(static, feeds, torch)}
        ref = reference(path, runners["static"].feeds)
        key = f"{shape[0]}x{shape[1]} on profile {profile}"
        result["max_abs_err_vs_onnxruntime"][key] = {n: float(np.abs(r.output() - ref).max()) for n, r in runners.items()}
        result["ms"][key], result["spread_ms"][key] = alternate(runners, args.rounds, timed)
        result["dynamic_over_static"][key] = round(result["ms"][key]["dynamic"] / result["ms"][key]["static"], 3)
        result["build_s"][f"static {shape[0]}x{shape[1]}"] = static_build_s
        if args.profile and torch is not None:
            for name, runner in runners.items():
                print_profile(f"{name} {key}", runner.engine.plan, runner.engine, runner.bindings, torch, args.profile,
                              profile if name == "dynamic" else 0)
        for runner in runners.values():
            runner.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", default="fp32", choices=("fp32", "fp16"))
    parser.add_argument("--target", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--model", default=None, help="an exported dynamic BERT instead of BERT-base's export")
    parser.add_argument("--vocab", type=int, default=VOCAB, help="the vocabulary size of --model")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default="dynamic_bert.json")
    parser.add_argument("--profiles", default="one", choices=("one", "two"),
                        help="two: one plan for two profiles, each timed at its opt against a static plan")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="cuda: also print both plans' per-tactic totals and N slowest layers at 8x128, and "
                        "the host time of one enqueue call (no sync) for each")
    args = parser.parse_args()
    torch = None
    if args.target == "cuda":
        import torch

        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False

    def timed(runner: Runner) -> float:
        if torch is None:
            return time_host(runner.run, args.warmup, args.iters)
        return time_cuda(runner.run, torch, args.warmup, args.iters)

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.model) if args.model else Path(tmp) / "bert_dynamic.onnx"
        if not args.model:
            import torch as exporter

            export_dynamic(make_model("bert", exporter), path, exporter)
        if args.profiles == "two":
            result = {"target": args.target, "model": args.model or "bert-base", "precision": args.precision,
                      **two_profiles(path, args, torch, timed),
                      "device": torch.cuda.get_device_name() if torch is not None else "cpu"}
            print(json.dumps(result, indent=2))
            Path(args.out).write_text(json.dumps(result, indent=2))
            return
        (dynamic, dynamic_build_s), (static, static_build_s) = build(path, args.target, args.precision, [PROFILE]), \
            build(path, args.target, args.precision)
        feeds = feeds_for(OPT, args.vocab)
        runners = {"dynamic": Runner(dynamic, feeds, torch), "static": Runner(static, feeds, torch)}
        ref = reference(path, runners["static"].feeds)
    errors = {name: float(np.abs(runner.output() - ref).max()) for name, runner in runners.items()}
    at_opt, spread = alternate(runners, args.rounds, timed)
    host_ms = {}
    if args.profile and torch is not None:
        for name, runner in runners.items():
            print_profile(f"{name} 8x128", runner.engine.plan, runner.engine, runner.bindings, torch, args.profile)
            host_ms[name] = round(time_host(runner.run, args.warmup, args.iters), 3)
            torch.cuda.synchronize()
    others = {}
    for shape in OTHER_SHAPES:
        runner = Runner(dynamic, feeds_for(shape, args.vocab), torch)
        others[f"{shape[0]}x{shape[1]}"] = round(timed(runner), 3)
        runner.close()
    for runner in runners.values():
        runner.close()
    result = {
        "target": args.target, "model": args.model or "bert-base", "precision": args.precision,
        "profile": {"min": PROFILE[0], "opt": PROFILE[1], "max": PROFILE[2]},
        "ms_at_8x128": at_opt, "dynamic_over_static": round(at_opt["dynamic"] / at_opt["static"], 3),
        "spread_ms": spread,
        "dynamic_ms_at": others, "max_abs_err_vs_onnxruntime": errors,
        "build_s": {"dynamic": dynamic_build_s, "static": static_build_s},
        "layers": {"dynamic": len(dynamic.layers), "static": len(static.layers)},
        "host_enqueue_ms_at_8x128": host_ms,
        "device": torch.cuda.get_device_name() if torch is not None else "cpu",
    }
    print(json.dumps(result, indent=2))
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

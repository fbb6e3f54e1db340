"""Weight streaming latency: one model built --weight-streaming, timed at budgets all / half /
quarter / none of its streamable weights resident (docs/WEIGHT_STREAMING.md, docs/PERFORMANCE.md).

    PYTHONPATH=$PWD python benchmarks/weight_streaming.py /work/zoo_cache/resnet50_bs1.onnx --target cuda
    PYTHONPATH=$PWD python benchmarks/weight_streaming.py MODEL.onnx --target cpu --iterations 3   # a smoke run

For each budget it prints the resident and scratch bytes, the copies of one run, and the median
and min latency of `--iterations` runs of ExecutionContext.execute after `--warm-up` runs (on
cuda the runs after the first replay a CUDA graph that holds the copies); it checks that every
budget's outputs are bit-identical to the all-resident run's and exits 1 if one is not.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

BUDGETS = (("all", 1.0), ("half", 0.5), ("quarter", 0.25), ("none", 0.0))


def random_feeds(engine):
    import numpy as np

    rng = np.random.default_rng(0)
    feeds = {}
    for name, desc in engine.input_metadata.items():
        if desc.np_dtype.kind == "f":
            feeds[name] = rng.standard_normal(desc.shape).astype(desc.np_dtype)
        else:
            feeds[name] = rng.integers(0, 2, desc.shape).astype(desc.np_dtype)  # ids / masks: small valid values
    return feeds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--target", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--fp16", action="store_true")
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--warm-up", type=int, default=5)
    parser.add_argument("--optimization-level", type=int, default=3)
    args = parser.parse_args(argv)

    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.runtime.engine import Engine

    start = time.perf_counter()
    plan = build_plan(args.model, BuilderConfig(target=args.target, fp16=args.fp16, weight_streaming=True,
                                                builder_optimization_level=args.optimization_level))
    print(f"built {args.model} for {args.target} in {time.perf_counter() - start:.1f} s", flush=True)
    engine = Engine(plan)
    feeds = random_feeds(engine)
    streamable = engine.streamable_weights_size
    print(f"streamable weights: {streamable / 2**20:.1f} MiB")
    print(f"{'budget':<8} {'resident MiB':>12} {'scratch MiB':>11} {'copies':>6} {'median ms':>10} {'min ms':>8}  outputs")
    reference, failed = None, 0
    for label, fraction in BUDGETS:
        engine.set_weight_streaming_budget(int(streamable * fraction))
        with engine.create_execution_context() as ctx:
            out = ctx.execute(feeds)
            for _ in range(args.warm_up):
                ctx.execute(feeds)
            times = []
            for _ in range(args.iterations):
                t0 = time.perf_counter()
                ctx.execute(feeds)
                times.append((time.perf_counter() - t0) * 1e3)
        schedule = engine._streaming.schedule()
        copies = len(schedule.copies) if schedule is not None else 0
        if reference is None:
            reference, same = out, "reference"
        else:
            ok = all(out[n].tobytes() == reference[n].tobytes() for n in reference)
            failed += not ok
            same = "bit-identical" if ok else "DIFFER"
        print(f"{label:<8} {engine._streaming.resident_bytes() / 2**20:>12.1f} "
              f"{engine.weight_streaming_scratch_memory_size / 2**20:>11.1f} {copies:>6} "
              f"{statistics.median(times):>10.3f} {min(times):>8.3f}  {same}", flush=True)
    engine.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""One W4A16 layer (benchmarks/weight_only_gemm.py's model) with its tactic pinned, run a few times: what ncu profiles.

    PYTHONPATH=. ncu --set full --kernel-name regex:weight_only_mma_rows --launch-skip 2 --launch-count 1 \
        python3 benchmarks/weight_only_one.py --m 1 --tactics cuda.weight_only.mma_rows_n16_k4096

Each tactic's plan is built at level 0 with the tactic forced (`tactic_replay`), bound to torch tensors and run
--runs times; its CUDA-event median over those runs is printed (ncu's replays make it meaningless under ncu).
"""

from __future__ import annotations

import argparse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, default=1)
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--k", type=int, default=4096)
    parser.add_argument("--block", type=int, default=128)
    parser.add_argument("--weight", default="int4")
    parser.add_argument("--tactics", required=True, help="comma-separated cuda.weight_only tactic names")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    import torch

    from benchmarks.cuda_timing import bind_plan, time_cuda
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.compiler.graph.onnx_import import load_onnx
    from tests.compiler.weight_only_models import weight_only

    model = load_onnx(weight_only(args.weight, k=args.k, n=args.n, block=args.block, x_shape=(args.m, None),
                                  elem="float16"))
    x = torch.randn(args.m, args.k, device="cuda", dtype=torch.float16)
    for tactic in args.tactics.split(","):
        plan = build_plan(model, BuilderConfig(target="cuda", builder_optimization_level=0,
                                               tactic_replay={"fc": tactic}))
        assert plan.metadata["tactics"]["fc"] == tactic, plan.metadata["tactics"]
        bound = bind_plan(plan, {"x": x}, torch)
        ms = time_cuda(bound.run, torch, 1, args.runs)
        print(f"{tactic}: M={args.m} {ms * 1e3:.1f} us a run (enqueue included)", flush=True)
        bound.close()


if __name__ == "__main__":
    main()

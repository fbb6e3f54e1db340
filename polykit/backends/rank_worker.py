"""One rank of a distributed run, as its own process (started by polykit.backends.rank_processes).

    python -m polykit.backends.rank_worker --plan model.rank1.plan --rank 1 --ranks 2 --target cuda
        --device 1 --nccl-id HEX --feeds feeds.npz --out out1.npz --stats stats1.json

Loads the rank's plan on its CUDA device (the ordinal given, never a remapped one), joins
the NCCL group when the plan has collective layers, runs `--warmup` then `--iterations`
queries and writes the last outputs (.npz) and each query's milliseconds and the plan's
weight bytes (JSON). A PolykitError exits with its code after one line on stderr naming the
rank; the parent reads the tail of stderr into its RankError. On the cpu target a plan
with collectives runs only as a single rank (ranks in separate processes have no cpu
communicator between them: simulate them in one process instead).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from polykit.errors import PolykitError, RankError, UsageError
from polykit.runtime.cuda.nccl import COLLECTIVE_KIND, NCCL_ENV
from polykit.backends.rank_processes import read_arrays, write_arrays


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m polykit.backends.rank_worker", description=__doc__.splitlines()[0])
    p.add_argument("--plan", required=True, type=Path)
    p.add_argument("--rank", required=True, type=int)
    p.add_argument("--ranks", required=True, type=int)
    p.add_argument("--target", required=True, choices=("cpu", "cuda"))
    p.add_argument("--device", type=int, default=None, help="CUDA device ordinal of this rank (cuda)")
    p.add_argument("--nccl-id", default="", help="the group's NCCL unique id, hex (cuda)")
    p.add_argument("--feeds", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--stats", required=True, type=Path)
    p.add_argument("--iterations", type=int, default=1)
    p.add_argument("--warmup", type=int, default=0)
    p.add_argument("--timeout", type=float, default=60.0, help="seconds a collective may wait for its peers")
    return p.parse_args(argv)


def check_rank(plan: Any, rank: int, ranks: int) -> None:
    """The plan is this rank's: its metadata rank and group size (where recorded) match."""
    for key, have in (("rank", rank), ("ranks", ranks)):
        want = plan.metadata.get(key)
        if want is not None and int(want) != have:
            raise RankError(f"rank {rank}: the plan was built for {key} {want}, it runs as {key} {have}",
                            hint="pass the rank plans in rank order (model.rank0.plan, model.rank1.plan, ...)")


def communicator(args: argparse.Namespace, plan: Any) -> Any:
    """The rank's communicator when the plan has collective layers, else None."""
    if not any(layer.kind == COLLECTIVE_KIND for layer in plan.layers):
        return None
    if args.target == "cpu":
        if args.ranks != 1:
            raise UsageError(f"rank {args.rank}: cpu ranks in separate processes have no communicator between them",
                             hint="simulate the cpu ranks in one process (polykit.runtime.collectives.SimulatedGroup)")
        from polykit.runtime.collectives import SimulatedGroup

        return SimulatedGroup(1, timeout_s=args.timeout).communicator(0)
    if not args.nccl_id:
        raise UsageError(f"rank {args.rank}: the plan has collective layers and no NCCL unique id was given",
                         hint="start ranks with polykit.backends.rank_processes.run_ranks where NCCL is usable (it makes "
                              "one): pip install 'polykit[multi-gpu]' and the NCCL library")
    from polykit.runtime.cuda.nccl import NcclCommunicator

    return NcclCommunicator(args.rank, args.ranks, bytes.fromhex(args.nccl_id), args.device, args.timeout)


def run(args: argparse.Namespace) -> None:
    from polykit.compiler.plan.file import Plan
    from polykit.runtime.engine import Engine

    plan = Plan.load(args.plan, expect_target=args.target)
    check_rank(plan, args.rank, args.ranks)
    feeds = read_arrays(args.feeds)
    target = None
    if args.target == "cuda":
        from polykit.runtime.cuda.target import CudaTarget

        target = CudaTarget(device=args.device if args.device is not None else args.rank)
    comm = None
    engine = Engine(plan, target)
    try:
        comm = communicator(args, plan)
        with engine.create_execution_context(**({"communicator": comm} if comm is not None else {})) as ctx:
            times = []
            outputs: dict[str, np.ndarray] = {}
            for i in range(args.warmup + args.iterations):
                start = time.perf_counter()
                outputs = ctx.execute(feeds)
                if i >= args.warmup:
                    times.append((time.perf_counter() - start) * 1e3)
    finally:
        if comm is not None:
            comm.close()
        engine.close()
    write_arrays(args.out, outputs)
    args.stats.write_text(json.dumps({"times_ms": times, "weight_bytes": int(plan.weight_bytes)}))


def main(argv: list[str] | None = None) -> int:
    os.environ.update(NCCL_ENV)
    args = parse(argv)
    try:
        run(args)
    except PolykitError as exc:
        print(f"rank {args.rank}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())

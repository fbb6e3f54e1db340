"""The engine's host time per ExecutionContext.enqueue, without a GPU: copies vs in place.

    PYTHONPATH=. python3 benchmarks/enqueue_host.py MODEL.onnx [MODEL2.onnx ...] [--iters 2000] [--profile]

A timed run (benchmarks/cuda_timing.time_cuda, the zoo) starts from an idle GPU, so every host
microsecond between the start event and the graph launch is in the measured time: at batch 1 the
engine's host path is a few percent of a run. This builds each model's cuda fp16 plan at builder
level 0 (no device needed) and runs ExecutionContext.enqueue against a target context whose
driver work is a no-op (no copies, no graph launch) but whose placement of caller buffers is the
cuda target's own (CudaContext.bind_addresses): what remains is the engine's Python, the part
this machine can measure. Driver calls (cuMemcpyDtoDAsync per copied I/O tensor, cuGraphLaunch)
come on top on a GPU machine; benchmarks/serving_api.py reports the whole host time there.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
import types
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from polykit.compiler.builder.builder import build_plan  # noqa: E402
from polykit.compiler.builder.config import BuilderConfig  # noqa: E402
from polykit.kernels.cuda.base import DeviceTensor  # noqa: E402
from polykit.kernels.profile_tactics import profile_layers  # noqa: E402
from polykit.runtime.cuda.target import CudaContext  # noqa: E402
from polykit.runtime.engine import ExecutionContext  # noqa: E402
from polykit.runtime.io_binding import input_consumed_at, view_groups  # noqa: E402


class _Replay:
    def launch(self, stream):
        pass

    def close(self):
        pass


class NoDriverContext:
    """A cuda TargetContext whose driver work does nothing; its caller-buffer placement is the
    cuda target's (the memo of the addresses bound last included)."""

    stream, io_alignment, can_capture, has_memory = None, 256, True, True
    bind_addresses = CudaContext.bind_addresses

    def __init__(self, plan):
        self.engine = types.SimpleNamespace(plan=plan)
        self.tensors = {n: DeviceTensor(0x10000 + i * 4096, tuple(d.shape), d.np_dtype)
                        for i, (n, d) in enumerate(plan.tensors.items())}
        self._elsewhere, self._moved = set(), {}
        self._view_groups, self._placed_key, self._placed_copies = view_groups(plan.memory.aliases), (), frozenset()

    def io_pointer(self, binding, name, shape, dtype):
        return int(binding)

    def borrow_stream(self, stream):
        return stream

    def capture(self, record):
        return _Replay()

    def copy_in_device(self, *args):
        pass

    copy_out_device = signal = begin = copy_values = launch = bind_shapes = synchronize = close = copy_in_device


def measure(path: str, iters: int, profile: bool) -> dict:
    plan = build_plan(path, BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0))
    engine = types.SimpleNamespace(plan=plan, profile_layers=[profile_layers(plan, 0)],
                                   profiling_verbosity="layer_names_only",
                                   io_tensors=[*plan.inputs, *plan.outputs], input_consumed_layer=input_consumed_at(plan),
                                   num_layers=len(plan.layers))
    addresses = {name: 0x7F0000000000 + i * (1 << 24) for i, name in enumerate(engine.io_tensors)}
    row = {"model": Path(path).stem, "layers": len(plan.layers), "views": len(plan.memory.aliases)}
    for mode in ("copies", "in_place"):
        ctx = ExecutionContext(engine, NoDriverContext(plan))
        if mode == "in_place":
            for name, address in addresses.items():
                ctx.set_tensor_address(name, address)
            run = lambda: ctx.enqueue(stream=None)  # noqa: E731
        else:
            run = lambda: ctx.enqueue(addresses, None)  # noqa: E731
        for _ in range(5):  # the first runs of a set of addresses capture
            run()
        t0 = time.perf_counter()
        for _ in range(iters):
            run()
        row[f"{mode}_us"] = round((time.perf_counter() - t0) / iters * 1e6, 1)
        if profile:
            prof = cProfile.Profile()
            prof.runcall(lambda: [run() for _ in range(iters)])
            print(f"--- {row['model']} {mode}")
            pstats.Stats(prof).sort_stats("tottime").print_stats(10)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--profile", action="store_true", help="also print cProfile's top functions per mode")
    args = parser.parse_args()
    for path in args.models:
        row = measure(path, args.iters, args.profile)
        print(f"{row['model']:28} {row['layers']:4} layers {row['views']:4} views  host us per enqueue: "
              f"copies {row['copies_us']:6.1f}  in place {row['in_place_us']:6.1f}")


if __name__ == "__main__":
    main()

"""What the model benchmarks share to time polykit and torch on one GPU in one process.

`time_cuda` gives the median CUDA-event time of a callable (after warm-up runs); `bind_plan`
loads a polykit plan on the cuda target and binds it to torch device tensors (a plan built for
profiles at those tensors' shapes), so that one
`run()` is one `ExecutionContext.enqueue` on torch's current stream (CUDA-graph replay after
the first call, no host copies) writing the plan's first output into a torch tensor: the
tensors copied into and out of the context's arena, or with `in_place` bound with
set_tensor_address so the layers read and write them directly. `time_host` and `bind_host` are the
same on the cpu target (a benchmark's path without a GPU: host clock, ExecutionContext.execute).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping


def time_cuda_queued(fn: Callable[[], Any], torch, warmup: int, iters: int, repeat: int) -> float:
    """Median milliseconds of one run of `fn` when `repeat` runs are queued back to back between two CUDA events
    (the host enqueues ahead of the GPU, so a short plan's launch latency falls between the runs' work only
    once a measurement), over `iters` measurements after `warmup` runs."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeat):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / repeat)
    return statistics.median(times)


def time_cuda(fn: Callable[[], Any], torch, warmup: int, iters: int) -> float:
    """Median milliseconds of `iters` runs of `fn`, each between two CUDA events, after `warmup` runs."""
    return time_cuda_queued(fn, torch, warmup, iters, 1)


def time_host(fn: Callable[[], Any], warmup: int, iters: int) -> float:
    """Median milliseconds of `iters` runs of `fn` on the host clock, after `warmup` runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


@dataclass
class BoundPlan:
    """A plan's engine and context over torch tensors: `run()` enqueues once, `out` holds the
    first output, `bindings` every bound tensor by name."""

    engine: Any
    ctx: Any
    run: Callable[[], None]
    out: Any
    bindings: dict[str, Any]

    def close(self) -> None:
        self.ctx.close()
        self.engine.close()


def bind_plan(plan, inputs: Mapping[str, Any], torch, in_place: bool = False, profile: int = 0,
              pdl: bool | None = None) -> BoundPlan:
    """Load `plan` (cuda target; `pdl`: Engine's, None as the plan says) and bind `inputs` (torch
    CUDA tensors by plan input name, cast to the plan's input dtypes) and a new tensor for its first
    output (in place or copied). A plan built for profiles runs optimization profile `profile` at the
    inputs' shapes."""
    from polykit.runtime.engine import Engine

    engine = Engine(plan, pdl=pdl)
    ctx = engine.create_execution_context()
    out_name = plan.outputs[0]
    desc = plan.tensors[out_name]
    shape = tuple(desc.shape)
    if plan.profiles is not None:
        ctx.set_optimization_profile(profile)
        for name in plan.inputs:
            ctx.set_input_shape(name, tuple(inputs[name].shape))
        shape = ctx.get_tensor_shape(out_name)
    out = torch.empty(shape, dtype=getattr(torch, desc.dtype), device="cuda")
    bindings = {name: inputs[name].to(getattr(torch, plan.tensors[name].dtype)).contiguous() for name in plan.inputs}
    bindings[out_name] = out
    stream = torch.cuda.current_stream()
    if in_place:
        for name, tensor in bindings.items():
            ctx.set_tensor_address(name, tensor)
        return BoundPlan(engine, ctx, lambda: ctx.enqueue(stream=stream), out, bindings)
    return BoundPlan(engine, ctx, lambda: ctx.enqueue(bindings, stream), out, bindings)


def bind_host(plan, feeds: Mapping[str, Any]) -> BoundPlan:
    """Load `plan` (cpu target) with numpy `feeds`: `run()` executes once and writes the plan's first
    output into `out` (a numpy array)."""
    import numpy as np

    from polykit.runtime.engine import Engine

    engine = Engine(plan)
    ctx = engine.create_execution_context()
    out_name = plan.outputs[0]
    desc = plan.tensors[out_name]
    out = np.empty(tuple(desc.shape), dtype=desc.dtype)

    def run() -> None:
        out[...] = ctx.execute(feeds)[out_name]

    return BoundPlan(engine, ctx, run, out, {**feeds, out_name: out})

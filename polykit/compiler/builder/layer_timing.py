"""Time a layer's candidate tactics on the target, through the runtime's target protocol.

The builder does not run kernels itself: it builds a small plan holding the layer once per
(candidate, input replica) -- each replica reads its own copy of the inputs and weights,
so rotating through them keeps caches from flattering a tactic -- loads it on the target
(the target compiles the kernels), copies random non-zero inputs in, and times launches
with the engine's `timed_pass` (CUDA events behind a stream hold on cuda, perf_counter on
cpu): a few warm-up launches, then the median of several timed ones.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, Mapping, Sequence

import numpy as np

from polykit.compiler.ir.dtypes import is_float
from polykit.compiler.plan.records import layer_as_node
from polykit.compiler.ops.nn.fused import rename_fused_tensor
from polykit.compiler.ops.quant.int8 import INT8_DTYPES, is_int8_layer
from polykit.compiler.plan.file import Plan
from polykit.compiler.plan.records import LayerDesc, TensorDesc


@dataclass(frozen=True)
class Runs:
    """How one candidate is timed: untimed warm-up launches, timed launches (the median
    counts), input replicas rotated through, and the bytes the replicas may take."""

    warm_up: int
    timed: int
    replicas: int
    budget_bytes: int


#: per target: the cpu runs once per candidate up to the default level, so tuning keeps the
#: test suite's time (numpy kernels need no warm-up and run long enough to time once)
RUNS = {"cpu": Runs(0, 1, 1, 64 << 20), "cuda": Runs(5, 15, 4, 512 << 20)}
#: the cpu above the default optimization level: a median of three, inputs rotated
CPU_THOROUGH = Runs(1, 3, 2, 64 << 20)
#: on the cpu, a candidate whose first launch takes this many times the best median so far is not run again
GIVE_UP = 2.0


def runs_for(target: str, level: int) -> Runs:
    if target == "cpu":
        return CPU_THOROUGH if level > 3 else RUNS["cpu"]
    return RUNS.get(target, RUNS["cuda"])


@dataclass
class Measured:
    """Medians (ms, inf for a candidate that failed) and where the time went."""

    ms: list[float]
    errors: list[str]
    compile_s: float = 0.0
    time_s: float = 0.0


def timeable(layer: LayerDesc, tensors: Mapping[str, TensorDesc]) -> bool:
    """Whether random inputs are valid for the layer: its non-weight inputs are all float or
    bool (integer inputs index or give shapes; random ones could be out of range), or it is an
    INT8 layer (any int8/uint8 value is a valid quantized activation)."""
    int8 = is_int8_layer(layer)
    for name in layer.inputs:
        t = tensors.get(name) if name else None
        if t is None or t.kind == "weight":
            continue
        if not (is_float(t.np_dtype) or t.np_dtype == np.bool_ or int8 and t.np_dtype in INT8_DTYPES):
            return False
    return True


#: elements of the value pool a float input is tiled from (random_input)
POOL_ELEMENTS = 1 << 22


@lru_cache(maxsize=8)
def _value_pool(dtype: np.dtype) -> np.ndarray:
    """POOL_ELEMENTS values of `dtype` in 0.5..1.5 from a fixed seed (read-only, made once a process)."""
    wide = np.float64 if dtype == np.float64 else np.float32  # no float64 copy of a float32 input
    pool = (np.random.default_rng(0x706B).random(POOL_ELEMENTS, dtype=wide) + wide(0.5)).astype(dtype, copy=False)
    pool.flags.writeable = False
    return pool


def random_input(desc: TensorDesc, rng: np.random.Generator) -> np.ndarray:
    """Non-zero values of the tensor's shape and dtype, inside most ops' domains (0.5..1.5);
    int8/uint8 over most of their range. A float input repeats a fixed pool of random values
    from an offset `rng` picks: a copy, not a draw per element (drawing every element of a
    ResNet-50 batch-32 build's timing inputs took longer than timing them)."""
    if desc.np_dtype == np.bool_:
        return rng.random(desc.shape) < 0.5
    if desc.np_dtype in INT8_DTYPES:
        low = 1 if desc.np_dtype == np.uint8 else -100
        return rng.integers(low, 101, desc.shape).astype(desc.np_dtype)
    pool = _value_pool(np.dtype(desc.np_dtype))
    size = int(np.prod(desc.shape, dtype=np.int64))
    start = int(rng.integers(0, POOL_ELEMENTS))
    if start + size <= POOL_ELEMENTS:
        return pool[start:start + size].reshape(desc.shape).copy()
    return np.resize(np.concatenate((pool[start:], pool[:start])), desc.shape)


def timing_plan(target: str, layer: LayerDesc, pairs: Sequence[tuple[LayerDesc, Any]],
                tensors: Mapping[str, TensorDesc], weights: Mapping[str, np.ndarray], runs: Runs,
                seed: int = 0) -> tuple[Plan, dict[str, np.ndarray], int]:
    """(plan of every candidate x replica of `layer`, the plan's inputs, replicas)."""
    from polykit.compiler.builder.plan_tensors import assign_memory

    # every variant's: a sparse variant reads its weight's compressed form (polykit.compiler.builder.sparsity)
    names = [n for n in dict.fromkeys((*layer.inputs, *layer.outputs, *(n for v, _ in pairs for n in v.inputs))) if n]
    per_replica = sum(tensors[n].nbytes for n in names) or 1
    replicas = max(1, min(runs.replicas, runs.budget_bytes // per_replica))
    rng = np.random.default_rng(seed)
    descs: dict[str, TensorDesc] = {}
    plan_weights: dict[str, np.ndarray] = {}
    feeds: dict[str, np.ndarray] = {}
    renames = []
    for k in range(replicas):
        rename = {n: f"{n}#{k}" for n in names}
        renames.append(rename)
        for n in names:
            t = tensors[n]
            if t.kind == "weight":
                plan_weights[rename[n]] = np.array(weights[n], copy=True)
                kind = "weight"
            else:
                kind = "output" if n in layer.outputs else "input"
                if kind == "input":
                    feeds[rename[n]] = random_input(t, rng)
            descs[rename[n]] = replace(t, name=rename[n], kind=kind, offset=-1)
    layers = [replace(renamed(variant, rename), name=f"{layer.name}#{c}.{k}", tactic=tactic.name,
                      tactic_params=dict(tactic.params))
              for c, (variant, tactic) in enumerate(pairs) for k, rename in enumerate(renames)]
    inputs = list(feeds)
    outputs = [d.name for d in descs.values() if d.kind == "output"]
    descs, memory = assign_memory(layers, descs, inputs, outputs, "none")
    metadata: dict[str, Any] = {}
    if target == "cuda":
        from polykit.kernels.cuda.base import pack_kernel_table

        by_name = {tactic.name: tactic for _, tactic in pairs}
        metadata["kernels"] = pack_kernel_table({l.name: by_name[l.tactic].kernels(l) for l in layers}, layers)
    plan = Plan(target=target, layers=layers, tensors=descs, inputs=inputs, outputs=outputs, weights=plan_weights,
                memory=memory, metadata=metadata)
    return plan, feeds, replicas


def renamed(layer: LayerDesc, rename: Mapping[str, str]) -> LayerDesc:
    """The layer reading and writing renamed tensors (in a fused layer's body too)."""
    node = layer_as_node(layer)
    node.attrs = copy.deepcopy(node.attrs)
    for old, new in rename.items():
        rename_fused_tensor(node, old, new)
    return replace(layer, inputs=tuple(node.inputs), outputs=tuple(node.outputs), attrs=node.attrs)


def time_candidates(target: str, layer: LayerDesc, pairs: Sequence[tuple[LayerDesc, Any]],
                    tensors: Mapping[str, TensorDesc], weights: Mapping[str, np.ndarray], runs: Runs,
                    device: int | None = None) -> Measured:
    """Median milliseconds of each (layer variant, tactic) pair on the target (GPU `device`, default 0)."""
    from polykit.errors import PolykitError
    from polykit.runtime.engine import timed_pass
    from polykit.runtime.target import get_target

    plan, feeds, replicas = timing_plan(target, layer, pairs, tensors, weights, runs)
    t0 = time.perf_counter()
    engine = get_target(target, device).load(plan)
    result = Measured([float("inf")] * len(pairs), [""] * len(pairs), compile_s=time.perf_counter() - t0)
    t1 = time.perf_counter()
    try:
        ctx = engine.create_context()
        try:
            ctx.begin()
            for name, array in feeds.items():
                ctx.copy_in(name, array, ctx.stream)
            best = float("inf")
            for c in range(len(pairs)):
                launches = [c * replicas + i % replicas for i in range(runs.warm_up + runs.timed)]
                try:
                    if target == "cpu":  # one launch first: a clearly slower candidate is not run again
                        times = [ms for _, ms in timed_pass(ctx, plan.layers, ctx.stream, launches[:1])]
                        if times[0] <= GIVE_UP * best and len(launches) > 1:
                            times += [ms for _, ms in timed_pass(ctx, plan.layers, ctx.stream, launches[1:])]
                    else:
                        times = [ms for _, ms in timed_pass(ctx, plan.layers, ctx.stream, launches)]
                    ctx.synchronize(ctx.stream)
                except PolykitError as exc:
                    result.errors[c] = exc.what
                    continue
                result.ms[c] = float(np.median(times[-runs.timed:]))
                best = min(best, result.ms[c])
        finally:
            ctx.close()
    finally:
        engine.close()
    result.time_s = time.perf_counter() - t1
    return result

"""The cpu target: runs a plan's layers with the numpy reference kernels.

It is what CI (no GPU) runs end to end and a fallback without a GPU. Every layer's tactic
is "cpu.reference". An fp16 build (BuilderConfig(fp16=True)) stores its activations and
weights in float16, so the reference kernels run on float16 arrays here too. Tensors are
dropped after their last reader, following the memory plan's lifetimes.
"""

from __future__ import annotations

import time
from typing import Any, Mapping

import numpy as np

from polykit.compiler.lower import layer_as_node
from polykit.errors import BuildError, PlanError, PolykitError

CPU_TACTICS = ("cpu.reference",)


class CpuTarget:
    """The target named "cpu"."""

    name = "cpu"

    def available(self) -> bool:
        return True

    def load(self, plan: Any) -> "CpuEngine":
        return CpuEngine(plan)


class CpuEngine:
    """A plan prepared for the cpu target: nodes built once, free lists precomputed."""

    def __init__(self, plan: Any):
        from polykit.kernels.registry import find_reference

        self.plan = plan
        self.steps = []
        for layer in plan.layers:
            if layer.tactic not in CPU_TACTICS:
                raise PlanError(f"layer uses tactic {layer.tactic!r}, which the cpu target does not have",
                                where=f"layer {layer.name!r}", hint="rebuild the plan with --target cpu")
            fn = find_reference(layer.domain, layer.kind)
            if fn is None:
                raise BuildError(f"no reference kernel for {layer.domain or 'ai.onnx'}::{layer.kind}",
                                 where=f"layer {layer.name!r}", hint="install the plugin that provides this op")
            self.steps.append((layer, layer_as_node(layer), fn))
        keep = set(plan.outputs)
        self.free_after: list[list[str]] = [[] for _ in plan.layers]
        for name, (_, last) in plan.memory.lifetimes.items():
            if name not in keep and 0 <= last < len(plan.layers):
                self.free_after[last].append(name)
        for names in self.free_after:
            names.sort()

    def create_context(self, **options: Any) -> "CpuContext":
        return CpuContext(self, profile=bool(options.get("profile", False)))

    def close(self) -> None:
        self.steps = []


class CpuContext:
    """Runs the plan; holds no state between calls but the last profile, so it is cheap."""

    def __init__(self, engine: CpuEngine, profile: bool = False):
        self.engine = engine
        self.profile = profile
        #: per layer (name, milliseconds) of the last execute when profiling
        self.last_profile: list[tuple[str, float]] = []

    def execute(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        plan = self.engine.plan
        env: dict[str, np.ndarray] = dict(plan.weights)
        env.update(feeds)
        timings: list[tuple[str, float]] = []
        for idx, (layer, node, fn) in enumerate(self.engine.steps):
            args = [env[name] if name else None for name in layer.inputs]
            start = time.perf_counter() if self.profile else 0.0
            try:
                results = fn(node, args)
            except PolykitError:
                raise
            except Exception as exc:
                raise PolykitError(f"the reference kernel failed: {type(exc).__name__}: {exc}",
                                   where=f"layer {layer.name!r} ({layer.kind})",
                                   hint="the inputs may be out of the op's domain; check the feeds") from exc
            if self.profile:
                timings.append((layer.name, (time.perf_counter() - start) * 1e3))
            for name, value in zip(layer.outputs, results):
                if name:
                    env[name] = _conform(np.asarray(value), plan.tensors.get(name), layer.name)
            for name in self.engine.free_after[idx]:
                env.pop(name, None)
        self.last_profile = timings
        return {name: np.array(env[name], copy=True) for name in plan.outputs}

    def close(self) -> None:
        self.last_profile = []


def _conform(value: np.ndarray, desc: Any, layer: str) -> np.ndarray:
    """Check a layer output against the plan's TensorDesc (a kernel bug otherwise)."""
    if desc is None:
        return value
    if value.dtype.name != desc.dtype or tuple(value.shape) != tuple(desc.shape):
        raise PolykitError(
            f"layer produced {desc.name!r} as {value.dtype.name}{list(value.shape)}, the plan says "
            f"{desc.dtype}{list(desc.shape)}",
            where=f"layer {layer!r}",
            hint="the op's shape rule and reference kernel disagree; please report this",
        )
    return value

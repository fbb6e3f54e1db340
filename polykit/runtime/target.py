"""The narrow interface every target implements; nothing above runtime/ knows which target runs.

A target turns a loaded Plan into a TargetEngine (weights uploaded, kernels compiled or
fetched from cache), which creates TargetContexts (one activation arena each) that run
the plan's layers. The cpu target runs the reference kernels; the cuda target, polykit's
own NVRTC-compiled kernels. Targets register in TARGETS by name and are imported lazily,
so `import polykit` never imports cuda-python.
"""

from __future__ import annotations

import importlib
from typing import Any, Mapping, Protocol

import numpy as np

from polykit.errors import DeviceError

#: target name -> "module:attribute" of a Target factory (a class or function with no args)
TARGETS: dict[str, str] = {
    "cpu": "polykit.runtime.cpu:CpuTarget",
    "cuda": "polykit.runtime.cuda:CudaTarget",
}


class TargetContext(Protocol):
    def execute(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the plan on host arrays (already checked against the engine's inputs)."""

    def close(self) -> None: ...


class TargetEngine(Protocol):
    def create_context(self, **options: Any) -> TargetContext: ...

    def close(self) -> None: ...


class Target(Protocol):
    name: str

    def load(self, plan: Any) -> TargetEngine:
        """Prepare `plan` (a polykit.compiler.plan.Plan) to run on this target."""

    def available(self) -> bool: ...


def get_target(name: str) -> Target:
    """Instantiate the target called `name`; DeviceError if unknown or unusable here."""
    spec = TARGETS.get(name)
    if spec is None:
        raise DeviceError(f"unknown target {name!r}", hint=f"use one of: {', '.join(sorted(TARGETS))}")
    module, attr = spec.split(":")
    try:
        factory = getattr(importlib.import_module(module), attr)
    except ImportError as exc:
        raise DeviceError(
            f"the {name} target cannot be loaded: {exc}",
            hint="install polykit[cuda] for the cuda target, or use --target cpu",
        ) from exc
    return factory()


def default_target() -> str:
    """'cuda' when a GPU is usable, else 'cpu'."""
    try:
        return "cuda" if get_target("cuda").available() else "cpu"
    except Exception:
        return "cpu"

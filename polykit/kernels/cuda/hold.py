"""The profiler's stream hold (hold.cu): not a layer tactic, a runtime helper kernel."""

from __future__ import annotations

from polykit.kernels.cuda.base import KernelSource

HOLD = KernelSource("hold_stream", file="hold.cu")


def compile_variants() -> list[KernelSource]:
    return [HOLD]

"""The polykit engine runner (`polykit run --trt`, alias `--polykit`).

It takes an Engine or a loader of one (EngineFromOnnx, EngineFromPath, ...) and runs it
with one execution context; which target (cuda or cpu) the engine runs on is the plan's
business, not the runner's.
"""

from __future__ import annotations

from typing import Any

from polykit.backends.base import BaseRunner, TensorMeta, resolve


class PolykitRunner(BaseRunner):
    """Runs a polykit Engine. An engine the runner loaded itself is closed on deactivate.

    `optimization_profile` selects the context's profile (Polygraphy's --optimization-profile).
    With `profile=True` the context times every layer; `layer_times` keeps one profile per
    run ([(layer, ms)], warm-ups included) and `layers` the plan's layers, both kept after
    deactivation for polykit.tools.report.profile."""

    reads_feeds_only = True  # (the Comparator need not copy its feeds)

    def __init__(self, engine: Any, name: str = "trt", profile: bool = False, optimization_profile: int = 0):
        super().__init__(name)
        self.optimization_profile = optimization_profile
        self._engine_arg = engine
        self.engine: Any = None
        self.context: Any = None
        self._owns_engine = False
        self.profile = profile
        self.layer_times: list[list[tuple[str, float]]] = []
        self.layers: list[Any] = []

    def activate_impl(self) -> None:
        self._owns_engine = callable(self._engine_arg)
        self.engine = resolve(self._engine_arg)
        if not hasattr(self.engine, "create_execution_context"):
            from polykit.backends.loaders import EngineFromPlan

            self.engine = EngineFromPlan(self.engine)()
            self._owns_engine = True
        self.context = self.engine.create_execution_context(**({"profile": True} if self.profile else {}))
        if self.optimization_profile:
            self.context.set_optimization_profile(self.optimization_profile)
        self.layers = list(getattr(getattr(self.engine, "plan", None), "layers", []))

    def deactivate_impl(self) -> None:
        try:
            if self.context is not None:
                self.context.close()
            if self._owns_engine and self.engine is not None:
                self.engine.close()
        finally:
            self.context = None
            self.engine = None

    def get_input_metadata_impl(self) -> dict[str, TensorMeta]:
        return {
            name: TensorMeta(name, str(desc.dtype), tuple(desc.shape))
            for name, desc in self.engine.input_metadata.items()
        }

    def infer_impl(self, feed_dict: dict[str, Any]) -> dict[str, Any]:
        out = self.context.execute(feed_dict)
        if self.profile:
            self.layer_times.append(self.context.profile)
        return out

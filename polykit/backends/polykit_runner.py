"""The polykit engine runner (`polykit run --trt`, alias `--polykit`).

It takes an Engine or a loader of one (EngineFromOnnx, EngineFromPath, ...) and runs it
with one execution context; which target (cuda or cpu) the engine runs on is the plan's
business, not the runner's.
"""

from __future__ import annotations

import logging
from typing import Any

from polykit.backends.base import BaseRunner, TensorMeta, resolve
from polykit.errors import UsageError

log = logging.getLogger("polykit")
#: Polygraphy's --allocation-strategy values; polykit's memory plan is static whichever is given
ALLOCATION_STRATEGIES = ("static", "profile", "runtime")


def check_allocation_strategy(strategy: Any, where: str = "allocation_strategy", notice: bool = True) -> None:
    """UsageError unless `strategy` is None or one of Polygraphy's static|profile|runtime; a
    one-line notice (unless `notice` is False) for profile/runtime: polykit allocates one arena
    at the largest shapes."""
    if strategy is not None and strategy not in ALLOCATION_STRATEGIES:
        raise UsageError(f"allocation strategy {strategy!r} is not one of {'|'.join(ALLOCATION_STRATEGIES)}",
                         where=where, hint="give static (polykit's only memory plan), profile or runtime")
    if notice and strategy in ("profile", "runtime"):
        log.warning("allocation strategy %s: polykit allocates activation memory statically (one arena at the "
                    "largest shapes of every profile), so it runs as static", strategy)


class PolykitRunner(BaseRunner):
    """Runs a polykit Engine. An engine the runner loaded itself is closed on deactivate.

    `optimization_profile` selects the context's profile (Polygraphy's --optimization-profile).
    With `profile=True` the context times every layer; `layer_times` keeps one profile per
    run ([(layer, ms)], warm-ups included) and `layers` the plan's layers, both kept after
    deactivation for polykit.tools.report.profile.

    `weight_streaming_budget` / `weight_streaming_percent` are Polygraphy's TrtRunner arguments
    (polykit.runtime.weight_streaming.requested_budget: None or -2 off, -1 automatic, bytes, or a
    percent of the streamable weights), set on the engine before its context is created;
    `allocation_strategy` is accepted as Polygraphy spells it (check_allocation_strategy)."""

    reads_feeds_only = True  # (the Comparator need not copy its feeds)

    def __init__(self, engine: Any, name: str = "trt", profile: bool = False, optimization_profile: int = 0,
                 weight_streaming_budget: int | None = None, weight_streaming_percent: float | None = None,
                 allocation_strategy: str | None = None):
        from polykit.runtime.weight_streaming import check_budget_request

        super().__init__(name)
        check_budget_request(weight_streaming_budget, weight_streaming_percent)
        check_allocation_strategy(allocation_strategy)
        self.weight_streaming_budget = weight_streaming_budget
        self.weight_streaming_percent = weight_streaming_percent
        self.allocation_strategy = allocation_strategy
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
        try:
            self._set_weight_streaming_budget()
        except Exception:
            self.deactivate_impl()  # an engine the runner loaded is closed
            raise
        self.context = self.engine.create_execution_context(**({"profile": True} if self.profile else {}))
        if self.optimization_profile:
            self.context.set_optimization_profile(self.optimization_profile)
        self.layers = list(getattr(getattr(self.engine, "plan", None), "layers", []))

    def _set_weight_streaming_budget(self) -> None:
        """Set the budget Polygraphy's arguments ask (before the context, as TensorRT requires)."""
        from polykit.runtime.weight_streaming import requested_budget

        if self.weight_streaming_budget is not None and self.weight_streaming_percent is not None:
            log.warning("weight streaming budget given both in bytes and as a percent: the bytes win (as in Polygraphy)")
        budget = requested_budget(self.engine, self.weight_streaming_budget, self.weight_streaming_percent)
        if budget is None:
            return
        self.engine.set_weight_streaming_budget(budget)
        log.info("%s: weight streaming budget %d of %d streamable bytes resident", self.name,
                 self.engine.get_weight_streaming_budget(), self.engine.streamable_weights_size)

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

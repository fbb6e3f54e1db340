"""What every runner shares: the activate / infer / deactivate life cycle, I/O metadata,
timing, and the records plugins use to offer runners on the command line."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from polykit.errors import PolykitError, UsageError


@dataclass(frozen=True)
class TensorMeta:
    """A runner input or output: name, numpy dtype name and shape (str/None dims are dynamic)."""

    name: str
    dtype: str
    shape: tuple[Any, ...] | None

    @property
    def is_static(self) -> bool:
        return self.shape is not None and all(isinstance(d, int) and d >= 0 for d in self.shape)


@dataclass(frozen=True)
class RunnerRequest:
    """What the CLI knows when it asks a plugin for a runner (RunnerSpec.factory's argument)."""

    model: str
    target: str | None = None
    fp16: bool = False
    #: BuilderConfig.channels_last (None: auto)
    channels_last: bool | None = None
    input_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    providers: tuple[str, ...] = ()
    mark_outputs: tuple[str, ...] = ()
    mark_all: bool = False
    #: polykit's engine is built with the marked tensors as outputs (BuilderConfig.force_marks), so
    #: every one is compared; False: observed where the unmarked engine's layers write them
    force_marks: bool = False
    fold_constants: bool = True
    save_engine: str | None = None
    #: polykit's engine records per-layer times (ExecutionContext profile) on every run
    profile: bool = False
    #: the optimization profile polykit's engine runs in (ExecutionContext.set_optimization_profile)
    optimization_profile: int = 0
    #: Polygraphy's TrtRunner weight_streaming_budget / weight_streaming_percent (PolykitRunner)
    weight_streaming_budget: int | None = None
    weight_streaming_percent: float | None = None
    #: Polygraphy's --allocation-strategy (static|profile|runtime; polykit allocates statically)
    allocation_strategy: str | None = None
    #: a tactic replay file to force (BuilderConfig.tactic_replay) / to write (save_tactics)
    load_tactics: str | None = None
    save_tactics: str | None = None
    #: more BuilderConfig fields for polykit's engine (precision, tuning, timing cache: the
    #: shared builder options of polykit.tools.cli.args)
    builder_options: Mapping[str, Any] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RunnerSpec:
    """A runner offered on the command line: `flags` select it, `factory(request)` makes it.
    `model_types` are the kinds of model file it runs (polykit.backends.loaders.model_type:
    "onnx", "plan"); asked to run another kind, make_runners refuses with a UsageError."""

    name: str
    flags: tuple[str, ...]
    factory: Callable[[RunnerRequest], "BaseRunner"]
    help: str = ""
    model_types: tuple[str, ...] = ("onnx",)


class BaseRunner:
    """Runs a model on feed dicts. Subclasses implement activate_impl / infer_impl /
    deactivate_impl / get_input_metadata_impl; this class adds the life cycle checks,
    context-manager use and `last_inference_time()` (seconds, wall clock of infer_impl)."""

    #: whether infer_impl only reads its feed arrays: the Comparator then hands it read-only views
    #: of the feeds (no copy; a GiB input stays a GiB), else a copy of each it may change
    reads_feeds_only = False

    def __init__(self, name: str):
        self.name = name
        self.is_active = False
        self._last_time: float | None = None

    # ---- life cycle ----------------------------------------------------------------
    def activate(self) -> None:
        if self.is_active:
            raise UsageError(f"runner {self.name!r} is already active", hint="call deactivate() first")
        self.activate_impl()
        self.is_active = True

    def deactivate(self) -> None:
        if not self.is_active:
            return
        try:
            self.deactivate_impl()
        finally:
            self.is_active = False

    def __enter__(self) -> "BaseRunner":
        self.activate()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.deactivate()

    # ---- inference -----------------------------------------------------------------
    def infer(self, feed_dict: Mapping[str, Any]) -> dict[str, Any]:
        """Run on `feed_dict` (name -> numpy array); returns output name -> numpy array."""
        self._require_active("infer")
        start = time.perf_counter()
        outputs = self.infer_impl(dict(feed_dict))
        self._last_time = time.perf_counter() - start
        return outputs

    def last_inference_time(self) -> float | None:
        """Seconds the last infer() took, or None before the first."""
        return self._last_time

    def get_input_metadata(self) -> dict[str, TensorMeta]:
        """Input name -> TensorMeta, in the model's input order."""
        self._require_active("get_input_metadata")
        return self.get_input_metadata_impl()

    def _require_active(self, what: str) -> None:
        if not self.is_active:
            raise UsageError(
                f"runner {self.name!r} must be activated before {what}()",
                hint="use `with runner:` or call runner.activate()",
            )

    # ---- for subclasses --------------------------------------------------------------
    def activate_impl(self) -> None:
        pass

    def deactivate_impl(self) -> None:
        pass

    def infer_impl(self, feed_dict: dict[str, Any]) -> dict[str, Any]:  # pragma: no cover
        raise NotImplementedError

    def get_input_metadata_impl(self) -> dict[str, TensorMeta]:  # pragma: no cover
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


def resolve(value: Any) -> Any:
    """Call `value` if it is a loader (callable), else return it: loaders accept both."""
    return value() if callable(value) else value


class RunnerError(PolykitError):
    """A runner failed to load or run the model (the message names the runner)."""

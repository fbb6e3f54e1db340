"""`polygraphy.backend.trt` on polykit's own engine (nothing calls TensorRT): the loaders build
and load polykit plans, TrtRunner runs them (polykit.backends.polykit_runner).

| Polygraphy | here |
| --- | --- |
| `NetworkFromOnnxPath(path)` / `network_from_onnx_path` | the ONNX model to build (an OnnxNetwork; TensorRT's INetworkDefinition methods are not provided) |
| `CreateConfig(fp16=, tf32=, bf16=, int8=, fp8=, calibrator=, profiles=, precision_constraints=, sparse_weights=, ...)` / `create_config` | a polykit BuilderConfig (`sparse_weights=True`: `sparsity="enable"`) |
| `EngineFromNetwork(network, config)` / `engine_from_network` | a polykit plan built and loaded (an Engine) |
| `EngineFromBytes(bytes)` / `engine_from_bytes` | a plan's bytes loaded |
| `SaveEngine(engine, path)` / `save_engine` | the plan written to `path` |
| `Profile().add(name, min, opt, max)` | an optimization profile |
| `Calibrator(data_loader, cache=)` | int8 calibration from the loader's feeds (polykit's calibrator) |
| `TrtRunner(engine or context or loader, name=, optimization_profile=, weight_streaming_budget=, weight_streaming_percent=, allocation_strategy=)`, `set_profile(i)` | PolykitRunner (the budget is set before the context; a given context keeps its engine's) |
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Mapping

from polykit.backends.base import resolve
from polykit.backends.loaders import BaseLoader, EngineFromPlan, PlanFromOnnx, SaveEngine
from polykit.backends.polykit_runner import PolykitRunner
from polykit.errors import UsageError


class OnnxNetwork:
    """What NetworkFromOnnxPath gives: the ONNX model polykit builds from. TensorRT's network
    API (get_output, add_identity, mark_output, ...) is not there: polykit builds from ONNX."""

    def __init__(self, path: str | os.PathLike):
        self.path = path

    def __getattr__(self, name: str) -> Any:
        raise UsageError(f"network.{name}: TensorRT's INetworkDefinition API is not provided by polykit.compat",
                         hint="edit the ONNX model instead (onnx or `polykit surgeon`), then build it")


class NetworkFromOnnxPath(BaseLoader):
    """Polygraphy's NetworkFromOnnxPath(path): the (builder, network, parser) triple, of which
    only the network (the model) means anything here."""

    def __init__(self, path: str | os.PathLike, flags: Any = None, plugin_instancenorm: Any = None, strongly_typed: Any = None):
        self.path = path
        self.strongly_typed = bool(strongly_typed)

    def __call__(self) -> tuple[None, OnnxNetwork, None]:
        from polykit.errors import ModelLoadError
        from polykit.files import require_file

        require_file(self.path, "ONNX model", ModelLoadError)
        return None, OnnxNetwork(self.path), None


def network_from_onnx_path(path: str | os.PathLike, **kwargs: Any) -> tuple[None, OnnxNetwork, None]:
    return NetworkFromOnnxPath(path, **kwargs)()


class Profile(dict):
    """Polygraphy's Profile: input name -> (min, opt, max) shapes; `add` returns the profile."""

    def add(self, name: str, min: Iterable[int], opt: Iterable[int], max: Iterable[int]) -> "Profile":  # noqa: A002
        self[name] = (tuple(min), tuple(opt), tuple(max))
        return self

    def to_polykit(self) -> Any:
        from polykit.compiler.plan.profiles import Profile as PlanProfile

        return PlanProfile(shapes=dict(self))


class Calibrator:
    """Polygraphy's Calibrator(data_loader, cache=None): polykit calibrates from the loader's feeds
    (its entropy calibrator unless `algo` names minmax/percentile) and reads/writes `cache`."""

    def __init__(self, data_loader: Iterable[Mapping[str, Any]], cache: str | os.PathLike | None = None,
                 BaseClass: Any = None, batch_size: Any = None, quantile: Any = None, regression_cutoff: Any = None,
                 algo: str | None = None):
        self.data_loader = data_loader
        self.cache = cache
        self.algo = algo or "entropy"


#: CreateConfig keywords -> BuilderConfig fields taken unchanged
_SAME = {"fp16": "fp16", "tf32": "tf32", "bf16": "bf16", "int8": "int8", "fp8": "fp8", "strongly_typed": "strongly_typed",
         "precision_constraints": "precision_constraints", "load_timing_cache": "load_timing_cache",
         "error_on_timing_cache_miss": "error_on_timing_cache_miss",
         "builder_optimization_level": "builder_optimization_level", "version_compatible": "version_compatible"}


def _builder_config(**kwargs: Any) -> Any:
    from polykit.compiler.builder.config import BuilderConfig

    fields: dict[str, Any] = {}
    for key, value in kwargs.items():
        if value is None:
            continue
        if key in _SAME:
            fields[_SAME[key]] = value
        elif key == "profiles":
            fields["profiles"] = [p.to_polykit() if isinstance(p, Profile) else p for p in value]
        elif key == "calibrator":
            fields.update(calibration_data=value.data_loader, calibrator=value.algo,
                          **({"calibration_cache": value.cache} if value.cache else {}))
        elif key == "sparse_weights":  # TensorRT's SPARSE_WEIGHTS flag: trtexec --sparsity enable
            fields["sparsity"] = "enable" if value else "disable"
        elif key == "memory_pool_limits":
            workspace = {str(k).rpartition(".")[2].lower(): v for k, v in dict(value).items()}.get("workspace")
            if workspace is not None:
                fields["workspace_limit"] = int(workspace)
        else:
            raise UsageError(f"CreateConfig({key}=...) is a TensorRT builder setting polykit.compat does not map",
                             hint=f"supported: {', '.join(sorted([*_SAME, 'profiles', 'calibrator', 'memory_pool_limits', 'sparse_weights']))}")
    return BuilderConfig(**fields)


class CreateConfig(BaseLoader):
    """Polygraphy's CreateConfig(**settings): called (with or without builder, network) it gives
    the polykit BuilderConfig."""

    def __init__(self, **kwargs: Any):
        self.kwargs = kwargs
        _builder_config(**kwargs)  # refuse unknown settings now, as Polygraphy does

    def __call__(self, builder: Any = None, network: Any = None) -> Any:
        return _builder_config(**self.kwargs)


def create_config(builder: Any = None, network: Any = None, **kwargs: Any) -> Any:
    return CreateConfig(**kwargs)()


def _model_of(network: Any) -> Any:
    value = resolve(network)
    if isinstance(value, tuple):  # (builder, network, parser)
        value = next((v for v in value if isinstance(v, OnnxNetwork)), None)
    if not isinstance(value, OnnxNetwork):
        raise UsageError(f"cannot build an engine from a {type(value).__name__}",
                         hint="give NetworkFromOnnxPath(path) (polykit builds from ONNX models)")
    return value.path


class EngineFromNetwork(BaseLoader):
    """Polygraphy's EngineFromNetwork(network, config=None, save_timing_cache=None): a polykit plan
    built from the network's ONNX model and loaded."""

    def __init__(self, network: Any, config: Any = None, save_timing_cache: str | os.PathLike | None = None):
        self.network = network
        self.config = config
        self.save_timing_cache = save_timing_cache

    def __call__(self) -> Any:
        import dataclasses

        config = self.config() if callable(self.config) else self.config
        if self.save_timing_cache is not None:
            from polykit.compiler.builder.config import BuilderConfig

            config = dataclasses.replace(config or BuilderConfig(), save_timing_cache=self.save_timing_cache)
        return EngineFromPlan(PlanFromOnnx(_model_of(self.network), config))()


def engine_from_network(network: Any, config: Any = None, save_timing_cache: Any = None) -> Any:
    return EngineFromNetwork(network, config, save_timing_cache)()


class EngineFromBytes(BaseLoader):
    """Polygraphy's EngineFromBytes(serialized_engine): a polykit plan's bytes loaded."""

    def __init__(self, serialized_engine: Any):
        self.serialized_engine = serialized_engine

    def __call__(self) -> Any:
        return EngineFromPlan(resolve(self.serialized_engine))()


def engine_from_bytes(serialized_engine: Any) -> Any:
    return EngineFromBytes(serialized_engine)()


def save_engine(engine: Any, path: str | os.PathLike) -> Any:
    return SaveEngine(engine, path)()


class TrtRunner(PolykitRunner):
    """Polygraphy's TrtRunner(engine or context, name=None, optimization_profile=None): a polykit
    engine, a loader of one, or an execution context (kept open: the caller owns it)."""

    def __init__(self, engine: Any, name: str | None = None, optimization_profile: int | None = None,
                 allocation_strategy: Any = None, weight_streaming_budget: Any = None,
                 weight_streaming_percent: Any = None):
        super().__init__(engine, name=name or "trt", optimization_profile=optimization_profile or 0,
                         weight_streaming_budget=weight_streaming_budget,
                         weight_streaming_percent=weight_streaming_percent, allocation_strategy=allocation_strategy)

    def activate_impl(self) -> None:
        given = self._engine_arg
        if hasattr(given, "execute") and hasattr(given, "set_optimization_profile"):
            self.engine, self.context, self._owns_engine = given.engine, given, False
            if self.optimization_profile:
                self.context.set_optimization_profile(self.optimization_profile)
            return
        super().activate_impl()

    def deactivate_impl(self) -> None:
        if self.context is self._engine_arg:  # a context the caller gave stays open
            self.context = self.engine = None
            return
        super().deactivate_impl()

    def set_profile(self, index: int) -> None:
        """Serve optimization profile `index` from the next inference on."""
        self._require_active("set_profile")
        self.context.set_optimization_profile(index)
        self.optimization_profile = index


__all__ = ["Calibrator", "CreateConfig", "EngineFromBytes", "EngineFromNetwork", "NetworkFromOnnxPath", "Profile",
           "SaveEngine", "TrtRunner", "create_config", "engine_from_bytes", "engine_from_network",
           "network_from_onnx_path", "save_engine"]

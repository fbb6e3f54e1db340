"""ONNX's standard backend API (onnx.backend.base) over polykit's engine.

`prepare(model, device)` imports the model and returns a rep whose `run(inputs)` builds a
plan for the feed shapes (cached per shape signature) and executes it on the target the
device names: "CPU" -> cpu, "CUDA" -> cuda. This is how `onnx.backend.test.BackendTest`
runs ONNX's own conformance suite against polykit, as it does for ONNX Runtime.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from onnx.backend.base import Backend, BackendRep

from polykit.compiler.ir.sequences import runtime_form
from polykit.errors import BuildError, DeviceError, PolykitError
from polykit.runtime.sequences import flatten_value

_DEVICE_TARGETS = {"CPU": "cpu", "CUDA": "cuda"}


def _target_of(device: str) -> str:
    kind = str(device).split(":")[0].upper()
    try:
        return _DEVICE_TARGETS[kind]
    except KeyError:
        raise DeviceError(f"unknown device {device!r}", hint="use 'CPU' or 'CUDA'") from None


class PolykitRep(BackendRep):
    """A prepared model: engines built lazily per input-shape signature."""

    def __init__(self, graph: Any, target: str, **config: Any):
        self.graph = graph
        self.target = target
        self.config = config
        self._engines: dict[tuple, Any] = {}
        self._by_value: dict[tuple, list[str]] = {}  # shape key -> inputs whose values engines bind
        #: engines built so far (failed tries included): what conformance reports as rebuilds
        self.builds = 0

    def _engine_for(self, feeds: dict[str, np.ndarray]) -> Any:
        """The engine for these feeds' shapes. Shape-tensor inputs (a Reshape target, TopK's k...)
        range over what their consumers allow, one engine serving every value (value_ranges);
        only when that build fails are the small inputs' values bound too, an engine per value."""
        from polykit.compiler.graph.infer import PROPAGATE_MAX_ELEMENTS

        key = tuple((k, v.shape, v.dtype.str) for k, v in feeds.items())
        engine = self._engines.get(key)
        if engine is not None:
            return engine
        if key not in self._by_value:
            engine = self._ruled(feeds)
            if engine is not None:
                self._engines[key] = engine
                return engine
        bound = self._by_value.get(key)
        if bound is not None:  # shapes here depend on input data: engines are built per input value
            value_key = key + tuple(feeds[k].tobytes() for k in bound)
            engine = self._engines.get(value_key)
            if engine is None:
                engine = self._build(feeds, {k: feeds[k] for k in bound})
                self._engines[value_key] = engine
            return engine
        try:
            engine = self._build(feeds, {})
        except BuildError:
            small = [k for k, v in feeds.items() if v.size <= PROPAGATE_MAX_ELEMENTS and v.dtype != object]
            if not small:
                raise
            engine = self._build(feeds, {k: feeds[k] for k in small})
            self._by_value[key] = small
            self._engines[key + tuple(feeds[k].tobytes() for k in small)] = engine
            return engine
        self._engines[key] = engine
        return engine

    def _ruled(self, feeds: dict[str, np.ndarray]) -> Any:
        """The engine whose shape-tensor inputs range over their value_ranges (None without such
        inputs, on a target that cannot size tensors at run time, or when the build fails)."""
        from polykit.compiler.graph.shape_rules import RUN_TIME_SIZED_TARGETS
        from polykit.compiler.builder.value_ranges import ruled_profile

        if self.target not in RUN_TIME_SIZED_TARGETS or set(feeds) != set(self.graph.inputs):
            return None  # (a sequence input's feeds are its elements)
        profile = ruled_profile(self.graph, {k: tuple(v.shape) for k, v in feeds.items()}, feeds)
        if profile is None:
            return None
        try:
            return self._build(feeds, {}, [profile])
        except PolykitError:  # a shape the plan cannot record (a pass, a body): built per value instead
            return None

    def _build(self, feeds: dict[str, np.ndarray], values: dict[str, np.ndarray], profiles: list | None = None) -> Any:
        from polykit.compiler.builder.builder import build_plan
        from polykit.compiler.builder.config import BuilderConfig
        from polykit.runtime.engine import Runtime

        cfg = BuilderConfig(target=self.target, input_shapes={k: tuple(v.shape) for k, v in feeds.items()},
                            input_values=values, profiles=profiles or [], **self.config)
        self.builds += 1
        return Runtime(self.target).deserialize_engine(build_plan(self.graph, cfg))

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        names = list(self.graph.inputs)
        if not isinstance(inputs, dict):
            if not isinstance(inputs, (list, tuple)):
                inputs = [inputs]
            inputs = dict(zip(names, inputs))
        feeds = {k: self._feed(k, v) for k, v in inputs.items()}
        flat: dict[str, np.ndarray] = {}
        for name, value in feeds.items():  # a sequence's elements, as the build names them (s/0, s/1, ...)
            flat.update(flatten_value(name, self.graph.value(name).wrap, value))
        engine = self._engine_for(flat)
        with engine.create_execution_context() as ctx:
            out = ctx.execute(feeds)
        return tuple(out[name] for name in self.graph.outputs)

    def _feed(self, name: str, value: Any) -> Any:
        """A feed as an array, or as a list of arrays / None where the input is a sequence/optional."""
        wrap = self.graph.value(name).wrap
        if not wrap:
            return np.asarray(value)
        return runtime_form(value, self.graph.value(name), f"tensor {name!r}")


class PolykitBackend(Backend):
    """onnx.backend.base.Backend implemented by polykit's engine."""

    @classmethod
    def is_compatible(cls, model: Any, device: str = "CPU", **kwargs: Any) -> bool:
        from polykit.compiler.ops.registry import is_supported, load_ops

        load_ops()
        return all(is_supported(n.domain, n.op_type) for n in model.graph.node)

    @classmethod
    def prepare(cls, model: Any, device: str = "CPU", **kwargs: Any) -> PolykitRep:
        from polykit.compiler.graph.onnx_import import load_onnx

        target = _target_of(device)
        graph = load_onnx(model)
        config = {k: v for k, v in kwargs.items() if k in ("fp16", "fold_constants", "fuse")}
        return PolykitRep(graph, target, **config)

    @classmethod
    def run_model(cls, model: Any, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[np.ndarray, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: Any, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None,
                 **kwargs: Any) -> tuple[np.ndarray, ...]:
        """Run one NodeProto by wrapping it in a one-node model."""
        from onnx import helper

        from polykit.compiler.ir.dtypes import to_onnx

        inputs = list(inputs)
        names = [n for n in node.input]
        graph_inputs = [
            helper.make_tensor_value_info(name, to_onnx(np.asarray(x).dtype), np.asarray(x).shape)
            for name, x in zip(names, inputs) if name
        ]
        graph_outputs = [helper.make_tensor_value_info(name, 0, None) for name in node.output if name]
        opset = kwargs.get("opset_version")
        opsets = [helper.make_opsetid(node.domain or "", opset)] if opset else None
        model = helper.make_model(helper.make_graph([node], "run_node", graph_inputs, graph_outputs),
                                  **({"opset_imports": opsets} if opsets else {}))
        feeds = [np.asarray(x) for name, x in zip(names, inputs) if name]
        return cls.run_model(model, feeds, device)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        try:
            target = _target_of(device)
        except DeviceError:
            return False
        if target == "cpu":
            return True
        from polykit.runtime.target import get_target

        try:
            return bool(get_target(target).available())
        except Exception:
            return False


prepare = PolykitBackend.prepare
run_model = PolykitBackend.run_model
run_node = PolykitBackend.run_node
supports_device = PolykitBackend.supports_device

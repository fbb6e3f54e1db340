"""Lazy, composable loaders (Polygraphy's pattern).

A loader's constructor only stores its arguments; calling it does the work. Arguments
that are loaders are called first, so loaders nest:

    engine = EngineFromOnnx(FoldConstants(OnnxFromPath("m.onnx")), config=BuilderConfig(target="cpu"))
    with PolykitRunner(engine) as runner: ...

Every argument that takes a loader also takes the value itself (a path, a ModelProto,
a Graph, bytes, a Plan). This is exactly what the CLI assembles.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from polykit.backends.base import resolve
from polykit.errors import ModelLoadError, PlanError, PolykitError, UsageError
from polykit.files import require_file

#: ModifyOutputs(outputs=MARK_ALL) marks every intermediate tensor as a graph output.
MARK_ALL = "mark-all"
#: The first bytes of a plan file (polykit.compiler.plan.file.MAGIC, repeated here so that telling
#: a plan from an ONNX model imports neither numpy nor the compiler).
PLAN_MAGIC = b"PLYKPLAN"


def model_type(model: Any) -> str:
    """"plan" for a polykit plan file, told by its magic bytes whatever its name (Polygraphy's
    `--model-type engine`); "onnx" for anything else (a file that cannot be opened too: the
    loader that opens it reports that)."""
    if not isinstance(model, (str, os.PathLike)):
        return "onnx"
    try:
        with open(model, "rb") as fh:
            return "plan" if fh.read(len(PLAN_MAGIC)) == PLAN_MAGIC else "onnx"
    except OSError:
        return "onnx"


def refuse_build_options(model: Any, options: "Mapping[str, Any]") -> None:
    """UsageError when `model` is a plan file (built already) and some of `options` (flag -> the
    value given; falsy = not given) steer a build."""
    flags = [flag for flag, value in options.items() if value]
    if flags and model_type(model) == "plan":
        raise UsageError(f"{', '.join(flags)} steer(s) a build, but the model is a polykit plan (built already)",
                         where=str(model), hint="give the ONNX model to build it again, or drop these options")


class BaseLoader:
    """A callable that produces its value when called (each call does the work again)."""

    def __call__(self) -> Any:  # pragma: no cover
        raise NotImplementedError

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


def _model_proto(model: Any) -> Any:
    """A ModelProto from a path, bytes, ModelProto, Graph or loader of one."""
    import onnx

    value = resolve(model)
    if isinstance(value, onnx.ModelProto):
        return value
    if isinstance(value, (str, os.PathLike)):
        from polykit.compiler.graph.onnx_import import read_model

        return read_model(value)
    if isinstance(value, (bytes, bytearray)):
        try:
            return onnx.load_model_from_string(bytes(value))
        except Exception as exc:
            raise ModelLoadError(f"cannot parse ONNX bytes: {exc}", hint="pass a valid serialized ModelProto") from exc
    from polykit.compiler.ir.graph import Graph

    if isinstance(value, Graph):
        from polykit.compiler.graph.onnx_export import to_onnx

        return to_onnx(value)
    raise UsageError(f"expected an ONNX model (path, bytes, ModelProto or Graph), got {type(value).__name__}")


class OnnxFromPath(BaseLoader):
    """Load an onnx.ModelProto from a file, external data included."""

    def __init__(self, path: str | os.PathLike):
        self.path = path

    def __call__(self) -> Any:
        from polykit.compiler.graph.onnx_import import read_model

        return read_model(self.path)


class GraphFromOnnx(BaseLoader):
    """Import a model into polykit's Graph IR (canonical opset, shapes inferred)."""

    def __init__(self, model: Any, *, check_supported: bool = True):
        self.model = model
        self.check_supported = check_supported

    def __call__(self) -> Any:
        from polykit.compiler.ir.graph import Graph
        from polykit.compiler.graph.onnx_import import load_onnx

        value = resolve(self.model)
        if isinstance(value, Graph):
            return value
        return load_onnx(_model_proto(value), check_supported=self.check_supported)


class FoldConstants(BaseLoader):
    """Fold constant subgraphs with the compiler's folding pass; returns a ModelProto."""

    def __init__(self, model: Any):
        self.model = model

    def __call__(self) -> Any:
        from polykit.compiler.graph.onnx_export import to_onnx

        graph = GraphFromOnnx(self.model, check_supported=False)().copy()
        fold_graph_constants(graph)
        return to_onnx(graph)


def fold_graph_constants(graph: Any) -> None:
    """The compiler's folding + dead-code passes to a fixed point, shapes re-inferred after each round."""
    from polykit.compiler.graph.infer import infer_shapes
    from polykit.compiler.passes.eliminate_dead_code import eliminate_dead_code
    from polykit.compiler.passes.fold_constants import fold_constants

    keep = frozenset(graph.outputs)
    for _ in range(16):
        changed = fold_constants(graph, keep=keep)
        changed = eliminate_dead_code(graph, keep=keep) or changed
        infer_shapes(graph, strict=False)
        if not changed:
            break


class ModifyOutputs(BaseLoader):
    """Make chosen intermediate tensors (or all of them: MARK_ALL) graph outputs; returns a ModelProto.

    `exclude_outputs` removes outputs afterwards. Real outputs keep their place first.
    """

    def __init__(self, model: Any, outputs: "list[str] | str | None" = None, exclude_outputs: "list[str] | None" = None):
        self.model = model
        self.outputs = outputs
        self.exclude_outputs = exclude_outputs

    def __call__(self) -> Any:
        import onnx
        from onnx import helper

        model = onnx.ModelProto()
        model.CopyFrom(_model_proto(self.model))
        graph = model.graph
        known = _value_infos(model)
        produced = [o for node in graph.node for o in node.output if o]
        existing = [o.name for o in graph.output]
        if self.outputs == MARK_ALL:
            wanted = produced
        else:
            wanted = list(self.outputs or ())
            missing = [n for n in wanted if n not in set(produced) | {i.name for i in graph.input}]
            if missing:
                raise UsageError(
                    f"cannot mark {missing} as outputs: no such tensor in the model",
                    hint="list tensor names with `polykit inspect model MODEL --show layers`",
                )
        for name in wanted:
            if name in existing:
                continue
            existing.append(name)
            graph.output.append(known.get(name) or helper.make_empty_tensor_value_info(name))
        if self.exclude_outputs:
            keep = [o for o in graph.output if o.name not in set(self.exclude_outputs)]
            del graph.output[:]
            graph.output.extend(keep)
        return model


def _value_infos(model: Any) -> dict[str, Any]:
    """Tensor name -> ValueInfoProto with dtype (and shape when known), via ONNX shape inference."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:
        inferred = model
    infos = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        if vi.type.tensor_type.elem_type:
            infos[vi.name] = vi
    return infos


class SaveOnnx(BaseLoader):
    """Save the model to `path` (weights to `<path>.data` if external_data) and return it."""

    def __init__(self, model: Any, path: str | os.PathLike, external_data: bool = False):
        self.model = model
        self.path = path
        self.external_data = external_data

    def __call__(self) -> Any:
        from polykit.compiler.graph.onnx_export import save_model

        model = _model_proto(self.model)
        save_model(model, self.path, external_data=self.external_data)
        return model


class PlanFromOnnx(BaseLoader):
    """Build a polykit Plan from a model (path, ModelProto, Graph or loader) with a BuilderConfig."""

    def __init__(self, model: Any, config: Any = None):
        self.model = model
        self.config = config

    def __call__(self) -> Any:
        from polykit.compiler.builder.builder import build_plan
        from polykit.compiler.ir.graph import Graph

        value = resolve(self.model)
        if not isinstance(value, Graph):
            value = _model_proto(value) if not isinstance(value, (str, os.PathLike)) else value
        return build_plan(value, self.config)


class EngineFromPlan(BaseLoader):
    """Deserialize a Plan (or plan bytes, or a loader of either) into a runtime Engine; `pdl`:
    Engine's (None: as the plan's BuilderConfig.pdl says)."""

    def __init__(self, plan: Any, target: str | None = None, device: int | None = None, pdl: bool | None = None):
        self.plan = plan
        self.target = target
        self.device = device  # the GPU to load on (cuda; default 0)
        self.pdl = pdl

    def __call__(self) -> Any:
        from polykit.runtime.engine import Runtime

        value = resolve(self.plan)
        target = self.target or getattr(value, "target", None)
        return Runtime(target, device=self.device, pdl=self.pdl).deserialize_engine(value)


class EngineFromOnnx(BaseLoader):
    """Build and load an Engine: `EngineFromOnnx("m.onnx", config=BuilderConfig(fp16=True))`."""

    def __init__(self, model: Any, config: Any = None):
        self.model = model
        self.config = config

    def __call__(self) -> Any:
        return EngineFromPlan(PlanFromOnnx(self.model, self.config), device=getattr(self.config, "device", None))()


class EngineBytesFromPath(BaseLoader):
    """Read a plan file's bytes (PlanError if it does not exist)."""

    def __init__(self, path: str | os.PathLike):
        self.path = path

    def __call__(self) -> bytes:
        return require_file(self.path, "plan file", PlanError).read_bytes()


class EngineFromPath(BaseLoader):
    """Load an Engine from a plan file."""

    def __init__(self, path: str | os.PathLike, target: str | None = None, device: int | None = None):
        self.path = path
        self.target = target
        self.device = device

    def __call__(self) -> Any:
        from polykit.compiler.plan.file import Plan

        plan = Plan.load(self.path, expect_target=self.target)
        return EngineFromPlan(plan, self.target, self.device)()


class SaveEngine(BaseLoader):
    """Save what `engine` gives (a Plan, plan bytes, or an Engine that keeps its plan) to `path`;
    returns that value unchanged, so it nests: EngineFromPlan(SaveEngine(PlanFromOnnx(m), "m.plan"))."""

    def __init__(self, engine: Any, path: str | os.PathLike):
        self.engine = engine
        self.path = path

    def __call__(self) -> Any:
        value = resolve(self.engine)
        data = _plan_bytes(value)
        try:
            Path(self.path).write_bytes(data)
        except OSError as exc:
            raise PolykitError(f"cannot write the plan: {exc}", where=str(self.path)) from exc
        return value


def _plan_bytes(value: Any) -> bytes:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if hasattr(value, "serialize"):
        return value.serialize()
    plan = getattr(value, "plan", None)
    if plan is not None and hasattr(plan, "serialize"):
        return plan.serialize()
    raise UsageError(
        f"cannot serialize a {type(value).__name__} as a plan",
        hint="pass a Plan loader (PlanFromOnnx) or an Engine that keeps its plan",
    )

"""polykit's own runners, registered through the same hook a plugin uses."""

from __future__ import annotations

from polykit.backends.base import BaseRunner, RunnerRequest, RunnerSpec
from polykit.plugins import hookimpl


def make_polykit_runner(request: RunnerRequest) -> BaseRunner:
    """EngineFromOnnx(OnnxFromPath(model), BuilderConfig(...)), optionally saved, in a PolykitRunner."""
    from polykit.backends.loaders import EngineFromPlan, PlanFromOnnx, SaveEngine
    from polykit.backends.polykit_runner import PolykitRunner
    from polykit.compiler.config import BuilderConfig

    config = BuilderConfig(
        target=request.target,
        fp16=request.fp16,
        input_shapes=dict(request.input_shapes),
        mark_outputs=tuple(request.mark_outputs),
        mark_all=request.mark_all,
        fold_constants=request.fold_constants,
        **dict(request.builder_options),
    )
    plan = PlanFromOnnx(request.model, config)
    if request.save_engine:
        plan = SaveEngine(plan, request.save_engine)
    return PolykitRunner(EngineFromPlan(plan), name="trt", profile=request.profile)


def make_onnxrt_runner(request: RunnerRequest) -> BaseRunner:
    """SessionFromOnnx(model [, ModifyOutputs]) in an OnnxrtRunner."""
    from polykit.backends.loaders import MARK_ALL, ModifyOutputs
    from polykit.backends.onnxrt import OnnxrtRunner, SessionFromOnnx

    model: object = request.model
    if request.mark_all or request.mark_outputs:
        model = ModifyOutputs(model, outputs=MARK_ALL if request.mark_all else list(request.mark_outputs))
    return OnnxrtRunner(SessionFromOnnx(model, providers=request.providers), name="onnxrt")


@hookimpl
def polykit_runners() -> list[RunnerSpec]:
    return [
        RunnerSpec("trt", ("--trt", "--polykit"), make_polykit_runner,
                   "polykit's own engine (build a plan, run it on --target)"),
        RunnerSpec("onnxrt", ("--onnxrt",), make_onnxrt_runner, "ONNX Runtime (providers from --providers)"),
    ]

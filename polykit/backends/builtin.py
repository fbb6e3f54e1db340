"""polykit's own runners, registered through the same hook a plugin uses."""

from __future__ import annotations

from typing import TYPE_CHECKING

from polykit.backends.base import BaseRunner, RunnerRequest, RunnerSpec
from polykit.plugins import hookimpl

if TYPE_CHECKING:  # pragma: no cover
    from polykit.compiler.builder.config import BuilderConfig


def make_polykit_runner(request: RunnerRequest) -> BaseRunner:
    """A PolykitRunner over EngineFromPlan(PlanFromOnnx(model, BuilderConfig(...))), the plan
    optionally saved; over EngineFromPath(model) when the model is a plan file already.

    Marked tensors (mark_outputs, mark_all) are forced plan outputs with request.force_marks;
    otherwise observed: the engine is the unmarked one, exposing the marked tensors that lie
    between its layers (polykit.compiler.builder.marking)."""
    from polykit.backends.loaders import (EngineFromPath, EngineFromPlan, PlanFromOnnx, SaveEngine, model_type,
                                          refuse_build_options)
    from polykit.backends.polykit_runner import PolykitRunner
    from polykit.compiler.builder.config import BuilderConfig

    if model_type(request.model) == "plan":
        defaults = BuilderConfig()
        refuse_build_options(request.model, {
            "--fp16": request.fp16, "--mark-outputs": request.mark_outputs,
            "--mark-all": request.mark_all, "--save-engine": request.save_engine,
            "--load-tactics": request.load_tactics, "--save-tactics": request.save_tactics,
            "--channels-last/--no-channels-last": request.channels_last is not None,
            **{f"--{k.replace('_', '-')}": v != getattr(defaults, k, v) for k, v in request.builder_options.items()
               if k != "device"}})  # --device also picks the GPU a plan runs on
        return PolykitRunner(EngineFromPath(request.model, request.target, request.builder_options.get("device")),
                             **runner_options(request))
    config = builder_config(request)
    if config.ranks > 1:
        from polykit.backends.ranks_runner import RanksRunner
        from polykit.errors import UsageError

        streaming = request.weight_streaming_budget is not None or request.weight_streaming_percent is not None
        if request.save_engine or request.profile or streaming:
            raise UsageError("--ranks runs one plan per rank: --save-engine, --profile and --weight-streaming-budget "
                             "are not offered with it",
                             hint="write the rank plans with `polykit convert MODEL --ranks N -o model.plan`")
        return RanksRunner(request.model, config, name="trt")
    plan = PlanFromOnnx(request.model, config)
    if request.save_engine:
        plan = SaveEngine(plan, request.save_engine)
    return PolykitRunner(EngineFromPlan(plan, device=config.device), **runner_options(request))


def runner_options(request: RunnerRequest) -> dict:
    """PolykitRunner's keyword arguments (besides the engine) that `request` gives."""
    return {"name": "trt", "profile": request.profile, "optimization_profile": request.optimization_profile,
            "weight_streaming_budget": request.weight_streaming_budget,
            "weight_streaming_percent": request.weight_streaming_percent,
            "allocation_strategy": request.allocation_strategy}


def builder_config(request: RunnerRequest) -> "BuilderConfig":
    """The BuilderConfig polykit's engine is built with for `request`."""
    from polykit.compiler.builder.config import BuilderConfig

    return BuilderConfig(
        target=request.target,
        fp16=request.fp16,
        channels_last=request.channels_last,
        input_shapes=dict(request.input_shapes),
        expose_tensors=tuple(request.mark_outputs),
        mark_all=request.mark_all,
        force_marks=request.force_marks,
        fold_constants=request.fold_constants,
        tactic_replay=request.load_tactics,
        save_tactics=request.save_tactics,
        **dict(request.builder_options),
    )


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
                   "polykit's own engine (build a plan, run it on --target; or run a plan file)",
                   model_types=("onnx", "plan")),
        RunnerSpec("onnxrt", ("--onnxrt",), make_onnxrt_runner, "ONNX Runtime (providers from --providers)"),
    ]

"""`polykit convert MODEL -o model.plan`: build a plan with polykit's compiler and save it.
`polykit convert MODEL --fp-to-fp16 -o model_fp16.onnx`: write an ONNX model computing in float16
(Polygraphy's --fp-to-fp16; polykit.tools.model.onnx_edits.to_fp16) instead."""

from __future__ import annotations

from pathlib import Path
from typing import Any, List, Optional

import typer

from polykit.tools.cli.args import LOAD_TACTICS, SAVE_TACTICS, channels_last_option, with_builder_options


def convert(
    model: str = typer.Argument(..., metavar="MODEL", help="the ONNX model"),
    output: str = typer.Option(..., "--output", "-o", help="where to write the plan"),
    channels_last: Optional[bool] = channels_last_option(),
    target: Optional[str] = typer.Option(None, "--target", help="cuda|cpu (default: cuda if usable)"),
    input_shapes: List[str] = typer.Option([], "--input-shapes", help="shapes for dynamic inputs: x:[1,3,224,224]"),
    mark_outputs: List[str] = typer.Option([], "--mark-outputs",
                                           help="intermediate tensors to make outputs (kept from fusion)"),
    mark_all: bool = typer.Option(False, "--mark-all",
                                  help="expose every intermediate tensor a layer writes as an output (fusion unchanged)"),
    load_inputs: Optional[str] = typer.Option(None, "--load-inputs", "--load-input-data",
                                              help="feeds (.npz or .json): the opt values of "
                                              "shape-tensor inputs, whose ranges the model's ops give"),
    fp_to_fp16: bool = typer.Option(False, "--fp-to-fp16", help="write an ONNX model computing in float16 (I/O "
                                                                "stays float32) to --output instead of a plan"),
    data_loader_script: Optional[str] = typer.Option(None, "--data-loader-script", metavar="FILE.py[:FUNC]",
                                                     help="Polygraphy's spelling of --calibration-data FILE.py: "
                                                          "the INT8 calibration batches"),
    model_type_name: Optional[str] = typer.Option(None, "--model-type", help="onnx (Polygraphy's option; checked "
                                                  "against the file)"),
    load_tactics: Optional[str] = LOAD_TACTICS,
    save_tactics: Optional[str] = SAVE_TACTICS,
    tactic_replay: Optional[str] = typer.Option(None, "--tactic-replay", hidden=True,
                                                help="the old name of --load-tactics"),
    refittable: bool = typer.Option(False, "--refittable", help="record how the weights derive from the model's "
                                    "initializers, so `polykit refit` can replace them (docs/REFIT.md)"),
    builder_options: Any = None,
) -> int:
    from polykit.backends.loaders import PlanFromOnnx, SaveEngine
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.errors import UsageError
    from polykit.files import require_output_folder
    from polykit.tools.cli.app import stderr_console
    from polykit.tools.cli.args import calibration_source, parse_input_shapes
    from polykit.tools.cli.spellings import check_model_type
    from polykit.tools.data.results_io import load_feeds
    from polykit.tools.cli.run import feed_shape_values, resolve_target

    if load_tactics and tactic_replay and load_tactics != tactic_replay:
        raise UsageError("--load-tactics and --tactic-replay (its old name) name different files",
                         hint="give one --load-tactics FILE")
    require_output_folder(output, "--output")
    check_model_type(model, model_type_name)
    if fp_to_fp16:
        return _convert_fp16(model, output)
    if data_loader_script:
        if builder_options["calibration_data"] is not None:
            raise UsageError("--data-loader-script and --calibration-data both give calibration data",
                             hint="give one of them")
        builder_options = {**builder_options, "calibration_data": calibration_source(data_loader_script)}
    if save_tactics:
        require_output_folder(save_tactics, "--save-tactics")
    if load_inputs:
        builder_options = feed_shape_values(model, builder_options, None, None, load_feeds(load_inputs))
    config = BuilderConfig(
        target=resolve_target(target, ["trt"]), channels_last=channels_last,
        input_shapes=parse_input_shapes(input_shapes),
        mark_outputs=tuple(mark_outputs), mark_all=mark_all, tactic_replay=load_tactics or tactic_replay,
        save_tactics=save_tactics, refittable=refittable, **builder_options,
    )
    if config.ranks > 1:
        return _convert_ranks(model, config, output)
    plan = SaveEngine(PlanFromOnnx(model, config), output)()
    memory = plan.metadata.get("device_memory", {})
    tuning = plan.metadata.get("tuning", {})
    console = stderr_console()
    console.print(f"wrote {output}: {len(plan.layers)} layers, target {plan.target}, "
                  f"{plan.weight_bytes} weight bytes, arena {plan.memory.arena_bytes} bytes, "
                  f"workspace {memory.get('workspace_bytes', 0)} bytes, device memory {memory.get('total_bytes', 0)} bytes")
    if tuning.get("cache_hits") or tuning.get("cache_misses") or tuning.get("timed_tactics"):
        console.print(f"tuning (level {config.builder_optimization_level}): {tuning['timed_tactics']} tactics of "
                      f"{tuning['timed_layers']} layers timed; timing cache {tuning['cache_hits']} hits, "
                      f"{tuning['cache_misses']} misses")
    return 0


def _convert_fp16(model: str, output: str) -> int:
    from polykit.backends.loaders import OnnxFromPath
    from polykit.compiler.graph.onnx_export import save_model
    from polykit.tools.cli.app import stderr_console
    from polykit.tools.model.onnx_edits import to_fp16

    converted = to_fp16(OnnxFromPath(model)())
    save_model(converted, output)
    stderr_console().print(f"wrote {output}: an ONNX model computing in float16 ({len(converted.graph.node)} nodes)")
    return 0


def rank_plan_paths(output: str, ranks: int) -> list[Path]:
    """model.plan -> model.rank0.plan, model.rank1.plan, ... (one per rank)."""
    path = Path(output)
    return [path.with_name(f"{path.stem}.rank{r}{path.suffix or '.plan'}") for r in range(ranks)]


def _convert_ranks(model: str, config: Any, output: str) -> int:
    from polykit.compiler.builder.distributed import build_rank_plans
    from polykit.tools.cli.app import stderr_console

    console = stderr_console()
    for plan, path in zip(build_rank_plans(model, config), rank_plan_paths(output, config.ranks)):
        plan.save(path)
        collectives = sum(1 for layer in plan.layers if layer.kind == "DistCollective")
        console.print(f"wrote {path}: rank {plan.metadata['rank']} of {plan.metadata['ranks']}, {len(plan.layers)} "
                      f"layers ({collectives} collectives), target {plan.target}, {plan.weight_bytes} weight bytes")
    return 0


def register(app: typer.Typer) -> None:
    app.command("convert", help="Build a polykit plan from an ONNX model and save it.")(with_builder_options(convert))

"""`polykit run MODEL --trt --onnxrt`: run a model through several runners on identical
inputs and report, output by output, whether and where they disagree.

Runner flags come from the polykit_runners hook (built-ins: --trt/--polykit, --onnxrt);
the CLI rewrites each into `--runner NAME` so their order is kept (the first runner is
the reference). Everything here is assembled from the Python API: a script that builds
the same runners and calls polykit.tools.accuracy.run_comparison does the same thing.
"""

from __future__ import annotations

import json
import logging
from typing import Any, List, Optional

import typer

from polykit.errors import UsageError
from polykit.tools.cli_args import (LOAD_TACTICS, SAVE_TACTICS, channels_last_option, with_builder_options,
                                   with_compare_options)
from polykit.files import require_output_folder

log = logging.getLogger("polykit")


def _runner_help() -> str:
    from polykit.plugins import runner_specs

    lines = [f"{', '.join(s.flags)}: {s.help}" for s in runner_specs().values()]
    return "Runners (in the order given; the first is the reference):\n\n" + "\n\n".join(lines)


def resolve_target(target: Optional[str], runners: List[str], model: Optional[str] = None) -> Optional[str]:
    """--target, or cuda when a GPU is usable, else cpu with a one-line notice (only if the engine
    builds: a plan file runs on the target it was built for)."""
    if target is not None:
        if target not in ("cuda", "cpu"):
            raise UsageError(f"--target {target!r} is not cuda or cpu")
        return target
    if "trt" not in runners:
        return None
    if model is not None:
        from polykit.backends.loaders import model_type

        if model_type(model) == "plan":
            return None
    from polykit.runtime.target import default_target

    chosen = default_target()
    if chosen == "cpu":
        from polykit.tools.cli import stderr_console

        stderr_console().print("notice: no usable CUDA GPU; polykit runs on the cpu target (reference kernels)")
    return chosen


def run(
    model: str = typer.Argument(..., metavar="MODEL", help="the ONNX model, or a polykit plan (--trt only)"),
    runner: List[str] = typer.Option([], "--runner", help="runner by name (the runner flags map to this)"),
    target: Optional[str] = typer.Option(None, "--target", help="cuda|cpu for polykit's engine (default: cuda if usable)"),
    channels_last: Optional[bool] = channels_last_option(),
    providers: List[str] = typer.Option([], "--providers", help="onnxruntime providers, e.g. cpu cuda"),
    input_shapes: List[str] = typer.Option([], "--input-shapes", help="shapes for dynamic inputs: x:[1,3,224,224]"),
    val_range: List[str] = typer.Option([], "--val-range", help="value ranges: x:[-1,1] or [0,5] for all inputs"),
    seed: int = typer.Option(1, "--seed", help="seed of the random data loader"),
    iterations: int = typer.Option(1, "--iterations", help="how many feed dicts to run"),
    data_loader: str = typer.Option("default", "--data-loader", help="data loader by name (plugins add more)"),
    data_loader_script: Optional[str] = typer.Option(None, "--data-loader-script", help="file.py[:func] defining load_data()"),
    validate: bool = typer.Option(False, "--validate", help="fail on NaN or Inf in any output"),
    mark_all: bool = typer.Option(False, "--mark-all", help="compare every intermediate tensor too"),
    mark_outputs: List[str] = typer.Option([], "--mark-outputs", help="intermediate tensors to compare too"),
    save_inputs: Optional[str] = typer.Option(None, "--save-inputs", help="write the feeds (.npz or .json)"),
    load_inputs: Optional[str] = typer.Option(None, "--load-inputs", help="read the feeds (.npz or .json)"),
    save_outputs: Optional[str] = typer.Option(None, "--save-outputs", help="write every runner's outputs (.npz or .json)"),
    load_outputs: List[str] = typer.Option([], "--load-outputs", help="compare runners against saved outputs"),
    save_engine: Optional[str] = typer.Option(None, "--save-engine", help="write polykit's plan to this file"),
    load_tactics: Optional[str] = LOAD_TACTICS,
    save_tactics: Optional[str] = SAVE_TACTICS,
    warm_up: int = typer.Option(0, "--warm-up", help="untimed runs before the timed ones"),
    profile: bool = typer.Option(False, "--profile", help="time every layer of polykit's engine (CUDA events on cuda)"),
    profile_top: int = typer.Option(15, "--profile-top", help="how many of the slowest layers --profile lists"),
    as_json: bool = typer.Option(False, "--json", help="print a machine-readable report on stdout"),
    builder_options: Any = None,
    compare_settings: Any = None,
) -> int:
    from rich.console import Console

    from polykit.backends.base import RunnerRequest
    from polykit.tools import cli_args, results_io
    from polykit.tools.accuracy import AccuracySettings, make_runners, run_comparison
    from polykit.tools.data_loader import DataLoaderOptions
    from polykit.tools.report import render, to_json

    shapes = cli_args.parse_input_shapes(input_shapes)
    if data_loader_script:
        data_loader = "script"
        if builder_options["int8"] and builder_options["calibration_data"] is None:  # it calibrates too
            from polykit.tools.data_loader import ScriptDataLoader

            builder_options = {**builder_options, "calibration_data": ScriptDataLoader(data_loader_script)}
    settings = AccuracySettings(
        **compare_settings, data_loader=data_loader, validate=validate, warm_up=warm_up,
        data_options=DataLoaderOptions(seed=seed, iterations=iterations, val_ranges=cli_args.parse_val_ranges(val_range),
                                       input_shapes=shapes, script=data_loader_script),
    )
    request = RunnerRequest(
        model=model, target=resolve_target(target, runner, model), fp16=builder_options["fp16"],
        channels_last=channels_last, input_shapes=shapes,
        providers=tuple(providers), mark_outputs=tuple(mark_outputs), mark_all=mark_all, save_engine=save_engine,
        profile=profile, load_tactics=load_tactics, save_tactics=save_tactics,
        builder_options={k: v for k, v in builder_options.items() if k != "fp16"},
    )
    if not runner and not load_outputs:
        raise UsageError("no runner selected", hint="add runner flags, e.g. `polykit run MODEL --trt --onnxrt`")
    for option, path in (("--save-inputs", save_inputs), ("--save-outputs", save_outputs), ("--save-engine", save_engine)):
        if path:
            require_output_folder(path, option)
    reference = {}
    for path in load_outputs:
        for name, outs in results_io.load_outputs(path).items():
            reference[name if name not in reference else f"{name}-{len(reference)}"] = outs
    feeds = results_io.load_feeds(load_inputs) if load_inputs else None
    runners = make_runners(runner, request)
    results, report = run_comparison(runners, settings, feeds=feeds, reference_outputs=reference)
    if save_inputs:
        results_io.save_feeds(save_inputs, results.feeds)
    if save_outputs:
        results_io.save_outputs(save_outputs, {k: v for k, v in results.outputs.items() if k not in reference})
    profiles = _profiles(runners) if profile else {}
    if as_json:
        doc = to_json(report, results)
        if profile:
            doc["profile"] = {name: summary.to_json() for name, summary in profiles.items()}
        typer.echo(json.dumps(doc, indent=2))
    else:
        console = Console(highlight=False)
        render(console, report, results)
        if profile and not profiles:
            console.print("--profile: no polykit engine ran (add --trt)")
        for name, summary in profiles.items():
            from polykit.tools.profile_report import render as render_profile

            render_profile(console, f"{name} per-layer profile", summary, top=profile_top)
    return 0 if report.passed else 1


def _profiles(runners) -> dict:
    """Per-layer profile summaries of the runners that recorded any (polykit's engine)."""
    from polykit.tools.profile_report import summarize

    return {r.name: summarize(r.layer_times, r.layers) for r in runners if getattr(r, "layer_times", None)}


def register(app: typer.Typer) -> None:
    app.command(
        "run",
        help="Run MODEL through several runners on identical inputs and compare their outputs.",
        epilog=_runner_help(),
    )(with_builder_options(with_compare_options(run)))

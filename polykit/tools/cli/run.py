"""`polykit run MODEL --trt --onnxrt`: run a model through several runners on identical
inputs and report, output by output, whether and where they disagree.

Runner flags come from the polykit_runners hook (built-ins: --trt/--polykit, --onnxrt);
the CLI rewrites each into `--runner NAME` so their order is kept (the first runner is
the reference). Everything here is assembled from the Python API: a script that builds
the same runners and calls polykit.tools.compare.accuracy.run_comparison does the same thing.

Layerwise runs (--mark-all, --mark NAME..., or --load-outputs of saved marked tensors) compare
in the ONNX graph's topological order and name the first divergence (polykit.tools.compare.divergence);
live outputs go to an .npz on disk as they are produced (the --save-outputs file, else a
temporary one) and are compared one tensor at a time (polykit.tools.data.output_store).
"""

from __future__ import annotations

import json
import logging
from contextlib import ExitStack
from pathlib import Path
from typing import Any, List, Optional

import typer

from polykit.errors import UsageError
from polykit.tools.cli.args import (LOAD_TACTICS, SAVE_TACTICS, channels_last_option, with_builder_options,
                                   with_compare_options, with_runtime_options)
from polykit.tools.cli.spellings import check_model_type, polygraphy_marks
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
            raise UsageError(f"--target {target!r} is not cuda or cpu", hint="give --target cuda or --target cpu")
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
        from polykit.tools.cli.app import stderr_console

        stderr_console().print("notice: no usable CUDA GPU; polykit runs on the cpu target (reference kernels)")
    return chosen


def feed_shape_values(model: str, builder_options: dict, load_inputs: Optional[str], script: Optional[str],
                      feeds: "list | None" = None) -> dict:
    """`builder_options` with `shape_values` from the first feed (of `feeds`, else the
    --load-inputs file when it exists, else the --data-loader-script's first) when MODEL is ONNX
    and no flag gives shape-tensor values: the builder ranges its shape-tensor inputs over what
    the model allows, opt at these values (it does not use the values of inputs that decide no shape)."""
    import numpy as np

    from polykit.backends.loaders import model_type
    from polykit.compiler.builder.value_ranges import MAX_ELEMENTS
    from polykit.tools.data.results_io import load_feeds

    if builder_options.get("shape_values") or any(p.values for p in builder_options["profiles"]) \
            or model_type(model) != "onnx":
        return builder_options
    if not feeds and load_inputs and Path(load_inputs).exists():  # (--gen-script: the file may come later)
        feeds = load_feeds(load_inputs)
    if feeds:
        first = feeds[0]
    elif script:
        from polykit.tools.data.loaders import ScriptDataLoader

        first = next(iter(ScriptDataLoader(script)), {})
    else:
        return builder_options
    values = {name: np.asarray(v) for name, v in first.items() if isinstance(v, (np.ndarray, np.generic, int, float))}
    values = {name: v for name, v in values.items() if v.ndim <= 1 and v.size <= MAX_ELEMENTS and v.dtype.kind in "iuf"}
    return {**builder_options, "shape_values": values} if values else builder_options


def refuse_ignored_with_load_inputs(*, data_loader_script: Optional[str], seed: Optional[int],
                                    iterations: Optional[int], val_range: List[str], data_loader: str) -> None:
    """UsageError when --load-inputs comes with options that make feeds: the file gives the
    feeds, so they would be silently ignored (a missing script included)."""
    ignored = [option for option, given in (("--data-loader-script", data_loader_script is not None),
                                            ("--data-loader", data_loader != "default"), ("--seed", seed is not None),
                                            ("--iterations", iterations is not None), ("--val-range", bool(val_range)))
               if given]
    if ignored:
        raise UsageError(f"--load-inputs reads the feeds from a file; {', '.join(ignored)} would make feeds that are "
                         "never used", hint=f"drop {' and '.join(ignored)}, or drop --load-inputs to make feeds")


def run(
    model: str = typer.Argument(..., metavar="MODEL", help="the ONNX model, or a polykit plan (--trt only)"),
    runner: List[str] = typer.Option([], "--runner", help="runner by name (the runner flags map to this)"),
    target: Optional[str] = typer.Option(None, "--target", help="cuda|cpu for polykit's engine (default: cuda if usable)"),
    channels_last: Optional[bool] = channels_last_option(),
    providers: List[str] = typer.Option([], "--providers", help="onnxruntime providers, e.g. cpu cuda"),
    input_shapes: List[str] = typer.Option([], "--input-shapes", help="shapes for dynamic inputs: x:[1,3,224,224]"),
    val_range: List[str] = typer.Option([], "--val-range", help="value ranges: x:[-1,1] or [0,5] for all inputs"),
    seed: Optional[int] = typer.Option(None, "--seed", help="seed of the random data loader [default: 1]"),
    iterations: Optional[int] = typer.Option(None, "--iterations", help="how many feed dicts to run [default: 1]"),
    data_loader: str = typer.Option("default", "--data-loader", help="data loader by name (plugins add more)"),
    data_loader_script: Optional[str] = typer.Option(None, "--data-loader-script", help="file.py[:func] defining load_data()"),
    validate: bool = typer.Option(False, "--validate", help="fail on NaN or Inf in any output"),
    strict_inputs: bool = typer.Option(False, "--strict-inputs",
                                       help="a dynamic dim no shape gives, and a feed named for no model input, are "
                                            "errors (default: 1 for the dim; a feed matching one input "
                                            "case-insensitively is renamed, others ignored; one warning each)"),
    mark_all: bool = typer.Option(False, "--mark-all",
                                  help="compare every intermediate tensor too; names the first divergence"),
    mark_outputs: List[str] = typer.Option([], "--mark-outputs", "--mark",
                                           help="intermediate tensors to compare too (polykit's engine is built with "
                                                "them as outputs)"),
    polygraphy_outputs: List[str] = typer.Option([], "--trt-outputs", "--onnx-outputs",
                                                 help="Polygraphy's spelling: tensors to compare too (as --mark), "
                                                      "'mark all' or '*' for every tensor (as --mark-all); either "
                                                      "option marks them for every runner"),
    observe_marks: bool = typer.Option(False, "--observe-marks",
                                       help="with --mark-all/--mark: keep polykit's engine as unmarked and compare only "
                                            "the marked tensors its layers write (the rest are listed as fused away)"),
    save_inputs: Optional[str] = typer.Option(None, "--save-inputs", help="write the feeds (.npz or .json)"),
    load_inputs: Optional[str] = typer.Option(None, "--load-inputs", "--load-input-data",
                                              help="read the feeds (.npz, .json or a folder)"),
    save_outputs: Optional[str] = typer.Option(None, "--save-outputs", "--save-results",
                                               help="write every runner's outputs (.npz or .json)"),
    load_outputs: List[str] = typer.Option([], "--load-outputs", help="compare runners against saved outputs"),
    save_format: Optional[str] = typer.Option(None, "--format", help="of --save-inputs/--save-outputs: by default "
                                              "Polygraphy's JSON for a .json path, polykit's .npz otherwise; polykit "
                                              "(.npz, or polykit's JSON for .json) or polygraphy (Polygraphy's JSON; "
                                              "no suffix: a folder)"),
    gen_script: Optional[str] = typer.Option(None, "--gen-script", metavar="FILE",
                                             help="write a Python script that does what this command does, and exit"),
    save_engine: Optional[str] = typer.Option(None, "--save-engine", help="write polykit's plan to this file"),
    load_tactics: Optional[str] = LOAD_TACTICS,
    save_tactics: Optional[str] = SAVE_TACTICS,
    warm_up: int = typer.Option(0, "--warm-up", help="untimed runs before the timed ones"),
    profile: bool = typer.Option(False, "--profile", help="time every layer of polykit's engine (CUDA events on cuda)"),
    profile_top: int = typer.Option(15, "--profile-top", help="how many of the slowest layers --profile lists"),
    as_json: bool = typer.Option(False, "--json", help="print a machine-readable report on stdout"),
    report_html: Optional[str] = typer.Option(None, "--report", metavar="FILE.html",
                                              help="write a self-contained HTML report (charts, histograms)"),
    optimization_profile: int = typer.Option(0, "--optimization-profile", metavar="N",
                                             help="the optimization profile polykit's engine runs in (default 0)"),
    model_type_name: Optional[str] = typer.Option(None, "--model-type", help="onnx or engine/plan (Polygraphy's "
                                                  "option; polykit tells the kind from the file and checks it)"),
    builder_options: Any = None,
    compare_settings: Any = None,
    runtime_options: Any = None,
) -> int:
    from rich.console import Console

    from polykit.backends.base import RunnerRequest
    from polykit.tools.cli import args as cli_args
    from polykit.tools.data import results_io
    from polykit.tools.compare.accuracy import AccuracySettings, make_runners, run_comparison
    from polykit.tools.data.loaders import DataLoaderOptions
    from polykit.tools.compare.divergence import analyze
    from polykit.tools.report.comparison import render, to_json

    if load_inputs:
        refuse_ignored_with_load_inputs(data_loader_script=data_loader_script, seed=seed, iterations=iterations,
                                        val_range=val_range, data_loader=data_loader)
    seed, iterations = 1 if seed is None else seed, 1 if iterations is None else iterations
    check_model_type(model, model_type_name)
    mark_all, mark_outputs = polygraphy_marks(mark_all, mark_outputs, polygraphy_outputs)
    profiles = builder_options["profiles"]
    if optimization_profile < 0 or profiles and optimization_profile >= len(profiles):
        raise UsageError(f"--optimization-profile {optimization_profile} is not one of the {len(profiles)} "
                         "profile(s) that --trt-min-shapes, --trt-opt-shapes and --trt-max-shapes give", hint=f"give 0 to {max(len(profiles) - 1, 0)}")
    opt = cli_args.opt_shapes(profiles[optimization_profile:optimization_profile + 1])
    shapes = cli_args.parse_input_shapes(input_shapes)
    feeds = results_io.load_feeds(load_inputs) if load_inputs and not gen_script else None
    if data_loader_script and feeds is None and "trt" in runner and not gen_script:
        from polykit.tools.data.loaders import ScriptDataLoader

        # the script runs once: its feeds give the build's shapes, calibrate (--int8 / --fp8) and are compared
        feeds = list(ScriptDataLoader(data_loader_script, strict_inputs))
    if ("trt" in runner or feeds) and not gen_script:
        feeds, shapes = _model_feeds(model, feeds, {**opt, **shapes}, strict_inputs, load_inputs or data_loader_script)
    if "trt" in runner:
        builder_options = feed_shape_values(model, builder_options, load_inputs, data_loader_script, feeds)
    if data_loader_script:
        data_loader = "script"
        if (builder_options["int8"] or builder_options["fp8"]) and builder_options["calibration_data"] is None:  # it calibrates too
            from polykit.tools.data.loaders import ScriptDataLoader

            builder_options = {**builder_options,
                               "calibration_data": feeds if feeds is not None else ScriptDataLoader(data_loader_script)}
    settings = AccuracySettings(
        **compare_settings, data_loader=data_loader, validate=validate, warm_up=warm_up,
        data_options=DataLoaderOptions(seed=seed, iterations=iterations, val_ranges=cli_args.parse_val_ranges(val_range),
                                       input_shapes={**opt, **shapes},
                                       script=data_loader_script, strict_inputs=strict_inputs),
    )
    request = RunnerRequest(
        model=model, target=target if gen_script else resolve_target(target, runner, model), fp16=builder_options["fp16"],
        channels_last=channels_last, input_shapes=shapes,
        providers=tuple(providers), mark_outputs=tuple(mark_outputs), mark_all=mark_all,
        force_marks=bool(mark_all or mark_outputs) and not observe_marks, save_engine=save_engine,
        optimization_profile=optimization_profile, **(runtime_options or {}),
        profile=profile, load_tactics=load_tactics, save_tactics=save_tactics,
        builder_options={k: v for k, v in builder_options.items() if k != "fp16"},
    )
    if not runner and not load_outputs:
        raise UsageError("no runner selected", hint="add runner flags, e.g. `polykit run MODEL --trt --onnxrt`")
    for option, path in (("--save-inputs", save_inputs), ("--save-outputs", save_outputs), ("--save-engine", save_engine),
                         ("--report", report_html), ("--gen-script", gen_script)):
        if path:
            require_output_folder(path, option)
    if save_format is not None:
        results_io.check_format(save_format)
    runners = make_runners(runner, request)
    if gen_script:
        from polykit.tools.cli.gen_script import RunScript, write_script

        write_script(gen_script, RunScript(
            tuple(runner), request, settings, load_inputs, tuple(load_outputs), save_inputs, save_outputs, save_format,
            as_json, profile_top))
        typer.echo(f"wrote {gen_script}: run it with python to do what this command does")
        return 0
    order = graph_order(model) if mark_all or mark_outputs or len(runner) + len(load_outputs) > 1 else None
    with ExitStack() as stack:
        reference = load_reference(load_outputs, stack)
        store = None
        if runners and (mark_all or mark_outputs):
            spill = save_outputs if save_outputs and results_io.save_format(save_outputs, save_format) == "polykit" \
                else None
            store = stack.enter_context(_output_store(spill, load_outputs, stack))
        results, report = run_comparison(runners, settings, feeds=feeds, reference_outputs=reference, store=store,
                                          optional=order.intermediates if order else frozenset())
        layerwise = analyze(report, order) if order else None
        if save_inputs:
            results_io.save_feeds(save_inputs, results.feeds, save_format)
        if save_outputs and (store is None or store.path != Path(save_outputs)):
            results_io.save_outputs(save_outputs, {k: [dict(o) for o in v] for k, v in results.outputs.items()
                                                   if k not in reference}, save_format, results.times)
        profiles = _profiles(runners) if profile else {}
        doc = to_json(report, results, layerwise)
        if profile:
            doc["profile"] = {name: summary.to_json() for name, summary in profiles.items()}
    if report_html:
        from polykit.tools.report.html import save_html

        save_html(report_html, {"title": f"polykit run {Path(model).name}", **doc})
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
    else:
        console = Console(highlight=False)
        detail = "quiet" if not log.isEnabledFor(logging.WARNING) else "verbose" if log.isEnabledFor(logging.INFO) else "normal"
        render(console, report, results, layerwise, detail)
        if profile and detail != "quiet":
            _render_profiles(console, profiles, profile_top)
    return 0 if report.passed else 1


def _render_profiles(console: Any, profiles: dict, top: int) -> None:
    from polykit.tools.report.profile import render as render_profile

    if not profiles:
        console.print("--profile: no polykit engine ran (add --trt)")
    for name, summary in profiles.items():
        render_profile(console, f"{name} per-layer profile", summary, top=top)


def _model_feeds(model: str, feeds: "list | None", given: dict, strict: bool,
                 source: Optional[str]) -> tuple["list | None", dict]:
    """Feeds matched to an ONNX model's inputs, and shapes for its dynamic inputs no option gives
    (the feeds' shapes, else 1 per dim; polykit.tools.data.feeds): what polykit's engine is built
    for. A plan file, or a model onnx cannot read, passes through unchanged."""
    from polykit.backends.loaders import model_type
    from polykit.tools.data.feeds import FeedMatcher, default_input_shapes, onnx_input_shapes

    inputs = onnx_input_shapes(model) if model_type(model) == "onnx" else None
    if inputs is None:
        return feeds, given
    if feeds:
        match = FeedMatcher(inputs, strict=strict, source=source or "the feeds")
        feeds = [match(f) for f in feeds]
    return feeds, {**default_input_shapes(inputs, given, feeds, strict=strict), **given}


def graph_order(model: str) -> Any:
    """The ONNX model's GraphOrder; None for a plan file (no ONNX graph to order tensors by) or a
    model onnx cannot read (the runners report why)."""
    from polykit.backends.loaders import model_type
    from polykit.tools.compare.divergence import GraphOrder

    if model_type(model) != "onnx":
        return None
    try:
        return GraphOrder.from_onnx(model)
    except Exception:  # onnx raises protobuf's and its own errors; the runner's loader explains them
        return None


def load_reference(paths: List[str], stack: ExitStack) -> dict[str, list]:
    """{runner: outputs per iteration} of --load-outputs files; polykit .npz files are read lazily
    (one tensor at a time, when compared), their archives closed by `stack`."""
    from polykit.tools.data import results_io
    from polykit.tools.data.output_store import open_outputs

    reference: dict[str, list] = {}
    for path in paths:
        opened = open_outputs(path)
        if opened is not None:
            stack.callback(opened[0].close)
        for name, outs in (opened[1] if opened else results_io.load_outputs(path)).items():
            reference[name if name not in reference else f"{name}-{len(reference)}"] = outs
    return reference


def _output_store(save_outputs: Optional[str], load_outputs: List[str], stack: ExitStack) -> Any:
    """An OutputStore writing to the --save-outputs .npz (unless a --load-outputs file is read
    from there: it is saved after the comparison), else to a temporary file."""
    import tempfile

    from polykit.tools.data.output_store import OutputStore

    if save_outputs and Path(save_outputs).suffix != ".json" and \
            Path(save_outputs).resolve() not in {Path(p).resolve() for p in load_outputs}:
        return OutputStore(save_outputs)
    folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="polykit-layerwise-"))
    return OutputStore(Path(folder) / "outputs.npz", keep=False)


def _profiles(runners) -> dict:
    """Per-layer profile summaries of the runners that recorded any (polykit's engine)."""
    from polykit.tools.report.profile import summarize

    return {r.name: summarize(r.layer_times, r.layers) for r in runners if getattr(r, "layer_times", None)}


def register(app: typer.Typer) -> None:
    app.command(
        "run",
        help="Run MODEL through several runners on identical inputs and compare their outputs.",
        epilog=_runner_help(),
    )(with_builder_options(with_compare_options(with_runtime_options(run))))

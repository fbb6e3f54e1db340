"""`polykit bench MODEL|PLAN`: how fast polykit's engine runs a model (trtexec's role).

A thin layer over polykit.tools.bench.benchmark (whose docstring defines warm-up, iterations,
duration, latency, compute time and throughput): build the plan (timed) or load a plan
file, run it on random inputs (or those --load-inputs gives), print latency percentiles, throughput, compute vs
end-to-end time and, with --profile, the per-layer table of `polykit run --profile`.
"""

from __future__ import annotations

import json
from typing import Any, List, Optional

import typer

from polykit.tools.cli.args import (LOAD_TACTICS, SAVE_TACTICS, channels_last_option, with_builder_options,
                                   with_runtime_options)


def bench(
    model: str = typer.Argument(..., metavar="MODEL", help="an ONNX model or a polykit plan"),
    target: Optional[str] = typer.Option(None, "--target", help="cuda|cpu (default: cuda if usable; a plan: its own)"),
    channels_last: Optional[bool] = channels_last_option(),
    input_shapes: List[str] = typer.Option([], "--input-shapes", help="shapes for dynamic inputs: x:[1,3,224,224] "
                                                                      "(a profile-built plan runs at them)"),
    load_tactics: Optional[str] = LOAD_TACTICS,
    save_tactics: Optional[str] = SAVE_TACTICS,
    save_engine: Optional[str] = typer.Option(None, "--save-engine", help="write the plan built for the benchmark"),
    warm_up: float = typer.Option(200.0, "--warm-up", metavar="MS", help="untimed runs for at least MS milliseconds"),
    iterations: int = typer.Option(10, "--iterations", help="time at least this many runs"),
    duration: float = typer.Option(3.0, "--duration", metavar="S", help="and for at least S seconds"),
    data_transfers: bool = typer.Option(True, "--data-transfers/--no-data-transfers",
                                        help="cuda: include host<->device copies of the I/O in the latency"),
    cuda_graph: bool = typer.Option(True, "--cuda-graph/--no-cuda-graph", help="cuda: replay the layers as a CUDA graph"),
    in_place: bool = typer.Option(False, "--io-in-place/--io-copies",
                                  help="cuda: bind the I/O buffers in place (set_tensor_address) or copy them into "
                                       "the engine's memory around each run (the default)"),
    load_inputs: Optional[str] = typer.Option(None, "--load-inputs", metavar="FILE",
                                              help="time on these inputs (the first feed of a saved-inputs file, "
                                                   "as `polykit run --save-inputs` writes) instead of random data"),
    profile: bool = typer.Option(False, "--profile", help="then time every layer (a separate pass of --iterations runs)"),
    profile_top: int = typer.Option(15, "--profile-top", help="how many of the slowest layers --profile lists"),
    seed: int = typer.Option(1, "--seed", help="seed of the random inputs"),
    val_range: List[str] = typer.Option([], "--val-range", help="value ranges: x:[-1,1] or [0,5] for all inputs"),
    as_json: bool = typer.Option(False, "--json", help="print the measurements as JSON on stdout"),
    builder_options: Any = None,
    runtime_options: Any = None,
) -> int:
    from polykit.backends.loaders import refuse_build_options
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.tools.cli import args as cli_args
    from polykit.tools.bench.benchmark import BenchOptions, bench_model
    from polykit.tools.cli.run import resolve_target
    from polykit.tools.data.results_io import load_feeds
    import numpy as np
    from polykit.errors import UsageError

    from polykit.backends.polykit_runner import check_allocation_strategy

    check_allocation_strategy((runtime_options or {}).get("allocation_strategy"), "--allocation-strategy")
    defaults = BuilderConfig()
    refuse_build_options(model, {"--load-tactics": load_tactics,
                                 "--save-tactics": save_tactics, "--save-engine": save_engine,
                                 "--channels-last/--no-channels-last": channels_last is not None,
                                 **{f"--{k.replace('_', '-')}": v != getattr(defaults, k, v)
                                    for k, v in builder_options.items() if k != "device"}})  # it picks the GPU too
    config = BuilderConfig(target=resolve_target(target, ["trt"], model), channels_last=channels_last,
                           input_shapes=cli_args.parse_input_shapes(input_shapes), tactic_replay=load_tactics,
                           save_tactics=save_tactics, **builder_options)
    feeds = None
    if load_inputs:
        loaded = load_feeds(load_inputs)
        if not loaded:
            raise UsageError(f"--load-inputs {load_inputs} holds no inputs", where=load_inputs,
                             hint="save some with `polykit run MODEL --save-inputs FILE`")
        feeds = loaded[0]
    options = BenchOptions(warm_up_ms=warm_up, iterations=iterations, duration_s=duration,
                           data_transfers=data_transfers, cuda_graph=cuda_graph, profile_runs=iterations if profile else 0,
                           seed=seed, val_ranges=cli_args.parse_val_ranges(val_range), in_place=in_place,
                           weight_streaming_budget=(runtime_options or {}).get("weight_streaming_budget"),
                           weight_streaming_percent=(runtime_options or {}).get("weight_streaming_percent"),
                           input_shapes={**cli_args.opt_shapes(config.profiles), **config.input_shapes,
                                         **{n: tuple(np.shape(v)) for n, v in (feeds or {}).items()}})
    if config.ranks > 1:
        if options.weight_streaming_budget is not None or options.weight_streaming_percent is not None:
            raise UsageError("--ranks benchmarks one plan per rank: --weight-streaming-budget is not offered with it",
                             hint="drop --weight-streaming-budget, or bench one plan without --ranks")
        from polykit.tools.bench.ranks import bench_ranks, render_ranks_bench

        ranked = bench_ranks(model, config, options)
        if as_json:
            typer.echo(json.dumps({"model": model, **ranked}, indent=2))
        else:
            render_ranks_bench(model, ranked)
        return 0
    result = bench_model(model, config, options, save_engine=save_engine, feeds=feeds)
    if as_json:
        typer.echo(json.dumps({"model": model, **result.to_json()}, indent=2))
    else:
        render(model, result, profile_top)
    return 0


def render(model: str, result: Any, profile_top: int = 15) -> None:
    """The result as text and a rich table of latency and compute percentiles."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(highlight=False)
    built = f"built in {result.build_s:.2f} s, " if result.build_s is not None else ""
    console.print(f"[bold]bench[/] {escape(model)}: target {result.target}, {built}loaded in {result.load_s:.2f} s; "
                  f"batch {result.batch}")
    modes = [f"{name} {'on' if value else 'off'}" for name, value in
             (("data transfers", result.data_transfers), ("CUDA graph", result.cuda_graph)) if value is not None]
    console.print(f"warm-up {result.warm_up_runs} run(s); timed {result.iterations} run(s) in {result.wall_s:.3f} s"
                  + (f"; {', '.join(modes)}" if modes else ""))
    if result.nvtx is not None:
        console.print(f"NVTX ranges: {escape(result.nvtx)}")
    if result.weight_streaming:
        budget, streamable = result.weight_streaming
        console.print(f"weight streaming: {budget} of {streamable} streamable weight bytes resident")
    console.print(f"throughput: {result.throughput:.2f} inferences/s, {result.samples_per_s:.2f} samples/s")
    table = Table(show_edge=False, box=None)
    table.add_column("ms")
    for col in ("min", "mean", "median", "p90", "p95", "p99", "max"):
        table.add_column(col, justify="right")
    if result.target == "cuda":
        rows = [("latency (end to end, host clock)" if result.data_transfers else "latency (host clock)", result.latency),
                ("GPU compute (CUDA events)", result.compute)]
    else:  # no device, no copies: the latency is the compute time
        rows = [(f"latency = compute (perf_counter, {result.target})", result.latency)]
    for label, stats in rows:
        table.add_row(label, *(f"{getattr(stats, c):.3f}" for c in ("min", "mean", "median", "p90", "p95", "p99", "max")))
    console.print(table)
    if result.profile is not None:
        from polykit.tools.report.profile import render as render_profile

        render_profile(console, "per-layer profile", result.profile, top=profile_top)


def register(app: typer.Typer) -> None:
    app.command("bench", help="Time polykit's engine on a model or plan: latency percentiles, throughput, "
                              "compute vs end-to-end, per-layer profile (trtexec's role).")(with_builder_options(with_runtime_options(bench)))

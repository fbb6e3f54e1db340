"""`polykit debug ...`: tools that find what makes a build wrong. `debug tactics` is a thin layer
over polykit.tools.debug_tactics (whose docstring defines the good and bad assignments, the
trials and the check): parse the options, call debug_tactics, print the culprits."""

from __future__ import annotations

import json
from typing import Any, List, Optional

import typer

from polykit.tools.cli_args import channels_last_option, with_builder_options, with_compare_options


def tactics(
    model: str = typer.Argument(..., metavar="MODEL", help="the ONNX model"),
    target: Optional[str] = typer.Option(None, "--target", help="cuda|cpu (default: cuda if usable)"),
    channels_last: Optional[bool] = channels_last_option(),
    input_shapes: List[str] = typer.Option([], "--input-shapes", help="shapes for dynamic inputs: x:[1,3,224,224]"),
    good_tactics: Optional[str] = typer.Option(None, "--good-tactics", metavar="FILE",
                                               help="a replay of a good build (default: each layer's conservative tactic)"),
    bad_tactics: Optional[str] = typer.Option(None, "--bad-tactics", metavar="FILE",
                                              help="a replay of the bad build (default: the build the builder options make)"),
    check: Optional[str] = typer.Option(None, "--check", metavar="CMD",
                                        help="judge each trial by CMD's exit code (0: good); {tactics} becomes the path "
                                             "of a replay file of the trial's tactics"),
    providers: List[str] = typer.Option([], "--providers", help="onnxruntime providers of the reference, e.g. cpu cuda"),
    load_inputs: Optional[str] = typer.Option(None, "--load-inputs", help="the feeds (.npz or .json)"),
    load_outputs: Optional[str] = typer.Option(None, "--load-outputs", help="reference outputs instead of onnxruntime's"),
    seed: int = typer.Option(1, "--seed", help="seed of the random data loader"),
    val_range: List[str] = typer.Option([], "--val-range", help="value ranges: x:[-1,1] or [0,5] for all inputs"),
    iterations: int = typer.Option(1, "--iterations", help="how many feed dicts each trial runs"),
    validate: bool = typer.Option(False, "--validate", help="a NaN or Inf in an output fails a trial"),
    artifacts: Optional[str] = typer.Option(None, "--artifacts", metavar="DIR",
                                            help="write good.json, bad.json, fixed.json (replays) and culprits.json here"),
    as_json: bool = typer.Option(False, "--json", help="print the culprits and the build count as JSON on stdout"),
    builder_options: Any = None,
    compare_settings: Any = None,
) -> int:
    from polykit.compiler.config import BuilderConfig
    from polykit.tools import cli_args
    from polykit.tools.accuracy import AccuracySettings
    from polykit.tools.data_loader import DataLoaderOptions
    from polykit.tools.debug_tactics import DebugOptions, debug_tactics
    from polykit.tools.run_cmd import resolve_target

    shapes = cli_args.parse_input_shapes(input_shapes)
    accuracy = AccuracySettings(**compare_settings, validate=validate, data_options=DataLoaderOptions(
        seed=seed, iterations=iterations, val_ranges=cli_args.parse_val_ranges(val_range), input_shapes=shapes))
    options = DebugOptions(good_tactics=good_tactics, bad_tactics=bad_tactics, check=check, accuracy=accuracy,
                           load_inputs=load_inputs, load_outputs=load_outputs, providers=tuple(providers),
                           artifacts=artifacts)
    config = BuilderConfig(target=resolve_target(target, ["trt"], model), channels_last=channels_last,
                           input_shapes=shapes, **builder_options)
    report = debug_tactics(model, config, options)
    if as_json:
        typer.echo(json.dumps(report.to_json(), indent=2))
    else:
        render(report, artifacts)
    return 0


def render(report: Any, artifacts: Optional[str]) -> None:
    """The bad build's verdict, then the culprits as a table (or that there are none)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(highlight=False)
    result = report.result
    bad = result.bad
    console.print(f"[bold]debug tactics[/]: {len(result.suspects)} layer(s) have other tactics in the bad build than in "
                  f"the good one ({escape(report.good_source)})")
    console.print(f"bad build: {'passes' if bad.passed else 'FAILS'}{_numbers(bad)}"
                  + (f" ({escape(bad.detail)})" if bad.detail else ""))
    if not result.culprits:
        console.print(f"no culprits: the bad build passes the check ({report.builds} build(s))")
    else:
        console.print(f"{len(result.culprits)} culprit(s) found in {report.builds} builds; with them on their good "
                      "tactics the build passes. The error each introduces alone:")
        grouped = any(c.group for c in result.culprits)
        table = Table(show_edge=False, box=None)
        table.add_column("layer", no_wrap=True)
        for column in ("tactic", "good tactic", "max abs", "max rel") + (("fails only with",) if grouped else ()):
            table.add_column(column, overflow="fold")
        for c in result.culprits:
            table.add_row(escape(c.layer), escape(c.tactic), escape(c.good_tactic),
                          *(f"{v:.3g}" if v is not None else "-" for v in (c.alone.max_abs, c.alone.max_rel)),
                          *((escape(", ".join(c.group)) or "-",) if grouped else ()))
        console.print(table)
    if artifacts:
        console.print(f"wrote good.json, bad.json, fixed.json and culprits.json to {escape(artifacts)}")


def _numbers(verdict: Any) -> str:
    return f": max abs {verdict.max_abs:.3g}, max rel {verdict.max_rel:.3g}" if verdict.max_abs is not None else ""


def register(app: typer.Typer) -> None:
    debug = typer.Typer(help="Find what makes a build wrong.", no_args_is_help=True)
    debug.command("tactics", help="Find the layers whose tactics make a build wrong: bisect between a good and a bad "
                                  "tactic assignment and name each culprit with the error it introduces.")(
        with_builder_options(with_compare_options(tactics)))
    app.add_typer(debug, name="debug")

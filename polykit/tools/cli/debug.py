"""`polykit debug ...`: tools that find what makes a build wrong, each a thin layer over its
Python API (whose docstring defines the search and the check): `debug tactics`
(polykit.tools.debug.tactics), `debug reduce` (polykit.tools.debug.reduce), `debug build`
(polykit.tools.debug.build), `debug precision` (polykit.tools.debug.precision). They share the
options of the built-in check (CHECK_OPTIONS), the builder options and the comparison options;
reduce and build also Polygraphy's iteration options (ITERATION_OPTIONS); the renderers live in
polykit.tools.debug.render.

`--check` takes the rest of the command line, as in Polygraphy (`--check polykit run
polygraphy_debug.onnx --trt --onnxrt`), or one quoted word holding a space, polykit's form
(`--check 'polykit run {model} --trt --onnxrt'`), after which other options may follow:
`fold_check_command` turns the first form into the second before the app rewrites argv.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, List, Mapping, Optional, Sequence

import typer

from polykit.tools.cli.args import (LOAD_TACTICS, SAVE_TACTICS, channels_last_option, expand_multi_values,
                                   with_builder_options, with_compare_options, with_options)

CHECK_FLAGS = ("--check", "--check-inference")
_WORD = re.compile(r"^(?!-)(?!.*\.onnx$).+$")
_CODE = re.compile(r"^-?\d+$")
#: debug options that take several values, as Polygraphy's (nargs="+")
DEBUG_MULTI_VALUE_OPTIONS = {"--fail-regex": _WORD, "--fail-code": _CODE, "--fail-returncode": _CODE,
                             "--ignore-fail-code": _CODE, "--ignore-fail-returncode": _CODE, "--artifacts": _WORD}


def fold_check_command(argv: Sequence[str]) -> list[str]:
    """`polykit [global flags] debug TOOL ... --check WORD...`: where WORD holds no space, the check
    command is every word after --check (Polygraphy's form), given to typer as one shell-quoted
    word so that nothing rewrites it (runner flags, -v); a WORD with a space is polykit's
    one-word form and stays as it is. Also lets the debug options above take several values."""
    argv = list(argv)
    command = next((i for i, word in enumerate(argv) if not word.startswith("-")), None)
    if command is None or argv[command] != "debug":
        return argv
    at = next((i for i, word in enumerate(argv) if word in CHECK_FLAGS), None)
    if at is None:
        return expand_multi_values(argv, DEBUG_MULTI_VALUE_OPTIONS)
    head = expand_multi_values(argv[:at], DEBUG_MULTI_VALUE_OPTIONS)
    rest = argv[at + 1:]
    if not rest or any(c.isspace() for c in rest[0]):
        return head + argv[at:at + 2] + expand_multi_values(rest[1:], DEBUG_MULTI_VALUE_OPTIONS)
    return head + ["--check", shlex.join(rest)]


@dataclass(frozen=True)
class CheckSetup:
    """The values of CHECK_OPTIONS: the target and the build's inputs, and the built-in check's
    feeds and reference."""

    target: Optional[str] = None
    channels_last: Optional[bool] = None
    input_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    providers: tuple[str, ...] = ()
    load_inputs: Optional[str] = None
    load_outputs: Optional[str] = None
    data_options: Any = None
    validate: bool = False

    def accuracy(self, compare_settings: Mapping[str, Any]) -> Any:
        """AccuracySettings of the built-in check with the comparison options' values."""
        from polykit.tools.compare.accuracy import AccuracySettings

        return AccuracySettings(**compare_settings, validate=self.validate, data_options=self.data_options)

    def config(self, model: str, builder_options: Mapping[str, Any], resolve: bool = True) -> Any:
        """The BuilderConfig of the build to debug (target: --target, else cuda when usable; with
        `resolve` False, a target not given stays None: the build picks it when it runs)."""
        from polykit.compiler.builder.config import BuilderConfig
        from polykit.tools.cli.run import resolve_target

        target = resolve_target(self.target, ["trt"], model) if resolve else self.target
        return BuilderConfig(target=target, channels_last=self.channels_last, input_shapes=self.input_shapes,
                             **builder_options)


def check_setup(target: Optional[str] = None, channels_last: Optional[bool] = None, input_shapes: List[str] = (),
                providers: List[str] = (), load_inputs: Optional[str] = None, load_outputs: Optional[str] = None,
                seed: int = 1, val_range: List[str] = (), iterations: int = 1, validate: bool = False) -> CheckSetup:
    from polykit.tools.cli import args as cli_args
    from polykit.tools.data.loaders import DataLoaderOptions

    shapes = cli_args.parse_input_shapes(input_shapes)
    data = DataLoaderOptions(seed=seed, iterations=iterations, val_ranges=cli_args.parse_val_ranges(val_range),
                             input_shapes=shapes)
    return CheckSetup(target, channels_last, shapes, tuple(providers), load_inputs, load_outputs, data, validate)


#: (parameter, annotation, typer option) of the options every debug command shares
CHECK_OPTIONS: list[tuple[str, Any, Any]] = [
    ("target", Optional[str], typer.Option(None, "--target", help="cuda|cpu (default: cuda if usable)")),
    ("channels_last", Optional[bool], channels_last_option()),
    ("input_shapes", List[str], typer.Option([], "--input-shapes", help="shapes for dynamic inputs: x:[1,3,224,224]")),
    ("providers", List[str], typer.Option([], "--providers", help="onnxruntime providers of the reference, e.g. cpu")),
    ("load_inputs", Optional[str], typer.Option(None, "--load-inputs", help="the feeds (.npz or .json)")),
    ("load_outputs", Optional[str], typer.Option(None, "--load-outputs",
                                                 help="reference outputs instead of onnxruntime's")),
    ("seed", int, typer.Option(1, "--seed", help="seed of the random data loader")),
    ("val_range", List[str], typer.Option([], "--val-range", help="value ranges: x:[-1,1] or [0,5] for all inputs")),
    ("iterations", int, typer.Option(1, "--iterations", help="how many feed dicts each check runs")),
    ("validate", bool, typer.Option(False, "--validate", help="a NaN or Inf in an output fails a check")),
]


def iteration_setup(fail_codes: List[int] = (), ignore_fail_codes: List[int] = (), fail_regex: List[str] = (),
                    show_output: bool = False, hide_fail_output: bool = False, artifacts: List[str] = (),
                    artifacts_dir: str = "polygraphy_artifacts", iter_artifact: Optional[str] = None,
                    remove_intermediate: bool = True) -> Any:
    """(CheckRules, IterationFiles) of ITERATION_OPTIONS."""
    from polykit.tools.debug.iteration import CheckRules, IterationFiles

    return (CheckRules(tuple(fail_codes), tuple(ignore_fail_codes), tuple(fail_regex), show_output, hide_fail_output),
            IterationFiles(iter_artifact, remove_intermediate, tuple(artifacts), artifacts_dir))


#: (parameter, annotation, typer option) of Polygraphy's iterative-debugging options (reduce, build)
ITERATION_OPTIONS: list[tuple[str, Any, Any]] = [
    ("fail_codes", List[int], typer.Option([], "--fail-code", "--fail-returncode", metavar="CODE",
                                           help="exit codes of --check that count as failures (any other passes)")),
    ("ignore_fail_codes", List[int], typer.Option([], "--ignore-fail-code", "--ignore-fail-returncode", metavar="CODE",
                                                  help="exit codes of --check that count as passes")),
    ("fail_regex", List[str], typer.Option([], "--fail-regex", metavar="REGEX",
                                           help="a failure is a match in --check's output (stdout and stderr), "
                                                "whatever its exit code (with --fail-code: those codes and a match)")),
    ("show_output", bool, typer.Option(False, "--show-output", help="log --check's output for every iteration")),
    ("hide_fail_output", bool, typer.Option(False, "--hide-fail-output",
                                            help="do not log --check's output for failing iterations (shown with -v)")),
    ("artifacts", List[str], typer.Option([], "--artifacts", metavar="FILE",
                                          help="files to move after each check into good/ or bad/ under --artifacts-dir, "
                                               "renamed with the date, time and iteration")),
    ("artifacts_dir", str, typer.Option("polygraphy_artifacts", "--artifacts-dir", "--art-dir", metavar="DIR",
                                        help="where --artifacts are sorted")),
    ("iter_artifact", Optional[str], typer.Option(None, "--iter-artifact", "--intermediate-artifact", metavar="FILE",
                                                  help="where each iteration writes the file a --check without "
                                                       "{model} reads (reduce: polygraphy_debug.onnx, build: "
                                                       "polygraphy_debug.engine)")),
    ("remove_intermediate", bool, typer.Option(True, "--remove-intermediate/--no-remove-intermediate",
                                               help="remove the --iter-artifact file after each iteration")),
]


def with_iteration_options(command: Any) -> Any:
    """ITERATION_OPTIONS, received as `iteration`: (CheckRules, IterationFiles)."""
    return with_options(command, ITERATION_OPTIONS, "iteration", iteration_setup)


def with_debug_options(command: Any) -> Any:
    """The builder, comparison and check options (`builder_options`, `compare_settings`, `setup`)."""
    return with_builder_options(with_compare_options(with_options(command, CHECK_OPTIONS, "setup", check_setup)))


JSON = typer.Option(False, "--json", help="print the result as JSON on stdout")
CHECK_HELP = ("the rest of the command line (Polygraphy's form: it reads {artifact}), or one quoted command "
              "holding {{model}}, which becomes the path of {what}; exit code 0 passes (see --fail-code, "
              "--fail-regex)")
REPORT = typer.Option(None, "--report", metavar="FILE.html",
                      help="also write a self-contained HTML report (every search step, the result, charts)")
GEN_SCRIPT = typer.Option(None, "--gen-script", metavar="FILE",
                          help="write a Python script that does what this command does, and exit")


def _writable(*paths: tuple[str, Optional[str]]) -> None:
    """Refuse (option, path) pairs whose folder does not exist before any work is done."""
    from polykit.files import require_output_folder

    for option, path in paths:
        if path:
            require_output_folder(path, option)


def _gen_script(script: Any, path: str) -> int:
    from polykit.tools.cli.gen_script import write_script

    write_script(path, script)
    typer.echo(f"wrote {path}: run it with python to do what this command does")
    return 0


def _report(doc: Mapping[str, Any], path: Optional[str], tool: str, model: str, as_json: bool) -> None:
    """Write the HTML report when asked; print the JSON document with --json."""
    if path:
        from polykit.tools.debug.pages import save_debug_report

        save_debug_report(path, doc, f"polykit debug {tool} {Path(model).name}")
    if as_json:
        typer.echo(json.dumps(doc, indent=2))


def tactics(
    model: str = typer.Argument(..., metavar="MODEL", help="the ONNX model"),
    good_tactics: Optional[str] = typer.Option(None, "--good-tactics", metavar="FILE",
                                               help="a replay of a good build (default: each layer's conservative tactic)"),
    bad_tactics: Optional[str] = typer.Option(None, "--bad-tactics", metavar="FILE",
                                              help="a replay of the bad build (default: the build the builder options make)"),
    check: Optional[str] = typer.Option(None, "--check", metavar="CMD",
                                        help="judge each trial by CMD's exit code (0: good); {tactics} becomes the path "
                                             "of a replay file of the trial's tactics"),
    artifacts: Optional[str] = typer.Option(None, "--artifacts", metavar="DIR",
                                            help="write good.json, bad.json, fixed.json (replays) and culprits.json here"),
    as_json: bool = JSON,
    report_html: Optional[str] = REPORT,
    builder_options: Any = None,
    compare_settings: Any = None,
    setup: Any = None,
) -> int:
    from polykit.tools.debug.render import render_tactics
    from polykit.tools.debug.tactics import DebugOptions, debug_tactics

    _writable(("--report", report_html))
    options = DebugOptions(good_tactics=good_tactics, bad_tactics=bad_tactics, check=check,
                           accuracy=setup.accuracy(compare_settings), load_inputs=setup.load_inputs,
                           load_outputs=setup.load_outputs, providers=setup.providers, artifacts=artifacts)
    report = debug_tactics(model, setup.config(model, builder_options), options)
    _report(report.to_json(), report_html, "tactics", model, as_json)
    if not as_json:
        render_tactics(report, artifacts)
    return 0


def reduce(
    model: str = typer.Argument(..., metavar="MODEL", help="the ONNX model that fails"),
    output: str = typer.Option(..., "--output", "-o", help="where to write the minimal failing subgraph"),
    min_good: Optional[str] = typer.Option(None, "--min-good", "--minimal-good", metavar="FILE",
                                           help="also write the passing subgraph nearest to the reduced one"),
    check: Optional[str] = typer.Option(None, *CHECK_FLAGS, metavar="CMD...",
                                        help="judge each subgraph by a command: " + CHECK_HELP.format(
                                            artifact="polygraphy_debug.onnx", what="the subgraph") +
                                        "; {inputs} becomes that of an .npz of its feeds"),
    mode: str = typer.Option("both", "--mode", help="bisect (binary search of the failing span, Polygraphy's "
                                                    "default), linear (drop one node at a time) or both (polykit's "
                                                    "default: bisect, then linear)"),
    as_json: bool = JSON,
    report_html: Optional[str] = REPORT,
    gen_script: Optional[str] = GEN_SCRIPT,
    builder_options: Any = None,
    compare_settings: Any = None,
    setup: Any = None,
    iteration: Any = None,
) -> int:
    from polykit.tools.debug.reduce import ReduceOptions, debug_reduce
    from polykit.tools.debug.render import render_reduce
    from polykit.tools.cli.gen_script import DebugScript

    _writable(("--output", output), ("--min-good", min_good), ("--report", report_html), ("--gen-script", gen_script))
    rules, files = iteration
    options = ReduceOptions(check=check, mode=mode, rules=rules, files=files, accuracy=setup.accuracy(compare_settings),
                            load_inputs=setup.load_inputs, load_outputs=setup.load_outputs, providers=setup.providers)
    config = setup.config(model, builder_options, resolve=not gen_script)
    if gen_script:
        return _gen_script(DebugScript("reduce", model, config, options, output, min_good, as_json, report_html),
                           gen_script)
    report = debug_reduce(model, config, options)
    doc = report.save(output, min_good)
    _report(doc, report_html, "reduce", model, as_json)
    if not as_json:
        render_reduce(report, output, doc["min_good"] and doc["min_good"]["path"], bool(min_good))
    return 0


def build(
    model: str = typer.Argument(..., metavar="MODEL", help="the ONNX model"),
    until: str = typer.Option(..., "--until", help="when to stop: a number of builds, good (the first passing build) "
                                                   "or bad (the first failing one)"),
    check: Optional[str] = typer.Option(None, *CHECK_FLAGS, metavar="CMD...",
                                        help="judge each build by a command: " + CHECK_HELP.format(
                                            artifact="polygraphy_debug.engine", what="the plan") +
                                        " (default: compare the plan's outputs with onnxruntime's)"),
    save_tactics: Optional[str] = SAVE_TACTICS,
    load_tactics: Optional[str] = LOAD_TACTICS,
    as_json: bool = JSON,
    builder_options: Any = None,
    compare_settings: Any = None,
    setup: Any = None,
    iteration: Any = None,
) -> int:
    from polykit.tools.debug.build import BuildOptions, debug_build
    from polykit.tools.debug.iteration import parse_until
    from polykit.tools.debug.render import render_build

    rules, files = iteration
    options = BuildOptions(until=parse_until(until), check=check, rules=rules, files=files,
                           accuracy=setup.accuracy(compare_settings), load_inputs=setup.load_inputs,
                           load_outputs=setup.load_outputs, providers=setup.providers)
    config = replace(setup.config(model, builder_options), save_tactics=save_tactics, tactic_replay=load_tactics)
    report = debug_build(model, config, options)
    if as_json:
        typer.echo(json.dumps(report.to_json(), indent=2))
    else:
        render_build(report)
    return 0


def precision(
    model: str = typer.Argument(..., metavar="MODEL", help="the ONNX model"),
    output: Optional[str] = typer.Option(None, "--output", "-o", metavar="FILE",
                                         help="write the --layer-precisions value found to FILE"),
    rank: str = typer.Option("layerwise", "--rank", help="how candidate nodes are ranked: layerwise (one build with "
                                                         "every tensor marked) or isolated (one build per node)"),
    timing_iterations: int = typer.Option(10, "--timing-iterations", min=0,
                                          help="timed runs of each latency measurement (0: no timing)"),
    as_json: bool = JSON,
    report_html: Optional[str] = REPORT,
    gen_script: Optional[str] = GEN_SCRIPT,
    builder_options: Any = None,
    compare_settings: Any = None,
    setup: Any = None,
) -> int:
    from polykit.tools.debug.precision import PrecisionOptions, debug_precision
    from polykit.tools.debug.render import render_precision
    from polykit.tools.cli.gen_script import DebugScript

    _writable(("--output", output), ("--report", report_html), ("--gen-script", gen_script))
    options = PrecisionOptions(accuracy=setup.accuracy(compare_settings), load_inputs=setup.load_inputs,
                               load_outputs=setup.load_outputs, providers=setup.providers, rank=rank,
                               timing_iterations=timing_iterations)
    config = setup.config(model, builder_options, resolve=not gen_script)
    if gen_script:
        return _gen_script(DebugScript("precision", model, config, options, output, None, as_json, report_html),
                           gen_script)
    report = debug_precision(model, config, options)
    if output:
        report.save(output)
    _report(report.to_json(), report_html, "precision", model, as_json)
    if not as_json:
        render_precision(report, model, output)
    return 0


def register(app: typer.Typer) -> None:
    debug = typer.Typer(help="Find what makes a build wrong.", no_args_is_help=True)
    debug.command("tactics", help="Find the layers whose tactics make a build wrong: bisect between a good and a bad "
                                  "tactic assignment and name each culprit with the error it introduces.")(
        with_debug_options(tactics))
    debug.command("reduce", help="Shrink a failing model to a minimal failing subgraph: bisect over its nodes, then "
                                 "drop them one by one; subgraph inputs are fed the values they have in the model.")(
        with_iteration_options(with_debug_options(reduce)))
    debug.command("build", help="Build the model again and again (--until), judge each build (--check, else against "
                                "onnxruntime) and sort --artifacts such as --save-tactics replays into good/ and bad/ "
                                "for `polykit inspect diff-tactics`.")(
        with_iteration_options(with_debug_options(build)))
    debug.command("precision", help="Find a small set of ONNX nodes to keep in fp32 so that an --fp16/--bf16 or "
                                    "--int8/--fp8 build meets the tolerances; print it as a --layer-precisions value.")(
        with_debug_options(precision))
    app.add_typer(debug, name="debug")

"""`polykit run|debug reduce|debug precision ... --gen-script FILE`: the short Python script
that does what the command does, through the public API (Polygraphy's --gen-script, and the
proof that the CLI only assembles the API: CI runs generated scripts and compares their
results with the CLI's).

A debug script (DebugScript) calls the tool's function (debug_reduce, debug_precision) with
the command's BuilderConfig and options record, saves what the command saves, writes its
--report and prints its report (JSON or text); exit code 0, or 2 on a PolykitError.

The script builds the runners from loaders (polykit's engine: PlanFromOnnx with the
command's BuilderConfig; onnxruntime: SessionFromOnnx; a plugin's runner: make_runners with
the command's RunnerRequest), the AccuracySettings (compare options, data loader options),
loads and saves data with results_io, runs run_comparison, prints the report and exits with
the command's exit code (0 passed, 1 accuracy mismatch, 2 a PolykitError). Paths are written
as given: run the script from the folder the command ran in.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from polykit.backends.base import RunnerRequest
from polykit.errors import DataFileError, UsageError
from polykit.tools.compare.accuracy import AccuracySettings


@dataclass(frozen=True)
class RunScript:
    """What `polykit run` was asked to do, as the API takes it."""

    runners: tuple[str, ...]
    request: RunnerRequest
    settings: AccuracySettings
    load_inputs: str | None = None
    load_outputs: tuple[str, ...] = ()
    save_inputs: str | None = None
    save_outputs: str | None = None
    save_format: str | None = None
    as_json: bool = False
    profile_top: int = 15


@dataclass(frozen=True)
class DebugScript:
    """What `polykit debug reduce|precision` was asked to do, as the API takes it: the tool
    (a DEBUG_TOOLS name), the model, the BuilderConfig, the options record (ReduceOptions,
    PrecisionOptions), `output` (-o), `min_good` (reduce's --min-good), --json and --report."""

    tool: str
    model: str
    config: Any
    options: Any
    output: str | None = None
    min_good: str | None = None
    as_json: bool = False
    report: str | None = None


class _Imports:
    """`from module import name` lines a script needs, in a stable order."""

    def __init__(self) -> None:
        self.names: set[tuple[str, str]] = set()

    def use(self, module: str, name: str, alias: str = "") -> str:
        self.names.add((module, f"{name} as {alias}" if alias else name))
        return alias or name

    def lines(self) -> list[str]:
        modules: dict[str, list[str]] = {}
        for module, name in sorted(self.names):
            modules.setdefault(module, []).append(name)
        return [f"from {m} import {', '.join(names)}" for m, names in sorted(modules.items())]


def _literal(value: Any, imports: _Imports, where: str) -> str:
    """Python source for a value of a record: literals, containers of them, records (their
    non-default fields, as a constructor call)."""
    if value is None or isinstance(value, (bool, int, str)):
        return repr(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else f"float({str(value)!r})"
    if isinstance(value, os.PathLike):
        return repr(os.fspath(value))
    if isinstance(value, (list, tuple)):
        items = [_literal(v, imports, where) for v in value]
        return f"({items[0]},)" if isinstance(value, tuple) and len(items) == 1 else \
            ("(" if isinstance(value, tuple) else "[") + ", ".join(items) + (")" if isinstance(value, tuple) else "]")
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_literal(k, imports, where)}: {_literal(v, imports, where)}" for k, v in value.items()) + "}"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _record(value, imports, where)
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":  # shape-tensor input values
        return f"{imports.use('numpy', 'array')}({value.tolist()!r}, dtype={value.dtype.name!r})"
    raise UsageError(f"--gen-script cannot write {where} ({type(value).__name__} value {value!r}) as Python source",
                     hint="run the command itself, or build that value in the script by hand")


def _record(obj: Any, imports: _Imports, where: str) -> str:
    """`Type(field=value, ...)` for the fields of a frozen record that differ from its defaults."""
    cls = type(obj)
    args = [f"{f.name}={_literal(getattr(obj, f.name), imports, f'{where}.{f.name}')}"
            for f in dataclasses.fields(obj) if f.init and not _is_default(f, getattr(obj, f.name))]
    return f"{imports.use(cls.__module__, cls.__name__)}({', '.join(args)})"


def _is_default(f: dataclasses.Field, value: Any) -> bool:
    if f.default is not dataclasses.MISSING:
        return value == f.default
    if f.default_factory is not dataclasses.MISSING:
        return value == f.default_factory()
    return False


def _polykit_runner(request: RunnerRequest, imports: _Imports) -> str:
    """make_polykit_runner's loaders (polykit.backends.builtin)."""
    from polykit.backends.builtin import builder_config, runner_options
    from polykit.backends.loaders import model_type
    from polykit.backends.polykit_runner import PolykitRunner

    runner = imports.use("polykit.backends.polykit_runner", "PolykitRunner")
    defaults = inspect.signature(PolykitRunner).parameters
    options = "".join(f", {k}={v!r}" for k, v in runner_options(request).items()  # those not at their defaults
                      if k != "name" and v != defaults[k].default)
    if model_type(request.model) == "plan":
        engine = f"{imports.use('polykit.backends.loaders', 'EngineFromPath')}({request.model!r}, {request.target!r})"
        return f"{runner}({engine}, name='trt'{options})"
    plan = f"{imports.use('polykit.backends.loaders', 'PlanFromOnnx')}({request.model!r}, " \
           f"{_record(builder_config(request), imports, 'the builder config')})"
    if request.save_engine:
        plan = f"{imports.use('polykit.backends.loaders', 'SaveEngine')}({plan}, {request.save_engine!r})"
    return f"{runner}({imports.use('polykit.backends.loaders', 'EngineFromPlan')}({plan}), name='trt'{options})"


def _onnxrt_runner(request: RunnerRequest, imports: _Imports) -> str:
    """make_onnxrt_runner's loaders (polykit.backends.builtin)."""
    model = repr(request.model)
    if request.mark_all or request.mark_outputs:
        marks = imports.use("polykit.backends.loaders", "MARK_ALL") if request.mark_all else repr(list(request.mark_outputs))
        model = f"{imports.use('polykit.backends.loaders', 'ModifyOutputs')}({model}, outputs={marks})"
    providers = f", providers={_literal(tuple(request.providers), imports, 'providers')}" if request.providers else ""
    session = f"{imports.use('polykit.backends.onnxrt', 'SessionFromOnnx')}({model}{providers})"
    return f"{imports.use('polykit.backends.onnxrt', 'OnnxrtRunner')}({session}, name='onnxrt')"


#: runner name -> the source of that runner built from loaders; other runners (plugins') are
#: written as make_runners([name], RunnerRequest(...))
RUNNER_SOURCES: dict[str, Callable[[RunnerRequest, _Imports], str]] = {
    "trt": _polykit_runner,
    "onnxrt": _onnxrt_runner,
}


def _runner_source(name: str, request: RunnerRequest, imports: _Imports) -> str:
    write = RUNNER_SOURCES.get(name)
    if write is not None:
        return write(request, imports)
    make = imports.use("polykit.tools.compare.accuracy", "make_runners")
    return f"{make}([{name!r}], {_record(request, imports, 'the runner request')})[0]"


def render_script(script: RunScript) -> str:
    """The Python source of `script`."""
    imports = _Imports()
    imports.use("polykit.errors", "PolykitError")
    run = imports.use("polykit.tools.compare.accuracy", "run_comparison")
    body = ["runners = ["] + [f"    {_runner_source(n, script.request, imports)}," for n in script.runners] + ["]"]
    body.append(f"settings = {_record(script.settings, imports, 'the comparison settings')}")
    data = ""
    if script.load_inputs:
        body.append(f"feeds = {imports.use('polykit.tools.data', 'results_io')}.load_feeds({script.load_inputs!r})")
        data += ", feeds=feeds"
    if script.load_outputs:
        body.append(f"reference = {imports.use('polykit.tools.data', 'results_io')}.load_reference_outputs("
                    f"{list(script.load_outputs)!r})")
        data += ", reference_outputs=reference"
    layerwise = bool(script.request.mark_all or script.request.mark_outputs)
    if layerwise:  # marked tensors a runner fused away are not failures; name the first divergence
        order = imports.use("polykit.tools.compare.divergence", "GraphOrder")
        body.append(f"order = {order}.from_onnx({script.request.model!r})")
        data += ", optional=order.intermediates"
    body.append(f"results, report = {run}(runners, settings{data})")
    if layerwise:
        body.append(f"layerwise = {imports.use('polykit.tools.compare.divergence', 'analyze')}(report, order)")
    fmt = f", format={script.save_format!r}" if script.save_format is not None else ""
    if script.save_inputs:
        body.append(f"{imports.use('polykit.tools.data', 'results_io')}.save_feeds({script.save_inputs!r}, results.feeds{fmt})")
    if script.save_outputs:
        live = "{k: v for k, v in results.outputs.items() if k not in reference}" if script.load_outputs else "results.outputs"
        times = ", times=results.times" if fmt else ""
        body.append(f"{imports.use('polykit.tools.data', 'results_io')}.save_outputs({script.save_outputs!r}, {live}{fmt}{times})")
    body += _report_lines(script, imports)
    body.append("return 0 if report.passed else 1")
    return _module_source("polykit run --gen-script", imports, body, script.as_json)


def _report_lines(script: RunScript, imports: _Imports) -> list[str]:
    """Print the report as the command does: JSON, or rich tables; with per-layer profiles."""
    layerwise = ", layerwise" if script.request.mark_all or script.request.mark_outputs else ""
    profiled = "[runner for runner in runners if getattr(runner, 'layer_times', None)]"
    if script.request.profile:
        summarize = imports.use("polykit.tools.report.profile", "summarize")
    if script.as_json:
        lines = [f"doc = {imports.use('polykit.tools.report.comparison', 'to_json')}(report, results{layerwise})"]
        if script.request.profile:
            lines.append(f"doc['profile'] = {{r.name: {summarize}(r.layer_times, r.layers).to_json() for r in {profiled}}}")
        return lines + ["print(json.dumps(doc, indent=2))"]
    lines = [f"console = {imports.use('rich.console', 'Console')}(highlight=False)",
             f"{imports.use('polykit.tools.report.comparison', 'render')}(console, report, results{layerwise})"]
    if script.request.profile:
        render = imports.use("polykit.tools.report.profile", "render", alias="render_profile")
        lines += [f"for r in {profiled}:",
                  f"    {render}(console, f'{{r.name}} per-layer profile', {summarize}(r.layer_times, r.layers), "
                  f"top={script.profile_top})"]
    return lines


def _reduce_lines(script: DebugScript, imports: _Imports) -> list[str]:
    """debug reduce: save the reduced (and nearest passing) model, keep the JSON with their paths."""
    doc = f"doc = report.save({script.output!r}, {script.min_good!r})"
    render = (f"{imports.use('polykit.tools.debug.render', 'render_reduce')}(report, {script.output!r}, "
              f"doc['min_good'] and doc['min_good']['path'], {bool(script.min_good)!r})")
    return [doc, render]


def _precision_lines(script: DebugScript, imports: _Imports) -> list[str]:
    """debug precision: save the --layer-precisions value when -o was given."""
    saved = [f"report.save({script.output!r})"] if script.output else []
    render = f"{imports.use('polykit.tools.debug.render', 'render_precision')}(report, {script.model!r}, {script.output!r})"
    return [*saved, "doc = report.to_json()", render]


#: debug tool -> (its API function's module, the lines that save its results and keep `doc`, then render text)
DEBUG_TOOLS: dict[str, tuple[str, Callable[[DebugScript, _Imports], list[str]]]] = {
    "reduce": ("polykit.tools.debug.reduce", _reduce_lines),
    "precision": ("polykit.tools.debug.precision", _precision_lines),
}


def render_debug_script(script: DebugScript) -> str:
    """The Python source of a DebugScript."""
    module, tail = DEBUG_TOOLS[script.tool]
    imports = _Imports()
    imports.use("polykit.errors", "PolykitError")
    call = imports.use(module, f"debug_{script.tool}")
    body = [f"report = {call}({script.model!r}, {_record(script.config, imports, 'the builder config')}, "
            f"{_record(script.options, imports, 'the options')})"]
    *save, render = tail(script, imports)
    body += save
    if script.report:
        title = f"polykit debug {script.tool} {Path(script.model).name}"
        body.append(f"{imports.use('polykit.tools.debug.pages', 'save_debug_report')}({script.report!r}, doc, {title!r})")
    body += ["print(json.dumps(doc, indent=2))"] if script.as_json else [render]
    body.append("return 0")
    return _module_source(f"polykit debug {script.tool} --gen-script", imports, body, script.as_json)


def _module_source(command: str, imports: _Imports, body: list[str], uses_json: bool) -> str:
    """A script: its docstring, imports, main() of `body`, and the exit code on a PolykitError."""
    import polykit

    head = [f'"""Generated by `{command}` (polykit {polykit.__version__}): what that command does,',
            'through polykit\'s Python API. Run it from the folder the command ran in."""',
            "", *(["import json"] if uses_json else []), "import sys", ""]
    return "\n".join([*head, *imports.lines(), "", "", "def main() -> int:", *(f"    {line}" for line in body), "",
                      "", 'if __name__ == "__main__":', "    try:", "        sys.exit(main())",
                      "    except PolykitError as exc:", '        print(f"error: {exc}", file=sys.stderr)',
                      "        sys.exit(exc.exit_code)", ""])


def write_script(path: str | os.PathLike, script: RunScript | DebugScript) -> Path:
    """Write the script of `script` to `path` (made executable)."""
    path = Path(path)
    source = render_debug_script(script) if isinstance(script, DebugScript) else render_script(script)
    compile(source, str(path), "exec")  # a generator bug, not the user's: fail here, not when they run it
    try:
        path.write_text(source)
        path.chmod(0o755)
    except OSError as exc:
        raise DataFileError(f"cannot write the script: {exc.strerror or exc}", where=str(path),
                            hint="check that its folder exists and is writable") from None
    return path

"""The checks the debug tools share (`debug tactics`, `debug reduce`, `debug precision`).

The built-in check compares polykit's outputs with reference outputs computed once: from
onnxruntime in process, or from a file of saved outputs (`--load-outputs`), with the compare
function and tolerances of `polykit run` (`verdict`). `--check CMD` instead runs a command
whose exit code 0 means good (`run_check`; --fail-code, --fail-regex and the like change
that: polykit.tools.debug.iteration.CheckRules), with a placeholder such as {tactics} or {model}
replaced by the path of the trial's file. `debug reduce` and `debug build` also take a command
without a placeholder, Polygraphy's form: it reads the file each iteration writes at a fixed
path (`command_argv`).
"""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from polykit.errors import UsageError
from polykit.tools.compare.accuracy import AccuracySettings
from polykit.tools.debug.iteration import CheckRules, IterationFiles
from polykit.tools.debug.tactic_bisect import Verdict

log = logging.getLogger("polykit")


@dataclass(frozen=True)
class CheckOptions:
    """The check of `debug reduce` and `debug build`: `check`, a command judged by `rules`, with
    the iteration's files (`files`); else the built-in comparison steered by `accuracy` against
    onnxruntime with `providers` (or `load_outputs`) on `load_inputs` or the data loader's feeds."""

    check: str | None = None
    rules: CheckRules = field(default_factory=CheckRules)
    files: IterationFiles = field(default_factory=IterationFiles)
    accuracy: AccuracySettings = field(default_factory=AccuracySettings)
    load_inputs: str | os.PathLike | None = None
    load_outputs: str | os.PathLike | None = None
    providers: tuple[str, ...] = ()


def onnxrt_outputs(model: Any, feeds: list[dict[str, Any]], providers: Sequence[str] = ()) -> list[dict[str, Any]]:
    """onnxruntime's outputs of `model` (a path, ModelProto or loader) on each feed dict."""
    from polykit.backends.onnxrt import OnnxrtRunner, SessionFromOnnx
    from polykit.tools.compare.comparator import Comparator

    return Comparator.run([OnnxrtRunner(SessionFromOnnx(model, providers))], feeds=feeds).outputs["onnxrt"]


def saved_reference(path: str | os.PathLike, iterations: int) -> list[dict[str, Any]]:
    """The reference outputs of a --load-outputs file: its only runner's, or onnxrt's; one
    dict per iteration, as many as the feeds (`iterations`)."""
    from polykit.tools.data import results_io

    saved = results_io.load_outputs(path)
    name = next(iter(saved)) if len(saved) == 1 else "onnxrt" if "onnxrt" in saved else None
    if name is None:
        raise UsageError(f"the outputs file holds several runners' outputs ({', '.join(saved)}) and none named "
                         "onnxrt", where=str(path),
                         hint="save the reference alone: polykit run MODEL --onnxrt --save-outputs FILE")
    if len(saved[name]) != iterations:
        raise UsageError(f"the outputs file holds {len(saved[name])} iteration(s) of {name!r}, the feeds "
                         f"{iterations}", where=str(path),
                         hint="give the inputs they were made from (--load-inputs) or the same --iterations")
    return saved[name]


def verdict(feeds: list[dict[str, Any]], reference: list[dict[str, Any]], outputs: list[dict[str, Any]],
            compare: Any, validate: bool = False) -> Verdict:
    """`outputs` against `reference` (per iteration, by name) with `compare`: passed, the worst
    absolute and relative error, and what failed (the first three outputs)."""
    from polykit.tools.compare.comparator import Comparator, RunResults

    results = RunResults(feeds=feeds)
    results.add("reference", reference)
    results.add("trt", outputs)
    report = Comparator.compare_accuracy(results, compare, validate=validate)
    compared = [o for pair in report.pairs for o in pair.outputs]
    detail = "; ".join([f"{o.name}: {o.message}" for _, o in report.failures()[:3]] + list(report.problems))
    return Verdict(report.passed, max((o.max_abs for o in compared), default=0.0),
                   max((o.max_rel for o in compared), default=0.0), detail)


def error_json(verdict: Verdict) -> dict[str, Any] | None:
    """{"max_abs", "max_rel"} of a verdict (None when the check gave no numbers); inf/nan as strings."""
    if verdict.max_abs is None:
        return None
    return {key: value if value == value and abs(value) != float("inf") else str(value)
            for key, value in (("max_abs", verdict.max_abs), ("max_rel", verdict.max_rel))}


def check_argv(command: str, placeholder: str, example: str) -> list[str]:
    """The words of a --check command; UsageError unless one holds `placeholder`."""
    argv, has_placeholder = command_argv(command, placeholder)
    if not has_placeholder:
        raise UsageError(f"--check {command!r} has no {placeholder}, so it cannot see what to check",
                         hint=f"e.g. --check '{example}'")
    return argv


def command_argv(command: str, placeholder: str) -> tuple[list[str], bool]:
    """The words of a --check command and whether it holds `placeholder` (else it reads the
    iteration artifact at its fixed path, Polygraphy's form)."""
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise UsageError(f"--check {command!r} is not a command line: {exc}", hint="quote the command: --check 'polykit run polygraphy_debug.onnx --trt --onnxrt'") from None
    if not argv:
        raise UsageError("--check has no command", hint="e.g. --check polykit run polygraphy_debug.onnx --trt --onnxrt")
    return argv, any(placeholder in arg for arg in argv)


def run_check(argv: Sequence[str], replacements: dict[str, str], example: str, rules: CheckRules = CheckRules()
              ) -> Verdict:
    """Run a --check command with each placeholder replaced; judged by `rules` (by default exit
    code 0 passes)."""
    args = list(argv)
    for placeholder, value in replacements.items():
        args = [arg.replace(placeholder, value) for arg in args]
    try:
        done = subprocess.run(args, capture_output=True, text=True)
    except OSError as exc:
        raise UsageError(f"--check cannot run {args[0]!r}: {exc.strerror or exc}",
                         hint=f"give a command found on PATH, e.g. --check '{example}'") from exc
    passed = rules.passed(done.returncode, done.stdout + done.stderr)
    log.debug("--check %s: exit code %d\n%s%s", shlex.join(args), done.returncode, done.stdout, done.stderr)
    rules.log_output(passed, shlex.join(args), done.stdout + done.stderr)
    pattern = rules.matched(done.stdout + done.stderr)
    last = [f"the output matches --fail-regex {pattern!r}"] if pattern else \
        (done.stderr or done.stdout).strip().splitlines()[-1:]
    return Verdict(passed, detail=f"exit code {done.returncode}" + (f": {last[0]}" if last else ""))


def refuse_check_conflicts(check: str | None, placeholder: str, example: str, placeholder_required: bool = True,
                           **given: Any) -> None:
    """With --check: its command is valid (holds `placeholder` where required), and no option of
    the built-in check (`given`: option -> value, e.g. load_outputs=...) is set."""
    if check is None:
        return
    if placeholder_required:
        check_argv(check, placeholder, example)
    else:
        command_argv(check, placeholder)
    flags = ["--" + name.replace("_", "-") for name, value in given.items() if value is not None]
    if flags:
        raise UsageError(f"{', '.join(flags)} steer(s) the built-in check, which --check replaces",
                         hint="give the inputs and outputs to the --check command instead")


def artifacts_folder(path: str | os.PathLike | None) -> Path | None:
    """The --artifacts folder, made when missing (its parent must exist), checked before any build."""
    if path is None:
        return None
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"--artifacts {str(folder)!r} is a file, not a folder", hint="give a folder to write into")
    if not folder.parent.is_dir():
        raise UsageError(f"--artifacts {str(folder)!r}: the folder {str(folder.parent)!r} does not exist",
                         hint="create the parent folder first, or choose another path")
    folder.mkdir(exist_ok=True)
    return folder


def write_json(path: Path, doc: Any, what: str) -> Path:
    """Write a JSON document (polykit.files.write_text)."""
    import json

    from polykit.files import write_text

    return write_text(path, json.dumps(doc, indent=2) + "\n", what)

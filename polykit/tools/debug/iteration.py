"""Polygraphy's conventions for iterative debugging (`debug reduce`, `debug build`).

- **The check command and its verdict** (`CheckRules`): by default exit code 0 passes.
  `--fail-regex` makes a failure a match in the command's output (stdout + stderr), even on
  exit code 0; `--fail-code` counts only those exit codes as failures (and with a regex, only
  those that also match); `--ignore-fail-code` counts those exit codes as passes.
- **The iteration artifact** (`IterationFiles.iter_artifact`): a check command without a
  placeholder ({model}) reads the file each iteration writes at a fixed path, by default
  `polygraphy_debug.onnx` (reduce) or `polygraphy_debug.engine` (build) in the working folder.
  It must not exist when the tool starts, and it is removed after each iteration unless
  `--no-remove-intermediate`.
- **Artifact sorting** (`IterationFiles.sort`): after each check the files named by
  `--artifacts` are moved into `good/` or `bad/` under `--artifacts-dir` (default
  `polygraphy_artifacts`), renamed `{stem}_{date}_{time}_N{iteration}{suffix}`.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from polykit.errors import UsageError

log = logging.getLogger("polykit")


@dataclass(frozen=True)
class CheckRules:
    """How the result of a --check command is judged (module docstring), and whose output is
    logged: a failing iteration's at INFO (-v) unless `hide_fail_output`, every iteration's at
    WARNING with `show_output`."""

    fail_codes: tuple[int, ...] = ()
    ignore_fail_codes: tuple[int, ...] = ()
    fail_regex: tuple[str, ...] = ()
    show_output: bool = False
    hide_fail_output: bool = False

    def __post_init__(self) -> None:
        if self.fail_codes and self.ignore_fail_codes:
            raise UsageError("--fail-code and --ignore-fail-code exclude each other",
                             hint="give the exit codes that count as failures, or those that do not, not both")
        for pattern in self.fail_regex:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise UsageError(f"--fail-regex {pattern!r} is not a regular expression: {exc}", hint="give a Python regular expression, e.g. --fail-regex 'Op: Mul'") from None

    def matched(self, output: str) -> str | None:
        """The first --fail-regex found in `output`."""
        return next((p for p in self.fail_regex if re.search(p, output)), None)

    def passed(self, returncode: int, output: str) -> bool:
        """Polygraphy's rule (module docstring) for one run of the check command."""
        if returncode in self.ignore_fail_codes:
            return True
        matched = self.matched(output) is not None if self.fail_regex else None
        if self.fail_codes:
            failed = returncode in self.fail_codes and matched is not False
        else:
            failed = returncode != 0 if matched is None else matched
        return not failed

    def log_output(self, passed: bool, command: str, output: str) -> None:
        if self.show_output:
            log.warning("--check %s (%s):\n%s", command, "passed" if passed else "failed", output)
        elif not passed and not self.hide_fail_output:
            log.info("--check %s failed:\n%s", command, output)


@dataclass(frozen=True)
class IterationFiles:
    """Where each iteration's file goes and which files are sorted after each check."""

    iter_artifact: str | None = None
    remove_intermediate: bool = True
    artifacts: tuple[str, ...] = ()
    artifacts_dir: str = "polygraphy_artifacts"
    started: str = field(init=False, compare=False, default_factory=lambda: time.strftime("%x").replace("/", "-")
                         + "_" + time.strftime("%X").replace(":", "-"))

    def claim(self, default: str) -> Path:
        """The iteration artifact's path (`iter_artifact`, else `default`); UsageError when it
        exists (it would be overwritten, then removed)."""
        path = Path(self.iter_artifact or default)
        if path.exists():
            raise UsageError(f"{path} exists, and each iteration would overwrite and remove it",
                             hint="remove it, or choose another path with --iter-artifact")
        if not path.parent.is_dir():
            raise UsageError(f"--iter-artifact {str(path)!r}: the folder {str(path.parent)!r} does not exist", hint='create the folder first, or give a path in an existing folder')
        return path

    def done(self, path: Path) -> None:
        """End of an iteration: remove its artifact unless asked to keep it."""
        if self.remove_intermediate:
            path.unlink(missing_ok=True)

    def sort(self, passed: bool, iteration: int) -> list[Path]:
        """Move each of `artifacts` into good/ or bad/ (module docstring); a missing artifact or
        a taken destination is logged and skipped, as in Polygraphy. Returns the new paths."""
        moved = []
        for artifact in map(Path, self.artifacts):
            dest = Path(self.artifacts_dir, "good" if passed else "bad",
                        f"{artifact.stem}_{self.started}_N{iteration}{artifact.suffix}")
            if not artifact.exists():
                log.error("artifact %s does not exist, skipped: was the check or the build to write it?", artifact)
                continue
            if dest.exists():
                log.error("%s exists: artifact %s skipped, not overwritten", dest, artifact)
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(os.fspath(artifact), dest)
            log.info("moved %s to %s", artifact, dest)
            moved.append(dest)
        return moved


def parse_until(value: str) -> int | str:
    """--until: 'good', 'bad' or a number of iterations (at least 1)."""
    if value in ("good", "bad"):
        return value
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise UsageError(f"--until {value!r} is neither good, bad nor a number of iterations",
                         hint="e.g. --until 10, --until good (stop at the first pass) or --until bad")
    return count

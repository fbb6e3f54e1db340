"""Run a Polygraphy CLI example README's commands with `polygraphy` replaced by `polykit`.

Commands are the lines of the README's ```bash blocks that start with `polygraphy` or `python3`
(a trailing backslash joins the next line), outside `<!-- Polygraphy Test: Ignore Start/End -->`
markers, as Polygraphy's own README test reads them; commands inside `XFAIL Start/End` markers are
expected to fail (exit 1). Each example runs in a copy of its folder (tests/data/polygraphy_examples/
<same path as under examples/cli>), its commands in order: later ones read what earlier ones wrote.
`polykit` commands run in process (polykit.tools.cli.app.main) with the engine on the cpu target;
`python3 X.py` runs the script with this interpreter.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "data" / "polygraphy_examples"
_BLOCK = re.compile(r"```bash\n(.*?)```", re.S)
_MARK = re.compile(r"<!-- Polygraphy Test: (Ignore|XFAIL) (Start|End) -->")


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]
    expect_failure: bool = False

    @property
    def text(self) -> str:
        return " ".join(self.argv)


def commands(readme: str) -> list[Command]:
    """The README's commands in order, `polygraphy` already replaced by `polykit`."""
    out: list[Command] = []
    ignore = xfail = False
    pos = 0
    for match in re.finditer(rf"{_MARK.pattern}|{_BLOCK.pattern}", readme, re.S):
        pos = match.end()
        if match.group(1):
            on = match.group(2) == "Start"
            ignore, xfail = (on, xfail) if match.group(1) == "Ignore" else (ignore, on)
            continue
        if ignore:
            continue
        for line in _joined(match.group(3)):
            if line.startswith(("polygraphy ", "python3 ")):
                argv = shlex.split(line)
                if argv[0] == "polygraphy":
                    argv[0] = "polykit"
                out.append(Command(tuple(argv), xfail))
    del pos
    return out


def _joined(block: str) -> list[str]:
    lines, current = [], ""
    for raw in block.splitlines():
        line = raw.strip()
        if current:
            current += " " + line
        else:
            current = line
        if current.endswith("\\"):
            current = current[:-1].rstrip()
            continue
        lines.append(current)
        current = ""
    return lines + ([current] if current else [])


@contextmanager
def _cwd(path: Path):
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def copy_example(relative: str, workdir: Path) -> Path:
    """A copy of the example's vendored folder in `workdir`, to run its commands in."""
    target = workdir / relative
    shutil.copytree(EXAMPLES / relative, target)
    return target


def run_command(command: Command, folder: Path) -> tuple[int, str]:
    """(exit code, output) of one command run in `folder`."""
    if command.argv[0] == "python3":
        proc = subprocess.run([sys.executable, *command.argv[1:]], cwd=folder, capture_output=True, text=True,
                              timeout=300)
        return proc.returncode, proc.stdout + proc.stderr
    from polykit.tools.cli.app import main

    with _cwd(folder):
        return main(list(command.argv[1:])), ""

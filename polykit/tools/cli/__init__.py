"""The `polykit` command: the typer app (app), the CLI's value syntaxes and shared options (args,
coercion), one module per command (run, convert, bench, inspect, surgeon, debug) and --gen-script.

`main` is the console script: the CLI is the toolkit's, so on a lean install (`pip install
polykit`, which runs plans only) it says which extra to install instead of a traceback."""

from __future__ import annotations

import sys
from importlib.util import find_spec
from typing import Sequence

#: what the CLI imports that only `pip install polykit[toolkit]` installs (onnxruntime: --onnxrt only)
CLI_NEEDS = ("typer", "rich", "onnx", "pluggy")


def missing_toolkit(names: Sequence[str] = CLI_NEEDS) -> list[str]:
    """The modules of `names` that cannot be imported here."""
    missing = []
    for name in names:
        try:
            found = find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    return missing


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `polykit` console script (polykit.tools.cli.app.main once the toolkit
    is installed; exit code 2 naming the extra otherwise)."""
    missing = missing_toolkit()
    if missing:
        print(f"error: polykit's command line needs {', '.join(missing)}, which this installation lacks\n"
              "hint: pip install 'polykit[toolkit]' (a plain `pip install polykit` only runs plans: "
              "polykit.runtime)", file=sys.stderr)
        return 2
    from polykit.tools.cli.app import main as app_main

    return app_main(argv)

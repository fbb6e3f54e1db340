"""`polykit inspect diff-tactics`: the tactics only bad builds chose (polykit.tools.debug.tactic_diff)."""

from __future__ import annotations

import json
import os
from typing import Optional

import typer

HELP = ("The tactics that only bad builds chose: tactic replays (polykit's or Polygraphy's) under --dir's good/ and "
        "bad/ folders, or --good and --bad.")


def diff_tactics(
    folder: str = typer.Option("", "--dir", metavar="DIR",
                               help="a folder with good/ and bad/ folders of tactic replays (debug build --artifacts)"),
    good: Optional[str] = typer.Option(None, "--good", metavar="PATH",
                                       help="a good replay file, or a folder of them (default: DIR/good)"),
    bad: Optional[str] = typer.Option(None, "--bad", metavar="PATH",
                                      help="a bad replay file, or a folder of them (default: DIR/bad)"),
    as_json: bool = typer.Option(False, "--json", help="print the result as JSON on stdout"),
) -> int:
    """Replays in polykit's format (--save-tactics) or Polygraphy's; per layer, the choices that
    bad replays made and no good one did."""
    from rich.console import Console
    from rich.markup import escape

    from polykit.tools.debug.tactic_diff import diff_tactics as diff

    result = diff(good if good is not None else os.path.join(folder, "good"),
                  bad if bad is not None else os.path.join(folder, "bad"))
    if as_json:
        typer.echo(json.dumps(result.to_json(), indent=2))
        return 0
    console = Console(highlight=False, soft_wrap=True)
    console.print(f"Loaded {len(result.good.paths)} good tactic replays.")
    console.print(f"Loaded {len(result.bad.paths)} bad tactic replays.")
    if not result.suspects:
        console.print("Could not determine potentially bad tactics. Try generating more tactic replay files?")
        return 0
    console.print("Found potentially bad tactics:")
    for layer, choices in result.suspects.items():
        console.print(f"Layer: {escape(layer)}\n    Algorithms: {escape(str(list(choices)))}")
    return 0

"""`polykit check lint MODEL [-o report.json]` (Polygraphy's `check lint`; polykit.tools.model.lint):
exit 0 when the model has no errors (warnings allowed), 1 when it has."""

from __future__ import annotations

import json
from typing import Optional

import typer


def lint(
    model: str = typer.Argument(..., metavar="MODEL", help="the ONNX model"),
    output: Optional[str] = typer.Option(None, "-o", "--output", help="write the JSON report (Polygraphy's shape)"),
    as_json: bool = typer.Option(False, "--json", help="print the JSON report on stdout"),
) -> int:
    from polykit.files import require_output_folder
    from polykit.tools.cli.app import stderr_console
    from polykit.tools.model.lint import lint as lint_model, read_unchecked

    if output:
        require_output_folder(output, "--output")
    report = lint_model(read_unchecked(model))
    doc = report.to_json()
    console = stderr_console()
    for entry in doc["lint_entries"]:
        tag = "[E]" if entry["level"] == "exception" else "[W]" if entry["level"] == "warning" else "[I]"
        node = f"Name: {entry['nodes'][0]} | " if entry.get("nodes") else ""
        console.print(f"{tag} LINT | {node}{entry['message']}", markup=False, highlight=False, soft_wrap=True)
    if output:
        with open(output, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=4)
        console.print(f"wrote the lint report to {output}")
    if as_json:
        typer.echo(json.dumps(doc, indent=4))
    console.print(("PASSED" if report.passed else "FAILED") + f" | {len(doc['summary']['passing'])} node(s) pass, "
                  f"{len(doc['summary']['failing'])} fail, {len(doc['lint_entries'])} finding(s)")
    return 0 if report.passed else 1


def register(app: typer.Typer) -> None:
    check = typer.Typer(help="Check a model for problems.", no_args_is_help=True)
    check.command("lint", help="Find what is wrong with an ONNX model: onnx.checker, shape inference node by node, "
                               "nodes and inputs no output needs, unused initializers, ops polykit cannot run; a JSON "
                               "report shaped like Polygraphy's check lint report.")(lint)
    app.add_typer(check, name="check")

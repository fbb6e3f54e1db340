"""`polykit data to-input FILES... -o OUT` (Polygraphy's `data to-input`) and `polykit data merge
FILES... -o OUT`: combine saved inputs and outputs (polykit.tools.data.combine). OUT is written
as --save-inputs/--save-outputs write: Polygraphy's JSON for .json, polykit's .npz otherwise,
or `--format`."""

from __future__ import annotations

from typing import List, Optional

import typer

FORMAT = typer.Option(None, "--format", help="polykit or polygraphy (default: Polygraphy's JSON for a .json path, "
                                             "polykit's .npz otherwise)")


def to_input(
    paths: List[str] = typer.Argument(..., metavar="FILES...", help="saved inputs and/or outputs (any format "
                                                                    "polykit reads, Polygraphy's too)"),
    output: str = typer.Option(..., "-o", "--output", help="the input file to write (for --load-inputs)"),
    save_format: Optional[str] = FORMAT,
) -> int:
    from polykit.files import require_output_folder
    from polykit.tools.cli.app import stderr_console
    from polykit.tools.data import results_io
    from polykit.tools.data.combine import to_input as combine

    require_output_folder(output, "--output")
    feeds = combine(paths)
    results_io.save_feeds(output, feeds, save_format)
    stderr_console().print(f"wrote {output}: input file of {len(feeds)} iteration(s)")
    return 0


def merge(
    paths: List[str] = typer.Argument(..., metavar="FILES...", help="saved outputs (or saved inputs) to join"),
    output: str = typer.Option(..., "-o", "--output", help="the file to write"),
    save_format: Optional[str] = FORMAT,
) -> int:
    from polykit.errors import UsageError
    from polykit.files import require_output_folder
    from polykit.tools.cli.app import stderr_console
    from polykit.tools.data import results_io
    from polykit.tools.data.combine import merge_feeds, merge_outputs

    require_output_folder(output, "--output")
    kinds = {results_io.load_data(p)[0] for p in paths}
    if kinds == {"feeds"}:
        feeds = merge_feeds(paths)
        results_io.save_feeds(output, feeds, save_format)
        stderr_console().print(f"wrote {output}: {len(feeds)} iteration(s) of inputs")
        return 0
    if "feeds" in kinds:
        raise UsageError("data merge joins files of one kind: these hold saved inputs and saved outputs",
                         hint="use `polykit data to-input` to turn outputs into inputs")
    outputs = merge_outputs(paths)
    results_io.save_outputs(output, outputs, save_format)
    stderr_console().print(f"wrote {output}: outputs of {len(outputs)} runner(s): {', '.join(outputs)}")
    return 0


def register(app: typer.Typer) -> None:
    data = typer.Typer(help="Combine saved input and output data files.", no_args_is_help=True)
    data.command("to-input", help="Combine saved inputs and outputs into one input file (per iteration, every tensor "
                                  "of every file; Polygraphy's data to-input).")(to_input)
    data.command("merge", help="Join saved outputs of several files into one (every runner), or saved inputs "
                               "(their iterations in order).")(merge)
    app.add_typer(data, name="data")

"""`polykit data merge FILES... -o OUT` (Polygraphy 0.53's `data merge`; `data to-input`, its
0.49 name, is the same command), `polykit data concat FILES... -o OUT` (Polygraphy 0.53's) and
`polykit data join FILES... -o OUT` (polykit's: one results file of every runner; `data merge`
did this before it took Polygraphy's meaning). Files are combined by polykit.tools.data.combine;
OUT is written as --save-inputs/--save-outputs write: Polygraphy's JSON for .json, polykit's
.npz otherwise, or `--format`."""

from __future__ import annotations

from typing import List, Optional

import typer

FORMAT = typer.Option(None, "--format", help="polykit or polygraphy (default: Polygraphy's JSON for a .json path, "
                                             "polykit's .npz otherwise)")
PATHS_HELP = "saved inputs and/or outputs (any format polykit reads, Polygraphy's too)"
OUTPUT = typer.Option(..., "-o", "--output", help="the file to write")


def _start(output: str):
    from polykit.files import require_output_folder
    from polykit.tools.cli.app import stderr_console

    require_output_folder(output, "--output")
    return stderr_console()


def merge(
    paths: List[str] = typer.Argument(..., metavar="FILES...", help=PATHS_HELP + "; outputs of one runner each"),
    output: str = typer.Option(..., "-o", "--output", help="the input file to write (for --load-inputs)"),
    save_format: Optional[str] = FORMAT,
) -> int:
    from polykit.tools.data.combine import to_input

    console = _start(output)
    return _write(console, output, "feeds", to_input(paths), save_format)


def _write(console, output: str, kind: str, data, save_format: Optional[str]) -> int:
    """Save `data` (kind "feeds": a list of feed dicts; "outputs": runner -> iterations) to
    `output` and say what was written."""
    from polykit.tools.data import results_io

    if kind == "feeds":
        results_io.save_feeds(output, data, save_format)
        console.print(f"wrote {output}: input file of {len(data)} iteration(s)")
    else:
        results_io.save_outputs(output, data, save_format)
        counts = ", ".join(f"{name} ({len(iterations)})" for name, iterations in data.items())
        console.print(f"wrote {output}: outputs of {len(data)} runner(s), iterations: {counts}")
    return 0


def concat(
    paths: List[str] = typer.Argument(..., metavar="FILES...", help="saved inputs, or saved outputs (one kind)"),
    output: str = OUTPUT,
    save_format: Optional[str] = FORMAT,
) -> int:
    from polykit.tools.data.combine import concat as combine

    console = _start(output)
    kind, data = combine(paths)
    return _write(console, output, kind, data, save_format)


def join(
    paths: List[str] = typer.Argument(..., metavar="FILES...", help="saved outputs"),
    output: str = OUTPUT,
    save_format: Optional[str] = FORMAT,
) -> int:
    from polykit.errors import UsageError
    from polykit.tools.data import results_io
    from polykit.tools.data.combine import join_outputs

    console = _start(output)
    if any(results_io.load_data(p)[0] != "outputs" for p in paths):
        raise UsageError("data join joins saved outputs: some of these files hold saved inputs",
                         hint="use `polykit data concat` to concatenate saved inputs, `polykit data merge` to turn "
                              "outputs into inputs")
    outputs = join_outputs(paths)
    results_io.save_outputs(output, outputs, save_format)
    console.print(f"wrote {output}: outputs of {len(outputs)} runner(s): {', '.join(outputs)}")
    return 0


MERGE_HELP = ("Combine saved inputs and outputs into one input file for --load-inputs: per iteration, every tensor "
              "of every file, a later file's tensor replacing an earlier one of the same name (Polygraphy 0.53's "
              "data merge; polykit before 2026-12: data join).")


def register(app: typer.Typer) -> None:
    data = typer.Typer(help="Combine saved input and output data files.", no_args_is_help=True)
    data.command("merge", help=MERGE_HELP)(merge)
    data.command("to-input", help="Same as data merge (Polygraphy 0.49's name).")(merge)
    data.command("concat", help="Concatenate the iterations of saved inputs, or of saved outputs (runners matched "
                                "by name), one file's after the other's (Polygraphy 0.53's data concat).")(concat)
    data.command("join", help="Join saved outputs of several files into one results file holding every runner (a "
                              "runner name seen before gets a -N suffix); polykit's, data merge before 2026-12.")(join)
    app.add_typer(data, name="data")

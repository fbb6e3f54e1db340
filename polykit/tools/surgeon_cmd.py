"""`polykit surgeon sanitize MODEL -o OUT --fold-constants`: the compiler's folding pass + ONNX export."""

from __future__ import annotations

import typer


def sanitize(
    model: str = typer.Argument(..., metavar="MODEL", help="the ONNX model"),
    output: str = typer.Option(..., "--output", "-o", help="where to write the cleaned model"),
    fold_constants: bool = typer.Option(False, "--fold-constants", help="fold constant subgraphs (and drop dead nodes)"),
    external_data: bool = typer.Option(False, "--external-data", help="write weights to OUT.data"),
) -> int:
    from polykit.backends.loaders import GraphFromOnnx, fold_graph_constants
    from polykit.compiler.onnx_export import save_onnx
    from polykit.tools.cli import stderr_console

    graph = GraphFromOnnx(model, check_supported=False)().copy()
    before = len(graph.nodes)
    if fold_constants:
        fold_graph_constants(graph)
    save_onnx(graph, output, external_data=external_data or None)
    stderr_console().print(f"wrote {output}: {before} -> {len(graph.nodes)} nodes")
    return 0


def register(app: typer.Typer) -> None:
    surgeon = typer.Typer(help="Edit ONNX models with polykit's compiler passes.", no_args_is_help=True)
    surgeon.command("sanitize", help="Clean a model: fold constants, remove dead nodes, export.")(sanitize)
    app.add_typer(surgeon, name="surgeon")

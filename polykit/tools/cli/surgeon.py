"""`polykit surgeon ...`: edit ONNX models with polykit's compiler.

- `sanitize MODEL -o OUT [--fold-constants]`: polykit.tools.model.sanitize: the compiler's folding
  and dead-code passes, the model kept at its own opset and IR version unless `--upgrade-opset N`;
- `extract MODEL --inputs NAME:SHAPE|auto:DTYPE|auto ... --outputs NAME:DTYPE|auto ... -o OUT`:
  polykit.tools.model.subgraph.extract, shapes and dtypes from polykit's shape inference;
- `prune MODEL -o OUT`: polykit.tools.model.prune, Polygraphy's 2:4 pruning of the GEMM and Conv
  weights (for functional tests of `--sparsity enable`: accuracy is not considered).

`--external-data` writes the weights of at least `--external-data-threshold` bytes to OUT.data,
and writes that file even when every tensor is smaller.
"""

from __future__ import annotations

import json
from typing import List, Optional

import typer

EXTERNAL_DATA = typer.Option(False, "--external-data", help="write the weights to OUT.data beside OUT")
EXTERNAL_DATA_THRESHOLD = typer.Option(1024, "--external-data-threshold", metavar="BYTES", min=0,
                                       help="with --external-data, tensors of this many bytes or more go to OUT.data")


def sanitize(
    model: str = typer.Argument(..., metavar="MODEL", help="the ONNX model"),
    output: str = typer.Option(..., "--output", "-o", help="where to write the cleaned model"),
    fold_constants: bool = typer.Option(False, "--fold-constants", help="fold constant subgraphs (and drop dead nodes)"),
    upgrade_opset: Optional[int] = typer.Option(None, "--upgrade-opset", metavar="N",
                                                help="write the model at default-domain opset N (default: its own)"),
    override_input_shapes: List[str] = typer.Option([], "--override-input-shapes", metavar="NAME:[DIMS]",
                                                    help="set graph input shapes, a dim a number or a name for a "
                                                         "dynamic dim: x:[batch,1,2,2]"),
    upper_bounds: List[str] = typer.Option([], "--set-unbounded-dds-upper-bound", metavar="[NAME:]N",
                                           help="bound each tensor that sizes an output at run time without a bound "
                                                "(a Min node; `inspect model --list-unbounded-dds` lists them): N for "
                                                "all, NAME:N for one"),
    external_data: bool = EXTERNAL_DATA,
    external_data_threshold: int = EXTERNAL_DATA_THRESHOLD,
) -> int:
    from polykit.backends.loaders import OnnxFromPath
    from polykit.compiler.graph.onnx_export import save_model
    from polykit.files import require_output_folder
    from polykit.tools.cli.app import stderr_console
    from polykit.tools.model import onnx_edits
    from polykit.tools.model.sanitize import sanitize as sanitize_model

    require_output_folder(output, "--output")
    bounds = onnx_edits.parse_upper_bounds(upper_bounds)
    proto = OnnxFromPath(model)()
    nodes = len(proto.graph.node)
    if override_input_shapes:
        proto = onnx_edits.override_input_shapes(proto, _symbolic_shapes(override_input_shapes))
    clean = sanitize_model(proto, fold_constants=fold_constants, upgrade_opset=upgrade_opset)
    console = stderr_console()
    if bounds:
        applied = onnx_edits.set_upper_bounds(clean, bounds)
        console.print(f"upper bounds set: {applied or 'none (no tensor with an unbounded data-dependent shape)'}")
    save_model(clean, output, external_data=external_data or None, size_threshold=external_data_threshold)
    opset = next(o.version for o in clean.opset_import if o.domain in ("", "ai.onnx"))
    console.print(f"wrote {output}: {nodes} -> {len(clean.graph.node)} nodes, opset {opset}, IR version {clean.ir_version}")
    return 0


def _symbolic_shapes(values: List[str]) -> dict:
    """['x:[batch,1,2,2]'] (Polygraphy's x:['batch',1,2,2] once the shell took the quotes) ->
    {'x': ('batch', 1, 2, 2)}."""
    from polykit.errors import UsageError

    shapes = {}
    for value in values:
        name, sep, rest = value.partition(":")
        if not sep or not name or not (rest.startswith("[") and rest.endswith("]")):
            raise UsageError(f"--override-input-shapes {value!r} is not NAME:[DIM,...]", hint="e.g. x:[batch,3,224,224]")
        dims = [d.strip().strip("'\"") for d in rest[1:-1].split(",") if d.strip()]
        shapes[name] = tuple(int(d) if d.isdigit() else d for d in dims)
    return shapes


def extract(
    model: str = typer.Argument(..., metavar="MODEL", help="the ONNX model"),
    output: str = typer.Option(..., "--output", "-o", help="where to write the subgraph"),
    inputs: List[str] = typer.Option([], "--inputs", metavar="NAME:SHAPE|auto:DTYPE|auto",
                                     help="the subgraph's inputs, e.g. x:[1,3,224,224]:float32 h:auto:auto "
                                          "(default: the model's inputs)"),
    outputs: List[str] = typer.Option([], "--outputs", metavar="NAME:DTYPE|auto",
                                      help="the subgraph's outputs, e.g. logits:auto (default: the model's outputs)"),
    external_data: bool = EXTERNAL_DATA,
    external_data_threshold: int = EXTERNAL_DATA_THRESHOLD,
    as_json: bool = typer.Option(False, "--json", help="print the subgraph's nodes, inputs and outputs as JSON"),
) -> int:
    from polykit.compiler.graph.onnx_export import save_model
    from polykit.errors import UsageError
    from polykit.files import require_output_folder
    from polykit.tools.cli.app import stderr_console
    from polykit.tools.model.subgraph import Extractor, describe_io, parse_input_spec, parse_output_spec

    if not inputs and not outputs:
        raise UsageError("give the subgraph's --inputs, its --outputs or both (the other defaults to the model's)",
                         hint="e.g. --inputs h:auto:auto --outputs logits:auto")
    require_output_folder(output, "--output")
    extractor = Extractor(model)
    sub = extractor.extract([parse_input_spec(s) for s in inputs] or extractor.graph_inputs,
                            [parse_output_spec(s) for s in outputs] or [o.name for o in extractor.model.graph.output])
    save_model(sub, output, external_data=external_data or None, size_threshold=external_data_threshold)
    if as_json:
        typer.echo(json.dumps(describe_io(sub), indent=2))
    else:
        stderr_console().print(f"wrote {output}: {len(sub.graph.node)} nodes, inputs "
                               f"{', '.join(i.name for i in sub.graph.input)}, outputs "
                               f"{', '.join(o.name for o in sub.graph.output)}")
    return 0


def prune(
    model: str = typer.Argument(..., metavar="MODEL", help="the ONNX model"),
    output: str = typer.Option(..., "--output", "-o", help="where to write the pruned model"),
    external_data: bool = EXTERNAL_DATA,
    external_data_threshold: int = EXTERNAL_DATA_THRESHOLD,
) -> int:
    from polykit.backends.loaders import OnnxFromPath
    from polykit.compiler.graph.onnx_export import save_model
    from polykit.files import require_output_folder
    from polykit.tools.cli.app import stderr_console
    from polykit.tools.model.prune import prune_model

    require_output_folder(output, "--output")
    pruned, targets = prune_model(OnnxFromPath(model)())
    save_model(pruned, output, external_data=external_data or None, size_threshold=external_data_threshold)
    stderr_console().print(f"wrote {output}: {len(targets)} weight tensor(s) pruned to 2:4"
                           + (f" ({', '.join(f'{t.name} along axis {t.axis}' for t in targets[:8])}"
                              f"{', ...' if len(targets) > 8 else ''})" if targets else ""))
    return 0


def register(app: typer.Typer) -> None:
    surgeon = typer.Typer(help="Edit ONNX models with polykit's compiler passes.", no_args_is_help=True)
    surgeon.command("sanitize", help="Clean a model: fold constants, remove dead nodes, export at its own opset.")(
        sanitize)
    surgeon.command("extract", help="Cut the subgraph between named tensors out of a model; shapes and dtypes "
                                    "left as auto come from polykit's shape inference.")(extract)
    surgeon.command("prune", help="[EXPERIMENTAL] Prune the GEMM and Conv weights to the 2:4 structured-sparsity "
                                  "pattern, without regard for accuracy (Polygraphy's surgeon prune).")(prune)
    app.add_typer(surgeon, name="surgeon")

"""`polykit inspect model MODEL|PLAN`: I/O and an op histogram for an ONNX model; for a plan,
its layers with the ONNX nodes each one fuses, the tactic chosen and the precision."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import typer

from polykit.errors import ModelLoadError
from polykit.files import require_file

PLAN_MAGIC = b"PLYKPLAN"


def _shape(shape: Any) -> str:
    return "?" if shape is None else "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def describe_onnx(path: str) -> dict[str, Any]:
    """Name, opsets, inputs/outputs (dtype, shape), op histogram, node and weight counts."""
    from polykit.compiler.dtypes import ONNX_TYPE_NAMES
    from polykit.compiler.onnx_import import read_model

    model = read_model(path)
    g = model.graph
    inits = {t.name for t in g.initializer}

    def io(vi: Any) -> dict[str, Any]:
        tt = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim] if tt.HasField("shape") else None
        return {"name": vi.name, "dtype": ONNX_TYPE_NAMES.get(tt.elem_type, str(tt.elem_type)).lower(), "shape": dims}

    return {
        "kind": "onnx",
        "name": g.name,
        "opsets": {(o.domain or "ai.onnx"): int(o.version) for o in model.opset_import},
        "inputs": [io(v) for v in g.input if v.name not in inits],
        "outputs": [io(v) for v in g.output],
        "nodes": len(g.node),
        "initializers": len(g.initializer),
        "ops": dict(sorted(Counter(n.op_type for n in g.node).items(), key=lambda kv: (-kv[1], kv[0]))),
    }


def describe_plan(path: str) -> dict[str, Any]:
    """Target, I/O, memory and every layer with its fused nodes, tactic and precision."""
    from polykit.compiler.plan import Plan

    plan = Plan.load(path)

    def io(name: str) -> dict[str, Any]:
        t = plan.tensors[name]
        return {"name": name, "dtype": t.dtype, "shape": list(t.shape)}

    return {
        "kind": "plan",
        "target": plan.target,
        "gpu_arch": plan.gpu_arch,
        "inputs": [io(n) for n in plan.inputs],
        "outputs": [io(n) for n in plan.outputs],
        "arena_bytes": plan.memory.arena_bytes,
        "weight_bytes": plan.weight_bytes,
        "layers": [
            {"name": l.name, "kind": l.kind, "tactic": l.tactic, "precision": l.precision,
             "fused_nodes": list(l.fused_nodes)}
            for l in plan.layers
        ],
        "ops": dict(Counter(l.kind for l in plan.layers)),
    }


def model(
    path: str = typer.Argument(..., metavar="MODEL", help="an ONNX model or a polykit plan"),
    as_json: bool = typer.Option(False, "--json", help="print JSON instead of tables"),
) -> int:
    from rich.console import Console
    from rich.table import Table

    file = require_file(path, "model or plan file", ModelLoadError)
    with open(file, "rb") as fh:  # a plan by its magic bytes, or by its name (then the plan reader says what is wrong)
        is_plan = fh.read(len(PLAN_MAGIC)) == PLAN_MAGIC or file.suffix == ".plan"
    info = describe_plan(path) if is_plan else describe_onnx(path)
    if as_json:
        typer.echo(json.dumps(info, indent=2))
        return 0
    console = Console(highlight=False)
    if is_plan:
        console.print(f"[bold]plan[/] {path}: target {info['target']}{' ' + info['gpu_arch'] if info['gpu_arch'] else ''}, "
                      f"{len(info['layers'])} layers, arena {info['arena_bytes']} B, weights {info['weight_bytes']} B")
    else:
        opsets = ", ".join(f"{d} {v}" for d, v in info["opsets"].items())
        console.print(f"[bold]onnx model[/] {path}: graph {info['name']!r}, opsets {opsets}, "
                      f"{info['nodes']} nodes, {info['initializers']} initializers")
    io = Table(title="I/O", title_justify="left")
    for col in ("", "name", "dtype", "shape"):
        io.add_column(col)
    for kind in ("inputs", "outputs"):
        for t in info[kind]:
            io.add_row(kind[:-1], t["name"], t["dtype"], _shape(t["shape"]))
    console.print(io)
    ops = Table(title="ops" if not is_plan else "layer kinds", title_justify="left")
    ops.add_column("op")
    ops.add_column("count", justify="right")
    for op, count in info["ops"].items():
        ops.add_row(op, str(count))
    console.print(ops)
    if is_plan:
        layers = Table(title="layers", title_justify="left")
        for col in ("layer", "kind", "tactic", "precision", "fused nodes"):
            layers.add_column(col, overflow="fold")
        for l in info["layers"]:
            layers.add_row(l["name"], l["kind"], l["tactic"], l["precision"], ", ".join(l["fused_nodes"]))
        console.print(layers)
    return 0


def register(app: typer.Typer) -> None:
    inspect = typer.Typer(help="Show what a model or plan contains.", no_args_is_help=True)
    inspect.command("model", help="I/O and op histogram of an ONNX model; layers, tactics and precision of a plan.")(model)
    app.add_typer(inspect, name="inspect")

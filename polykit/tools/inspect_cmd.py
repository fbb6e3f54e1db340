"""`polykit inspect model MODEL|PLAN`: I/O and an op histogram for an ONNX model; for a plan
(TensorRT's engine inspector), its layers with the ONNX nodes each one fuses, the tactic
chosen, the precision, the I/O formats, the workspace and, with --profile, the time of each.
`polykit inspect tactics FILE`: the layers and tactics of a tactic replay file."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import typer

from polykit.errors import ModelLoadError, UsageError
from polykit.files import require_file


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


def describe_plan(plan: Any, profile_runs: int = 0, seed: int = 1) -> dict[str, Any]:
    """Target, I/O, memory and every layer (TensorRT's engine inspector): the ONNX nodes it
    fuses, tactic, precision, input/output formats (dtype and shape), workspace bytes where the
    plan records them and, with `profile_runs`, the median ms of that many profiled runs on
    random inputs."""
    def io(name: str) -> dict[str, Any]:
        t = plan.tensors[name]
        return {"name": name, "dtype": t.dtype, "shape": list(t.shape)}

    def formats(names: Any) -> list[dict[str, Any]]:  # an omitted optional input: None
        return [{**io(n), "kind": plan.tensors[n].kind} if n else None for n in names]

    times = {}
    if profile_runs:
        times = {row.name: row.ms for row in profile_plan(plan, profile_runs, seed).layers}
    layers = []
    for l in plan.layers:
        row = {"name": l.name, "kind": l.kind, "tactic": l.tactic, "precision": l.precision,
               "fused_nodes": list(l.fused_nodes), "inputs": formats(l.inputs), "outputs": formats(l.outputs),
               "tactic_params": dict(l.tactic_params)}
        workspace = getattr(l, "workspace_bytes", None)  # recorded by plans whose tactics declare workspace
        if workspace is not None:
            row["workspace_bytes"] = int(workspace)
        if profile_runs:
            row["ms"] = times.get(l.name)
        layers.append(row)
    return {
        "kind": "plan",
        "target": plan.target,
        "gpu_arch": plan.gpu_arch,
        "inputs": [io(n) for n in plan.inputs],
        "outputs": [io(n) for n in plan.outputs],
        "arena_bytes": plan.memory.arena_bytes,
        "weight_bytes": plan.weight_bytes,
        "layers": layers,
        "ops": dict(Counter(l.kind for l in plan.layers)),
    }


def profile_plan(plan: Any, runs: int, seed: int = 1) -> Any:
    """Per-layer profile (polykit.tools.profile_report.ProfileSummary) of `plan` on random inputs."""
    from polykit.runtime.engine import Engine
    from polykit.tools.bench import profile_engine, random_feeds

    with Engine(plan) as engine:
        return profile_engine(engine, random_feeds(engine, seed), runs)


def model(
    path: str = typer.Argument(..., metavar="MODEL", help="an ONNX model or a polykit plan"),
    profile: bool = typer.Option(False, "--profile", help="plan: run it on random inputs and time every layer"),
    iterations: int = typer.Option(10, "--iterations", help="how many profiled runs --profile takes the median of"),
    seed: int = typer.Option(1, "--seed", help="seed of --profile's random inputs"),
    as_json: bool = typer.Option(False, "--json", help="print JSON instead of tables"),
) -> int:
    from rich.console import Console
    from rich.table import Table

    from polykit.backends.loaders import model_type

    file = require_file(path, "model or plan file", ModelLoadError)
    is_plan = model_type(file) == "plan" or file.suffix == ".plan"  # by magic, or by name (the plan reader says what is wrong)
    if profile and not is_plan:
        raise UsageError("--profile times the layers of a plan; MODEL is an ONNX model",
                         hint="build a plan with `polykit convert`, or use `polykit run MODEL --trt --profile`")
    if is_plan:
        from polykit.compiler.plan import Plan

        info = describe_plan(Plan.load(path), profile_runs=iterations if profile else 0, seed=seed)
    else:
        info = describe_onnx(path)
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
        console.print(_layer_table(info["layers"], profile))
    return 0


#: optional columns of the layer table: (key in a layer's info, header, cell text)
_OPTIONAL_COLUMNS = (
    ("workspace_bytes", "workspace B", lambda v: str(v)),
    ("ms", "ms", lambda v: "-" if v is None else f"{v:.3f}"),
)


def _layer_table(layers: list[dict[str, Any]], profiled: bool) -> Any:
    from rich.table import Table

    extra = [col for col in _OPTIONAL_COLUMNS if any(col[0] in l for l in layers)]
    total = sum(l["ms"] or 0.0 for l in layers) if profiled else None
    title = "layers" + (f" (profiled: {total:.3f} ms in all, median per layer)" if total is not None else "")
    table = Table(title=title, title_justify="left")
    for col in ("layer", "kind", "tactic", "precision", "inputs", "outputs", *(c[1] for c in extra), "fused nodes"):
        table.add_column(col, overflow="fold", justify="right" if col in ("ms", "workspace B") else "left")
    for l in layers:
        table.add_row(l["name"], l["kind"], l["tactic"], l["precision"], _formats(l["inputs"]), _formats(l["outputs"]),
                      *(text(l[key]) if key in l else "-" for key, _, text in extra), ", ".join(l["fused_nodes"]))
    return table


def _formats(tensors: list[dict[str, Any] | None]) -> str:
    """The activations' dtype[shape] (weights are part of the layer, as in TensorRT's inspector)."""
    return " ".join(f"{t['dtype']}[{','.join(map(str, t['shape']))}]" for t in tensors if t and t["kind"] != "weight")


def tactics(
    path: str = typer.Argument(..., metavar="FILE", help="a tactic replay file (from --save-tactics)"),
    as_json: bool = typer.Option(False, "--json", help="print the validated replay as JSON"),
) -> int:
    from rich.console import Console
    from rich.table import Table

    from polykit.compiler.tactic_replay import load_replay

    replay = load_replay(path)
    if as_json:
        typer.echo(json.dumps(replay.to_json(), indent=2))
        return 0
    console = Console(highlight=False)
    counts = Counter(choice.tactic for choice in replay.layers.values())
    console.print(f"[bold]tactic replay[/] {path}: {len(replay)} layer(s), "
                  + (", ".join(f"{t} x{n}" for t, n in counts.most_common()) or "no layers"))
    table = Table(title_justify="left")
    for col in ("layer", "tactic", "inputs", "outputs"):
        table.add_column(col, overflow="fold")
    for name, choice in sorted(replay.layers.items()):
        table.add_row(name, choice.tactic, ", ".join(d or "-" for d in choice.inputs or ()),
                      ", ".join(choice.outputs or ()))
    console.print(table)
    return 0


def register(app: typer.Typer) -> None:
    inspect = typer.Typer(help="Show what a model, plan or tactic replay contains.", no_args_is_help=True)
    inspect.command("model", help="I/O and op histogram of an ONNX model; for a plan, every layer with its fused "
                                  "ONNX nodes, tactic, precision, formats, workspace and (--profile) time.")(model)
    inspect.command("tactics", help="The layers and tactics of a tactic replay file.")(tactics)
    app.add_typer(inspect, name="inspect")

"""`polykit inspect model MODEL|PLAN`: I/O and an op histogram for an ONNX model, and with
`--show layers` every node with its input and output tensors (names, dtypes and shapes from
polykit's shape inference); for a plan (TensorRT's engine inspector), its layers with the ONNX
nodes each one fuses, the tactic chosen, the precision, the I/O formats, the workspace and,
with --profile, the time of each. `--show` picks the sections (io, ops, layers, attrs, weights).
`polykit inspect tactics FILE`: the layers and tactics of a tactic replay file.
`polykit inspect data FILE` (polykit.tools.data.inspect) and `polykit inspect capability MODEL`
(polykit.tools.model.capability)."""

from __future__ import annotations

import json
import logging
import sys
from collections import Counter
from typing import Any, List, Optional, Sequence

import typer

from polykit.errors import ModelLoadError, UsageError
from polykit.files import require_file

log = logging.getLogger("polykit")
#: what `--show` may name (Polygraphy's inspect model --show)
SHOW = ("io", "ops", "layers", "attrs", "weights")


def _shape(shape: Any) -> str:
    return "?" if shape is None else "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def describe_onnx(path: str, show: Sequence[str] = ("io", "ops")) -> dict[str, Any]:
    """Name, opsets, inputs/outputs (dtype, shape), op histogram, node and weight counts; with
    "layers" in `show` every node (and its attributes with "attrs"), with "weights" the initializers."""
    from polykit.compiler.ir.dtypes import ONNX_TYPE_NAMES
    from polykit.compiler.graph.onnx_import import read_model

    model = read_model(path)
    g = model.graph
    inits = {t.name for t in g.initializer}

    def io(vi: Any) -> dict[str, Any]:
        tt = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim] if tt.HasField("shape") else None
        return {"name": vi.name, "dtype": ONNX_TYPE_NAMES.get(tt.elem_type, str(tt.elem_type)).lower(), "shape": dims}

    info = {
        "kind": "onnx",
        "name": g.name,
        "opsets": {(o.domain or "ai.onnx"): int(o.version) for o in model.opset_import},
        "inputs": [io(v) for v in g.input if v.name not in inits],
        "outputs": [io(v) for v in g.output],
        "nodes": len(g.node),
        "initializers": len(g.initializer),
        "ops": dict(sorted(Counter(n.op_type for n in g.node).items(), key=lambda kv: (-kv[1], kv[0]))),
    }
    if "layers" in show or "weights" in show:
        info.update(describe_nodes(model, attrs="attrs" in show, layers="layers" in show, weights="weights" in show))
    return info


def describe_nodes(model: Any, attrs: bool, layers: bool = True, weights: bool = False) -> dict[str, Any]:
    """{"layers": every ONNX node with its inputs and outputs (name, dtype, shape from polykit's
    shape inference, kind), "weights": the initializers}. A model polykit cannot import is
    still listed, its tensors' shapes unknown (with a warning saying why)."""
    import numpy as np
    from onnx import helper, numpy_helper

    from polykit.compiler.graph.onnx_import import load_onnx
    from polykit.errors import PolykitError

    try:
        graph = load_onnx(model, check_supported=False)
    except PolykitError as exc:
        log.warning("shapes unknown: polykit cannot import the model: %s", exc)
        graph = None
    inits = {t.name: t for t in model.graph.initializer}
    graph_inputs = {v.name for v in model.graph.input}

    def tensor(name: str) -> dict[str, Any] | None:
        if not name:
            return None
        v = graph.value(name) if graph is not None else None
        kind = "weight" if name in inits else "input" if name in graph_inputs else "activation"
        return {"name": name, "kind": kind, "dtype": np.dtype(v.dtype).name if v is not None and v.dtype is not None
                else None, "shape": None if v is None or v.shape is None else list(v.shape)}

    info: dict[str, Any] = {}
    if layers:
        info["layers"] = [{"name": n.name, "op": n.op_type, "domain": n.domain, "inputs": [tensor(i) for i in n.input],
                           "outputs": [tensor(o) for o in n.output],
                           **({"attrs": {a.name: _attr_text(helper.get_attribute_value(a)) for a in n.attribute}}
                              if attrs else {})} for n in model.graph.node]
    if weights:
        info["weights"] = [{"name": t.name, "dtype": numpy_helper.to_array(t).dtype.name, "shape": list(t.dims)}
                           for t in inits.values()]
    return info


def _attr_text(value: Any) -> Any:
    """An attribute as JSON: numbers, strings and lists as they are; tensors and graphs as a short text."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, (int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_attr_text(v) for v in value]
    if hasattr(value, "dims"):
        return f"tensor {list(value.dims)}"
    return f"<{type(value).__name__}>"


def describe_plan(plan: Any, profile_runs: int = 0, seed: int = 1, weights: bool = False) -> dict[str, Any]:
    """Target, I/O, memory and every layer (TensorRT's engine inspector): the ONNX nodes it
    fuses, tactic, precision, input/output formats (dtype and shape), workspace bytes where the
    plan records them and, with `profile_runs`, the median ms of that many profiled runs on
    random inputs; with `weights`, the weight tensors."""
    def io(name: str) -> dict[str, Any]:
        t = plan.tensors[name]
        return {"name": name, "dtype": t.dtype, "shape": [str(d) for d in t.dims] if t.dims else list(t.shape)}

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
        if l.profile_tactics:  # optimization profiles that chose different tactics
            row["profile_tactics"] = list(l.profile_tactics)
        workspace = getattr(l, "workspace_bytes", None)  # recorded by plans whose tactics declare workspace
        if workspace is not None:
            row["workspace_bytes"] = int(workspace)
        if profile_runs:
            row["ms"] = times.get(l.name)
        layers.append(row)
    info = {
        "kind": "plan",
        "target": plan.target,
        "gpu_arch": plan.gpu_arch,
        "inputs": [io(n) for n in plan.inputs],
        "outputs": [io(n) for n in plan.outputs],
        "arena_bytes": plan.memory.arena_bytes,
        "weight_bytes": plan.weight_bytes,
        "layers": layers,
        "ops": dict(Counter(l.kind for l in plan.layers)),
        "compatibility": {"polykit": plan.compatibility.polykit, **plan.compatibility.to_json()},
    }
    if weights:
        info["weights"] = [io(n) for n, t in plan.tensors.items() if t.kind == "weight"]
    from polykit.tools.model.ranks import collectives_of

    if collectives_of(plan) is not None:
        info["distributed"] = collectives_of(plan)
    if plan.profiles is not None:
        info["profiles"] = [{n: dict(zip(("min", "opt", "max"), plan.profiles.input_shapes(i, n, plan.tensors[n].shape)))
                             for n in plan.inputs} for i in range(len(plan.profiles.ranges))]
    return info


def profile_plan(plan: Any, runs: int, seed: int = 1) -> Any:
    """Per-layer profile (polykit.tools.report.profile.ProfileSummary) of `plan` on random inputs."""
    from polykit.runtime.engine import Engine
    from polykit.tools.bench.benchmark import profile_engine, random_feeds

    with Engine(plan) as engine:
        return profile_engine(engine, random_feeds(engine, seed), runs)


def model(
    path: str = typer.Argument(..., metavar="MODEL", help="an ONNX model or a polykit plan"),
    show: List[str] = typer.Option([], "--show", help="what to show: io, ops, layers (ONNX nodes with their tensors' "
                                                      "names, dtypes and shapes; a plan's layers), attrs (node "
                                                      "attributes; a plan's tactic parameters), weights. Default: io "
                                                      "ops (a plan: io ops layers)"),
    profile: bool = typer.Option(False, "--profile", help="plan: run it on random inputs and time every layer"),
    iterations: int = typer.Option(10, "--iterations", help="how many profiled runs --profile takes the median of"),
    seed: int = typer.Option(1, "--seed", help="seed of --profile's random inputs"),
    as_json: bool = typer.Option(False, "--json", help="print JSON instead of tables"),
    ranks: int = typer.Option(1, "--ranks", help="ONNX model: show what each of N tensor-parallel ranks holds"),
    input_shapes: List[str] = typer.Option([], "--input-shapes", help="with --ranks: shapes for dynamic inputs"),
    output_format: str = typer.Option("auto", "--format", help="table, text (Polygraphy's inspect model text: "
                                                               "'[Op: Mul]' lines; ONNX models) or json. Default "
                                                               "auto: a table on a terminal, an ONNX model's text "
                                                               "when the output is piped or captured (what scripts "
                                                               "and debug --fail-regex read)"),
    list_unbounded_dds: bool = typer.Option(False, "--list-unbounded-dds",
                                            help="ONNX model: list the tensors that size an output without an upper "
                                                 "bound (Range limit, Pad pads, ... computed at run time)"),
    model_type_name: Optional[str] = typer.Option(None, "--model-type", help="onnx or engine/plan (Polygraphy's "
                                                  "option; polykit tells the kind from the file and checks it)"),
) -> int:
    from rich.console import Console

    from polykit.backends.loaders import model_type
    from polykit.tools.cli.spellings import check_model_type

    file = require_file(path, "model or plan file", ModelLoadError)
    check_model_type(path, model_type_name)
    if output_format not in ("auto", "table", "text", "json"):
        raise UsageError(f"--format {output_format!r} is not table, text or json", hint='give --format table, text or json')
    if output_format == "auto":
        output_format = "table" if sys.stdout.isatty() else "text"
    as_json = as_json or output_format == "json"
    if list_unbounded_dds:
        return _list_unbounded_dds(path, as_json)
    if isinstance(ranks, int) and ranks > 1 and model_type(file) == "onnx":  # (called from Python: OptionInfo)
        from polykit.tools.cli.args import parse_input_shapes
        from polykit.tools.model.ranks import describe_ranks, render_ranks

        info = describe_ranks(path, ranks, parse_input_shapes(input_shapes))
        if as_json:
            typer.echo(json.dumps(info, indent=2))
        else:
            render_ranks(Console(highlight=False), info)
        return 0
    is_plan = model_type(file) == "plan" or file.suffix == ".plan"  # by magic, or by name (the plan reader says what is wrong)
    unknown = [s for s in show if s not in SHOW]
    if unknown:
        raise UsageError(f"--show {unknown[0]!r} is not one of {', '.join(SHOW)}", hint="e.g. --show layers attrs")
    sections = set(show or (("io", "ops", "layers") if is_plan else ("io", "ops")))
    if "attrs" in sections:
        sections.add("layers")
    if profile and not is_plan:
        raise UsageError("--profile times the layers of a plan; MODEL is an ONNX model",
                         hint="build a plan with `polykit convert`, or use `polykit run MODEL --trt --profile`")
    if is_plan:
        from polykit.compiler.plan.file import Plan
        from polykit.runtime.tactic_check import check_tactics

        plan = Plan.load(path)
        check_tactics(plan, path)  # what an Engine checks: tactics, plugins, regenerated kernels
        info = describe_plan(plan, profile_runs=iterations if profile else 0, seed=seed,
                             weights="weights" in sections)
    else:
        info = describe_onnx(path, tuple(sections))
    if as_json:
        typer.echo(json.dumps(info, indent=2))
        return 0
    if output_format == "text" and not is_plan:
        from polykit.tools.model.text_view import render_text

        typer.echo(render_text(info), nl=False)
        return 0
    console = Console(highlight=False)
    if is_plan:
        console.print(f"[bold]plan[/] {path}: target {info['target']}{' ' + info['gpu_arch'] if info['gpu_arch'] else ''}, "
                      f"{len(info['layers'])} layers, arena {info['arena_bytes']} B, weights {info['weight_bytes']} B")
        compat = info["compatibility"]
        console.print(f"built by polykit {compat['polykit']} (tactic set {compat['tactic_set'] or 'not recorded'}); "
                      f"version-compatible: {'yes' if compat['version_compatible'] else 'no'}; hardware compatibility "
                      f"level: {compat['hardware_compatibility_level']}")
        if "distributed" in info:
            dist = info["distributed"]
            console.print(f"rank {dist['rank']} of {dist['ranks']}: collectives "
                          + (", ".join(f"{c['layer']} ({c['op']})" for c in dist["collectives"]) or "none"))
        for i, ranges in enumerate(info.get("profiles", ())):
            shapes = "; ".join(f"{n}: min {s['min']}, opt {s['opt']}, max {s['max']}" for n, s in ranges.items())
            console.print(f"optimization profile {i}: {shapes}")
    else:
        opsets = ", ".join(f"{d} {v}" for d, v in info["opsets"].items())
        console.print(f"[bold]onnx model[/] {path}: graph {info['name']!r}, opsets {opsets}, "
                      f"{info['nodes']} nodes, {info['initializers']} initializers")
    for section in SHOW:
        if section in sections and section != "attrs":
            console.print(_SECTIONS[section](info, is_plan, profile, "attrs" in sections))
    return 0


def _list_unbounded_dds(path: str, as_json: bool) -> int:
    """Print the unbounded data-dependent-shape tensors (Polygraphy's wording: "Found tensors with
    unbounded DDS: [...]")."""
    from polykit.backends.loaders import OnnxFromPath
    from polykit.tools.model.onnx_edits import unbounded_dds

    found = unbounded_dds(OnnxFromPath(path)())
    if as_json:
        typer.echo(json.dumps(found, indent=2))
    elif found:
        typer.echo(f"Found tensors with unbounded DDS: {[f['tensor'] for f in found]}")
        for f in found:
            typer.echo(f"    {f['tensor']}: sizes the output of node {f['node']!r} ({f['op']})")
    else:
        typer.echo("No tensors with unbounded DDS found.")
    return 0


def _io_table(info: dict[str, Any], *_: Any) -> Any:
    from rich.markup import escape
    from rich.table import Table

    io = Table(title="I/O", title_justify="left")
    for col in ("", "name", "dtype", "shape"):
        io.add_column(col)
    for kind in ("inputs", "outputs"):
        for t in info[kind]:
            io.add_row(kind[:-1], escape(t["name"]), t["dtype"], escape(_shape(t["shape"])))
    return io


def _ops_table(info: dict[str, Any], is_plan: bool, *_: Any) -> Any:
    from rich.table import Table

    ops = Table(title="ops" if not is_plan else "layer kinds", title_justify="left")
    ops.add_column("op")
    ops.add_column("count", justify="right")
    for op, count in info["ops"].items():
        ops.add_row(op, str(count))
    return ops


def _layers(info: dict[str, Any], is_plan: bool, profiled: bool, attrs: bool) -> Any:
    return _layer_table(info["layers"], profiled, attrs) if is_plan else _node_table(info["layers"], attrs)


def _weights_table(info: dict[str, Any], *_: Any) -> Any:
    from rich.table import Table

    table = Table(title="weights", title_justify="left")
    for col in ("name", "dtype", "shape"):
        table.add_column(col, overflow="fold")
    for w in info["weights"]:
        table.add_row(w["name"], w["dtype"], _shape(w["shape"]))
    return table


#: --show section -> its table (info, is_plan, profiled, attrs shown)
_SECTIONS = {"io": _io_table, "ops": _ops_table, "layers": _layers, "weights": _weights_table}


def _node_table(layers: list[dict[str, Any]], attrs: bool) -> Any:
    """ONNX nodes, one row each: the tensors they read and write as `name: dtype[shape]`."""
    from rich.markup import escape
    from rich.table import Table

    def tensors(items: list[dict[str, Any] | None]) -> str:
        return "\n".join(escape(f"{t['name']}: {t['dtype'] or '?'}{_shape(t['shape'])}"
                                + (" (weight)" if t["kind"] == "weight" else "")) if t else "-" for t in items)

    table = Table(title="layers (ONNX nodes)", title_justify="left")
    for col in ("node", "op", "inputs", "outputs", *(["attributes"] if attrs else [])):
        table.add_column(col, overflow="fold")
    for l in layers:
        op = f"{l['domain']}::{l['op']}" if l["domain"] else l["op"]
        table.add_row(escape(l["name"]), escape(op), tensors(l["inputs"]), tensors(l["outputs"]),
                      *([escape(", ".join(f"{k}={v}" for k, v in l["attrs"].items()))] if attrs else []))
    return table


#: optional columns of the layer table: (key in a layer's info, header, cell text)
_OPTIONAL_COLUMNS = (
    ("workspace_bytes", "workspace B", lambda v: str(v)),
    ("ms", "ms", lambda v: "-" if v is None else f"{v:.3f}"),
)


def _layer_table(layers: list[dict[str, Any]], profiled: bool, attrs: bool = False) -> Any:
    from rich.table import Table

    extra = [col for col in _OPTIONAL_COLUMNS if any(col[0] in l for l in layers)]
    total = sum(l["ms"] or 0.0 for l in layers) if profiled else None
    title = "layers" + (f" (profiled: {total:.3f} ms in all, median per layer)" if total is not None else "")
    table = Table(title=title, title_justify="left")
    params = ["tactic parameters"] if attrs else []
    for col in ("layer", "kind", "tactic", "precision", "inputs", "outputs", *(c[1] for c in extra), "fused nodes", *params):
        table.add_column(col, overflow="fold", justify="right" if col in ("ms", "workspace B") else "left")
    for l in layers:
        table.add_row(l["name"], l["kind"], _tactic_cell(l["tactic"], l.get("profile_tactics")), l["precision"],
                      _formats(l["inputs"]), _formats(l["outputs"]),
                      *(text(l[key]) if key in l else "-" for key, _, text in extra), ", ".join(l["fused_nodes"]),
                      *([", ".join(f"{k}={v}" for k, v in l["tactic_params"].items())] if attrs else []))
    return table


def _tactic_cell(tactic: str, per_profile: Any) -> str:
    """The tactic, or each optimization profile's where they differ ("profile 0: a, profile 1: b")."""
    return ", ".join(f"profile {p}: {t}" for p, t in enumerate(per_profile)) if per_profile else tactic


def _formats(tensors: list[dict[str, Any] | None]) -> str:
    """The activations' dtype[shape] (weights are part of the layer, as in TensorRT's inspector)."""
    return " ".join(f"{t['dtype']}[{','.join(map(str, t['shape']))}]" for t in tensors if t and t["kind"] != "weight")


def tactics(
    path: str = typer.Argument(..., metavar="FILE", help="a tactic replay file (from --save-tactics)"),
    as_json: bool = typer.Option(False, "--json", help="print the validated replay as JSON"),
) -> int:
    from rich.console import Console
    from rich.table import Table

    from polykit.compiler.builder.tactic_replay import load_replay

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
        table.add_row(name, _tactic_cell(choice.tactic, choice.profiles), ", ".join(d or "-" for d in choice.inputs or ()),
                      ", ".join(choice.outputs or ()))
    console.print(table)
    return 0


def register(app: typer.Typer) -> None:
    from polykit.tools.model.capability import capability
    from polykit.tools.data.inspect import data
    from polykit.tools.cli.diff_tactics import HELP as DIFF_TACTICS_HELP, diff_tactics

    inspect = typer.Typer(help="Show what a model, plan, tactic replay or data file contains.", no_args_is_help=True)
    inspect.command("model", help="I/O and op histogram of an ONNX model (--show layers: every node with its tensors); "
                                  "for a plan, every layer with its fused ONNX nodes, tactic, precision, formats, "
                                  "workspace and (--profile) time.")(model)
    inspect.command("tactics", help="The layers and tactics of a tactic replay file.")(tactics)
    inspect.command("data", help="Per tensor of a data file (saved inputs or outputs, Polygraphy's too, .npz, .npy): "
                                 "shape, dtype, min/max/mean/std, NaN/Inf counts, a histogram.")(data)
    inspect.command("capability", help="Which nodes polykit's engine runs on a target, why the others not, and the "
                                       "supported partitions (-o writes each as an ONNX model).")(capability)
    inspect.command("diff-tactics", help=DIFF_TACTICS_HELP)(diff_tactics)
    app.add_typer(inspect, name="inspect")

"""`polykit inspect capability MODEL --target cpu|cuda`: which ONNX nodes polykit's engine runs
on a target, why the others are not, and the supported partitions.

A node is supported when polykit implements its op (an importer, a shape rule and a
reference kernel), shape inference gives its outputs static shapes, and at least one tactic
of the target accepts the layer it lowers to (the tactic table's `candidates`, at the
precisions a float32 build allows). Constant subgraphs are folded first, as the builder does
(they never reach the target). Partitions are maximal connected sets of supported nodes that
no path leaves and re-enters (each can run as one engine between unsupported nodes); `-o DIR`
writes each as an ONNX model whose inputs are the tensors it reads from outside.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, List, Mapping, Optional

import typer

if TYPE_CHECKING:  # pragma: no cover
    from polykit.compiler.ir.graph import Graph, Node

log = logging.getLogger("polykit")


@dataclass(frozen=True)
class NodeSupport:
    """One node's verdict: the tactics that accept it, or why it cannot run."""

    name: str
    op: str
    domain: str
    supported: bool
    reason: str = ""
    tactics: tuple[str, ...] = ()


@dataclass(frozen=True)
class Partition:
    """Supported nodes (topological order) that run as one subgraph, and its boundary tensors."""

    nodes: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class Capability:
    target: str
    #: the GPU architecture tactics were filtered by ("" when none was usable: every arch counts)
    arch: str
    nodes: tuple[NodeSupport, ...]
    partitions: tuple[Partition, ...]
    #: nodes folded away as constants before the check
    folded: int

    @property
    def supported(self) -> int:
        return sum(n.supported for n in self.nodes)


def prepare_graph(model: Any, input_shapes: Mapping[str, tuple[int, ...]]) -> "tuple[Graph, int]":
    """The model imported (unsupported ops kept), inputs given static shapes (a dynamic dim not
    given becomes 1, with a notice) and constant subgraphs folded, as the builder sees it; and
    how many nodes folded away."""
    from polykit.backends.loaders import fold_graph_constants
    from polykit.compiler.builder.builder import apply_input_shapes
    from polykit.compiler.graph.infer import infer_shapes
    from polykit.compiler.graph.onnx_import import load_onnx

    graph = load_onnx(model, check_supported=False)
    shapes = dict(input_shapes)
    for name in graph.inputs:
        v = graph.value(name)
        if name not in shapes and v.shape is not None and not v.is_static:
            shapes[name] = tuple(d if isinstance(d, int) else 1 for d in v.shape)
            log.warning("input %r has dynamic shape %s; checking with %s (set it with --input-shapes)",
                        name, list(v.shape), list(shapes[name]))
    apply_input_shapes(graph, shapes)
    infer_shapes(graph, strict=False)
    imported = len(graph.nodes)
    fold_graph_constants(graph)
    return graph, imported - len(graph.nodes)


def _layer(node: "Node", graph: "Graph") -> Any:
    """The plain layer the node lowers to, stamped with its tensors' dtypes and shapes."""
    import numpy as np

    from polykit.compiler.plan.records import LayerDesc

    def dtype(name: str) -> str:
        return np.dtype(graph.value(name).dtype).name if name else ""

    def shape(name: str) -> tuple[int, ...]:
        return tuple(graph.value(name).shape) if name else ()

    return LayerDesc(node.name, node.op_type, tuple(node.inputs), tuple(node.outputs),
                     {k: v for k, v in node.attrs.items() if k != "fused_from"}, node.domain, fused_nodes=(node.name,),
                     in_dtypes=tuple(map(dtype, node.inputs)), out_dtypes=tuple(map(dtype, node.outputs)),
                     in_shapes=tuple(map(shape, node.inputs)), out_shapes=tuple(map(shape, node.outputs)))


def _unknown_tensor(node: "Node", graph: "Graph") -> str | None:
    """The first input or output whose dtype or static shape shape inference could not tell."""
    for name in (*node.inputs, *node.outputs):
        if name and (graph.value(name).dtype is None or not graph.value(name).is_static):
            return name
    return None


def judge_node(node: "Node", graph: "Graph", target: str, arch: str | None) -> NodeSupport:
    """Whether `target` runs `node`, and which tactics accept it (or why none does)."""
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.compiler.builder.layer_precision import allowed_precisions
    from polykit.compiler.ops.registry import find_shape_rule
    from polykit.compiler.ops.references import find_reference
    from polykit.kernels.tactics import candidates, tactic_table

    domain = node.domain or "ai.onnx"
    verdict = NodeSupport(node.name, node.op_type, node.domain, False)
    missing = [what for what, found in (("shape rule", find_shape_rule(node.domain, node.op_type)),
                                        ("reference kernel", find_reference(node.domain, node.op_type))) if found is None]
    if missing:
        return replace(verdict, reason=f"polykit does not implement {domain}::{node.op_type} (no {' or '.join(missing)})")
    unknown = _unknown_tensor(node, graph)
    if unknown is not None:
        v = graph.value(unknown)
        return replace(verdict, reason=f"shape inference cannot tell tensor {unknown!r} "
                                       f"({'dtype unknown' if v.dtype is None else f'shape {v.shape}'}); "
                                       "it may come from an unsupported node or depend on input data")
    layer = _layer(node, graph)
    found = [t.name for p in allowed_precisions(layer, BuilderConfig(), target)
             for t in candidates(target, node.op_type, replace(layer, precision=p), arch=arch)]
    if found:
        return replace(verdict, supported=True, tactics=tuple(dict.fromkeys(found)))
    kind = [t.name for t in tactic_table(target).of_kind(target, node.domain, node.op_type)]
    io = ", ".join(f"{d or '-'}{list(s)}" for d, s in zip(layer.in_dtypes, layer.in_shapes))
    named = ", ".join(kind[:4]) + (f" and {len(kind) - 4} more" if len(kind) > 4 else "")
    return replace(verdict, reason=f"no {target} tactic accepts it (inputs {io}); the {target} tactics of "
                                   f"{node.op_type} layers: {named}" if kind else
                   f"the {target} target has no tactic for {node.op_type} layers")


def partition(graph: "Graph", supported: set[int]) -> list[list[int]]:
    """Indices (into graph.nodes, topological) of each partition of the supported nodes: nodes
    joined along their edges, greedily in topological order, unless the union would let a
    path leave it and come back (the union could then not run as one subgraph)."""
    nodes = graph.nodes
    producer = {out: i for i, n in enumerate(nodes) for out in n.outputs if out}
    users: list[set[int]] = [set() for _ in nodes]
    for i, n in enumerate(nodes):
        for name in n.inputs:
            if name in producer:
                users[producer[name]].add(i)
    parent = {i: i for i in supported}
    members = {i: {i} for i in supported}

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def reenters(union: set[int]) -> bool:
        last = max(union)
        stack = [u for m in union for u in users[m] if u not in union and u < last]
        seen = set(stack)
        while stack:
            for u in users[stack.pop()]:
                if u in union:
                    return True
                if u not in seen and u < last:
                    seen.add(u)
                    stack.append(u)
        return False

    for i in sorted(supported):
        for name in nodes[i].inputs:
            p = producer.get(name)
            if p is None or p not in supported:
                continue
            a, b = find(p), find(i)
            if a != b and not reenters(members[a] | members[b]):
                parent[b] = a
                members[a] |= members.pop(b)
    return sorted((sorted(group) for group in members.values()), key=lambda g: g[0])


def boundary(graph: "Graph", indices: list[int]) -> Partition:
    """The partition's node names, the tensors it reads from outside (initializers excluded)
    and those it gives to other nodes or as graph outputs."""
    inside = [graph.nodes[i] for i in indices]
    made = {o for n in inside for o in n.outputs if o}
    inputs = [t for n in inside for t in n.inputs if t and t not in made and t not in graph.initializers]
    chosen = set(indices)
    outside = {t for j, n in enumerate(graph.nodes) if j not in chosen for t in n.inputs}
    outputs = [o for n in inside for o in n.outputs if o and (o in outside or o in graph.outputs)]
    return Partition(tuple(n.name for n in inside), tuple(dict.fromkeys(inputs)), tuple(dict.fromkeys(outputs)))


def check_capability(model: Any, target: str, input_shapes: Mapping[str, tuple[int, ...]] | None = None
                     ) -> "tuple[Capability, Graph]":
    """The capability report of `model` (a path or ModelProto) on `target`, and the graph judged."""
    from polykit.compiler.builder.builder import build_device, resolve_target

    target = resolve_target(target)
    graph, folded = prepare_graph(model, input_shapes or {})
    device = build_device(target) if target != "cpu" else None
    arch = device.arch if device is not None else None
    verdicts = tuple(judge_node(n, graph, target, arch) for n in graph.nodes)
    groups = partition(graph, {i for i, v in enumerate(verdicts) if v.supported})
    report = Capability(target, arch or "", verdicts, tuple(boundary(graph, g) for g in groups),
                        folded=folded)
    return report, graph


def to_json(report: Capability) -> dict[str, Any]:
    from dataclasses import asdict

    return {"target": report.target, "arch": report.arch, "supported": report.supported, "nodes_checked": len(report.nodes),
            "folded": report.folded, "nodes": [asdict(n) for n in report.nodes],
            "partitions": [asdict(p) for p in report.partitions]}


def write_partitions(graph: "Graph", report: Capability, folder: str) -> list[str]:
    """Write each partition as `partition_<i>.onnx` into `folder` (made if missing), cut by
    polykit.tools.model.subgraph.Extractor from the graph judged; the paths."""
    from pathlib import Path

    from polykit.compiler.graph.onnx_import import check_model
    from polykit.errors import UsageError

    out = Path(folder)
    if out.exists() and not out.is_dir():
        raise UsageError(f"-o {folder!r} is a file, not a folder", hint="give a folder to write the partitions into")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot make the folder: {exc.strerror or exc}", where=folder,
                         hint="check that the parent folder exists and is writable") from None
    paths = []
    import onnx

    from polykit.compiler.graph.onnx_export import to_onnx
    from polykit.tools.model.subgraph import Extractor

    extractor = Extractor(to_onnx(graph), graph)  # the graph judged: inputs static, constants folded
    for i, part in enumerate(report.partitions):
        model = extractor.extract(part.inputs, part.outputs)
        check_model(model, f"partition {i}")
        path = out / f"partition_{i}.onnx"
        onnx.save_model(model, str(path))
        paths.append(str(path))
    return paths


#: where --with-partitioning writes the partitions without -o (Polygraphy: polygraphy_capability_dumps)
PARTITIONS_FOLDER = "polykit_capability_dumps"


def capability(
    model: str = typer.Argument(..., metavar="MODEL", help="an ONNX model"),
    target: Optional[str] = typer.Option(None, "--target", help="cuda|cpu (default: cuda if usable)"),
    input_shapes: List[str] = typer.Option([], "--input-shapes", help="shapes for dynamic inputs: x:[1,3,224,224] "
                                                                      "(default: 1 for each dynamic dim)"),
    output: Optional[str] = typer.Option(None, "-o", "--output", metavar="DIR",
                                         help="write each supported partition as DIR/partition_<i>.onnx"),
    as_json: bool = typer.Option(False, "--json", help="print JSON instead of tables"),
    with_partitioning: bool = typer.Option(False, "--with-partitioning",
                                           help="Polygraphy's spelling: write the supported partitions (to -o DIR, "
                                                "default polykit_capability_dumps)"),
) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from polykit.files import require_file
    from polykit.errors import ModelLoadError
    from polykit.tools.cli.args import parse_input_shapes

    require_file(model, "model file", ModelLoadError)
    if with_partitioning and not output:
        output = PARTITIONS_FOLDER
    report, graph = check_capability(model, target, parse_input_shapes(input_shapes))
    files = write_partitions(graph, report, output) if output else []
    if as_json:
        doc = to_json(report)
        for part, path in zip(doc["partitions"], files):
            part["file"] = path
        typer.echo(json.dumps(doc, indent=2))
        return 0
    console = Console(highlight=False)
    arch = f" ({report.arch})" if report.arch else " (no GPU: tactics of every architecture count)" \
        if report.target != "cpu" else ""
    console.print(f"[bold]{report.supported} of {len(report.nodes)} node(s)[/] of {escape(model)} run on the "
                  f"{report.target} target{arch}" + (f"; {report.folded} constant node(s) fold away" if report.folded else ""))
    unsupported = [n for n in report.nodes if not n.supported]
    if unsupported:
        table = Table(title="unsupported nodes", title_justify="left")
        for col in ("node", "op", "reason"):
            table.add_column(col, overflow="fold")
        for n in unsupported:
            table.add_row(escape(n.name), escape(f"{n.domain}::{n.op}" if n.domain else n.op), escape(n.reason))
        console.print(table)
    table = Table(title="supported partitions", title_justify="left")
    for col in ("#", "nodes", "inputs", "outputs", *(["file"] if files else [])):
        table.add_column(col, overflow="fold")
    for i, part in enumerate(report.partitions):
        span = part.nodes[0] if len(part.nodes) == 1 else f"{len(part.nodes)}: {part.nodes[0]} .. {part.nodes[-1]}"
        table.add_row(str(i), escape(span), escape(", ".join(part.inputs)), escape(", ".join(part.outputs)),
                      *([escape(files[i])] if files else []))
    console.print(table)
    return 0

"""absorb_concat: a Concat read only by Pointwise nodes disappears into them (docs/FUSION.md).

Each reader takes the Concat's inputs (its sources) in place of its output and records them in
attribute `concat` (polykit.compiler.ops.nn.concat_operands): the body still reads the Concat's
output by name, and the kernels read that operand from its sources, so no kernel copies the
features into a concatenated buffer first (DenseNet's growing concat: every dense layer's
BatchNorm + ReLU read all the features so far through one Concat).

The Concat stays when its output is a graph output or kept, is not floating point (shape
chains stay host values), has a reader that is not a Pointwise node (a convolution, a pool: it
needs the buffer), is read inside an If/Loop/Scan body, or would give a reader more than
MAX_SOURCES sources. A one-input Concat is an identity: remove_identity takes it, any reader.
Runs after fuse_pointwise (the Pointwise nodes exist then) and before eliminate_dead_code.
"""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Graph, Node, subgraphs
from polykit.compiler.ops.nn.concat_operands import MAX_SOURCES, concat_operands
from polykit.compiler.passes.rewrite import protected


#: the dtypes of an absorbed Concat: plain floats (shape chains stay host values; packed types stay copies)
FLOATS = frozenset({"float16", "bfloat16", "float32", "float64"})


def is_pointwise(node: Node) -> bool:
    return node.domain == POLYKIT_DOMAIN and node.op_type == "Pointwise"


def absorb_concat(graph: Graph, *, keep: frozenset[str] = frozenset()) -> bool:
    """Absorb every Concat whose readers are all Pointwise nodes into them; True if any."""
    fixed = protected(graph, keep)
    captured = read_in_bodies(graph)
    flattened = _flatten_nested(graph, fixed, captured)
    readers = graph.consumers()
    dead: list[Node] = []
    for node in list(graph.nodes):
        if not _absorbable(graph, node, fixed, captured):
            continue
        out = node.outputs[0]
        users = readers.get(out, [])
        if not users or not all(is_pointwise(r) and not _in_operand(r, out) for r in users):
            continue
        for r in users:
            _take_sources(graph, r, node)
        dead.append(node)
    graph.remove_nodes(dead)
    return bool(dead) or flattened


def _flatten_nested(graph: Graph, fixed: set[str], captured: set[str]) -> bool:
    """A Concat reading another's output along the same axis reads that one's sources instead,
    where the inner one's other readers are Pointwise nodes (so it can be absorbed then): a
    chain x = Concat(x, y) becomes one Concat of all the features per reader."""
    producers, readers = graph.producers(), graph.consumers()
    changed = False
    for node in graph.nodes:  # topological: an inner Concat is flat before its readers look
        if not _absorbable(graph, node, fixed, captured):
            continue
        axis = _axis(graph, node)
        spliced: list[str] = []
        for name in node.inputs:
            inner = producers.get(name)
            if inner is not None and _absorbable(graph, inner, fixed, captured) and _axis(graph, inner) == axis \
                    and all(is_pointwise(r) or r.op_type == "Concat" for r in readers.get(name, [])):
                spliced.extend(inner.inputs)
            else:
                spliced.append(name)
        if spliced != node.inputs and len(spliced) <= MAX_SOURCES:
            node.inputs = spliced
            changed = True
    return changed


def _axis(graph: Graph, node: Node) -> int:
    return int(node.attrs.get("axis", 0)) % len(graph.value(node.outputs[0]).shape)


def _absorbable(graph: Graph, node: Node, fixed: set[str], captured: set[str]) -> bool:
    if node.domain != "" or node.op_type != "Concat" or len(node.outputs) != 1 or not 2 <= len(node.inputs) <= MAX_SOURCES:
        return False
    out = node.outputs[0]
    if out in fixed or out in captured or not all(node.inputs):
        return False
    value = graph.value(out)
    if value.dtype is None or np.dtype(value.dtype).name not in FLOATS or value.shape is None:
        return False
    rank = len(value.shape)
    axis = int(node.attrs.get("axis", 0))
    if rank == 0 or not -rank <= axis < rank:
        return False
    return all(graph.value(n).shape is not None and len(graph.value(n).shape) == rank for n in node.inputs)


def _in_operand(reader: Node, name: str) -> bool:
    """Whether `name` is a source of one of the reader's concatenated operands (a Concat of a
    Concat's output: the inner one stays)."""
    return any(name in reader.inputs[e["first"]:e["first"] + e["count"]]
               for e in concat_operands(reader.attrs, len(reader.inputs), reader.describe()))


def _take_sources(graph: Graph, reader: Node, concat: Node) -> None:
    """Put the Concat's sources where the reader read its output (appended at the end, the
    position recorded) and add the operand's `concat` entry."""
    out = concat.outputs[0]
    axis = _axis(graph, concat)
    entries = concat_operands(reader.attrs, len(reader.inputs), reader.describe())
    kept = [n for n in reader.inputs if n != out]
    # earlier entries index into the inputs: an input removed before them shifts them down
    removed_before = {e["name"]: sum(1 for n in reader.inputs[:e["first"]] if n == out) for e in entries}
    entries = [dict(e, first=e["first"] - removed_before[e["name"]]) for e in entries]
    extents = []
    for n in concat.inputs:
        d = graph.value(n).shape[axis]
        extents.append(int(d) if isinstance(d, (int, np.integer)) else None)
    entries.append({"name": out, "axis": axis, "first": len(kept), "count": len(concat.inputs), "extents": extents})
    reader.inputs = kept + list(concat.inputs)
    reader.attrs["concat"] = entries


def read_in_bodies(graph: Graph) -> set[str]:
    """Every name read by a node inside an If/Loop/Scan body (outer values they capture)."""
    names: set[str] = set()
    for node in graph.nodes:
        for _, body in subgraphs(node):
            for inner in body.nodes:
                names.update(n for n in inner.inputs if n)
            names |= read_in_bodies(body)
    return names

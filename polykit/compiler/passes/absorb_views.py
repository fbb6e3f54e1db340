"""absorb_views: a Transpose, PermutedCopy or Split read only by elementwise layers copies nothing
(docs/FUSION.md).

Its readers read its source through a view instead (attribute `view`,
polykit.compiler.ops.nn.view_operands): per logical dim a cyclic shift, then a split into pieces
with their element strides, plus a base offset. That covers transposes, windows, a
reshape-transpose-reshape (Swin's window merge) and rolls (its shifted merge; LLaMA's
rotate_half) and a Split's pieces (each output its own view; a packed projection's q / k
through RoPE, a gated MLP's SiLU(gate) * up, pack_gemms). The copy may sit behind Reshape-family
views (Reshape, Flatten, Squeeze, Unsqueeze: the reader's view takes their shape) and before them
(the readers read the tensor above them: the same elements; a dead one goes with the copy), and a
reader may already read it through a view (rotate_half's roll of RoPE's transposed query: the views compose).

The view of each read is found by running the copy's reference on the element indices of its
source and fitting a view to the result (view_operands.fit_view, checked element by element),
so every PermutedCopy form composes with every reshape without a rule per pair.

The copy stays when its output (or a view of it on the way) is a graph output or kept, or read
inside an If/Loop/Scan body; its shapes are not static or exceed MAX_ELEMENTS; it is not
floating point; a reader is neither a Pointwise node (without concatenated operands) nor a
fusable plain elementwise op (which becomes a one-step Pointwise node); or some read fits no
view with the innermost dim at stride 1 (coalesced reads). Runs after absorb_concat (the two
attributes exclude each other) and before eliminate_dead_code.
"""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Graph, Node
from polykit.compiler.ir.symbolic import SymInt
from polykit.compiler.ops.nn.view_operands import fit_view, view_index, view_operands
from polykit.compiler.ops.references import run_reference
from polykit.compiler.passes.absorb_concat import FLOATS, is_pointwise, read_in_bodies
from polykit.compiler.passes.fuse_pointwise import body_step, is_fusable
from polykit.compiler.passes.rewrite import protected

#: the copies whose reads become views
COPIES = {("", "Transpose"), (POLYKIT_DOMAIN, "PermutedCopy"), ("", "Split")}
#: views on the way from a copy to its readers (no data moves)
RESHAPES = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})
#: the largest copy whose index map the pass computes (int64 per element)
MAX_ELEMENTS = 1 << 22


def absorb_views(graph: Graph, *, keep: frozenset[str] = frozenset()) -> bool:
    """Make every Transpose / PermutedCopy read only by elementwise layers a view of theirs; True if any."""
    fixed = protected(graph, keep) | read_in_bodies(graph)
    changed = False
    # later copies first: a roll of a transposed value goes before the transpose (whether a copy
    # goes depends only on its readers, which come after it; a copy drops only nodes after it)
    for node in reversed(list(graph.nodes)):
        changed |= _absorb(graph, node, fixed)
    return changed


def _static(graph: Graph, name: str) -> tuple[int, ...] | None:
    value = graph.value(name)
    if value.shape is None or not all(isinstance(d, (int, np.integer)) and not isinstance(d, SymInt)
                                      for d in value.shape):
        return None  # a profile build's dynamic dim (a SymInt) is its opt value only: a view fitted there breaks
    return tuple(int(d) for d in value.shape)


def _absorb(graph: Graph, node: Node, fixed: set[str]) -> bool:
    """Turn every read of `node` (a copy) into a view of its source and drop it; False, and no
    edit, when one of the rules in the module docstring refuses."""
    if (node.domain, node.op_type) not in COPIES or not node.outputs or not node.inputs or not node.inputs[0] \
            or (len(node.outputs) != 1 and node.op_type != "Split"):
        return False
    src = node.inputs[0]
    in_shape = _static(graph, src)
    params = [graph.initializers.get(n) for n in node.inputs[1:] if n]  # a Split's sizes
    if in_shape is None or not 0 < int(np.prod(in_shape)) <= MAX_ELEMENTS or any(p is None for p in params) \
            or len(params) != len([n for n in node.inputs[1:] if n]):
        return False
    readers = graph.consumers()
    outs = [o for o in node.outputs if o and readers.get(o)]  # a Split's unread outputs need no view
    all_reads: list[tuple[Node, str]] = []
    for out in outs:
        dtype = graph.value(out).dtype
        if _static(graph, out) is None or out in fixed or dtype is None or np.dtype(dtype).name not in FLOATS:
            return False
        reads = _reads(graph, out, readers, fixed)
        if reads is None:
            return False
        all_reads.extend(reads)
    if any(o in fixed for o in node.outputs if o):
        return False
    src = _above_reshapes(graph, src)
    indices = run_reference(node, [np.arange(int(np.prod(in_shape)), dtype=np.int64).reshape(in_shape),
                                   *(np.asarray(p) for p in params)])
    index_of = {o: np.asarray(i) for o, i in zip(node.outputs, indices) if o}
    plans: dict[int, tuple[Node, list[str], list[dict]]] = {}
    for reader, name in all_reads:
        _, inputs, views = plans.get(id(reader), (reader, *_operands(reader)))
        out = next(o for o in outs if _below(graph, o, name, readers))
        plan = _read_through(inputs, views, name, index_of[out].reshape(_static(graph, name)), src)
        if plan is None:
            return False
        plans[id(reader)] = (reader, *plan)
    for reader, inputs, views in plans.values():
        target = reader if is_pointwise(reader) else _as_pointwise(graph, reader)
        target.inputs, target.attrs["view"] = inputs, views
    graph.remove_nodes([node, *(r for o in outs for r in _reshapes_between(graph, o, readers))])
    return True


def _below(graph: Graph, out: str, name: str, readers: dict[str, list[Node]]) -> bool:
    """Whether `name` is `out` or a Reshape-family view below it."""
    return name == out or any(_below(graph, r.outputs[0], name, readers) for r in readers.get(out, [])
                              if r.domain == "" and r.op_type in RESHAPES and r.inputs[0] == out)


def _above_reshapes(graph: Graph, name: str) -> str:
    """The tensor above the Reshape-family views that give `name` (the same elements, row-major):
    the readers read it, so a view of a graph input or of a weight needs no copy of it."""
    producers = graph.producers()
    while (p := producers.get(name)) is not None and p.domain == "" and p.op_type in RESHAPES and p.inputs[0] \
            and _static(graph, p.inputs[0]) is not None:
        name = p.inputs[0]
    return name


def _reads(graph: Graph, name: str, readers: dict[str, list[Node]], fixed: set[str]) -> list[tuple[Node, str]] | None:
    """(reader, the name it reads) of every elementwise read of `name`, through Reshape-family
    views; None when one read cannot become a view."""
    out: list[tuple[Node, str]] = []
    for r in readers.get(name, []):
        if r.domain == "" and r.op_type in RESHAPES and r.inputs[0] == name and name not in r.inputs[1:]:
            below = r.outputs[0]
            if below in fixed or _static(graph, below) is None:
                return None
            if not readers.get(below):  # a dead view (eliminate_dead_code comes after): goes with the copy
                continue
            deeper = _reads(graph, below, readers, fixed)
            if deeper is None:
                return None
            out.extend(deeper)
        elif (is_pointwise(r) and not r.attrs.get("concat")) or (r.domain == "" and is_fusable(graph, r)):
            if (r, name) not in out:
                out.append((r, name))
        else:
            return None
    return out if out else None


def _operands(reader: Node) -> tuple[list[str], list[dict]]:
    """(inputs, view entries) of a reader as a Pointwise node (a plain op's inputs, once each)."""
    if is_pointwise(reader):
        return list(reader.inputs), list(view_operands(reader.attrs, len(reader.inputs), reader.describe()))
    return list(dict.fromkeys(n for n in reader.inputs if n)), []


def _read_through(inputs: list[str], views: list[dict], name: str, index: np.ndarray,
                  src: str) -> tuple[list[str], list[dict]] | None:
    """The reader's inputs and view entries once it reads `name` (element offsets `index` into
    `src`) through views of `src`; None when a read fits no view."""
    by_input = {e["input"]: e for e in views}
    new_inputs: list[str] = []
    entries: list[dict] = []
    for k, physical in enumerate(inputs):
        entry = by_input.get(k)
        if physical != name:
            if entry is not None:
                entries.append(dict(entry, input=len(new_inputs)))
            new_inputs.append(physical)
            continue
        if entry is None:  # a plain read of the value: the view is its own index map
            if any(e["name"] == name for e in entries):
                continue  # a repeated plain input: its first position holds it
            fitted = fit_view(index, name, len(new_inputs))
        else:  # a read through a view already: the two compose
            fitted = fit_view(index.reshape(-1)[view_index(entry)], entry["name"], len(new_inputs))
        if fitted is None:
            return None
        entries.append(fitted)
        new_inputs.append(src)
    return new_inputs, entries


def _as_pointwise(graph: Graph, node: Node) -> Node:
    """Replace a plain elementwise node by a one-step Pointwise node in its place."""
    inputs = list(dict.fromkeys(n for n in node.inputs if n))
    fused = Node("Pointwise", inputs, list(node.outputs), {"body": [body_step(node)], "fused_from": [node.name]},
                 name=f"{node.name}_pointwise", domain=POLYKIT_DOMAIN)
    graph.nodes = [fused if n is node else n for n in graph.nodes]
    return fused


def _reshapes_between(graph: Graph, name: str, readers: dict[str, list[Node]]) -> list[Node]:
    """The Reshape-family views below `name` (all read only through views now)."""
    out: list[Node] = []
    for r in readers.get(name, []):
        if r.domain == "" and r.op_type in RESHAPES and r.inputs[0] == name:
            out.append(r)
            out.extend(_reshapes_between(graph, r.outputs[0], readers))
    return out

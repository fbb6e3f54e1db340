"""plan_layouts: run each region of layout-free ops NHWC or NCHW, whichever moves fewer bytes.

to_channels_last leaves every NHWC op (ConvNHWC, the NHWC pools) between Transposes, and
cancel_transposes sinks a Transpose one op at a time; that stops at a tensor two ops read
(SiLU's `x * sigmoid(x)`), at ops of several inputs (Concat, the squeeze-excitation scale) and
at ops it has no rule for (BatchNormalization, Pad, Resize, Slice). This pass plans by regions:

1. A *region* is a maximal set of nodes that have an NHWC form (nhwc_forms: elementwise ops,
   Reduce*, Concat, Split, Slice, Gather of a constant 1-D index (a channel shuffle, see
   fold_axis_permutations), Pad, Resize, inference BatchNormalization as a per-channel
   Mul + Add on the last axis, GroupNormalization / InstanceNormalization as ai.polykit
   GroupNormNHWC, MaxPool / AveragePool / GlobalAveragePool / GlobalMaxPool) on
   rank-4 tensors, connected through the tensors they pass each other.
2. Its *price* is what running it NHWC changes in the bytes reformats move (a Transpose reads
   and writes its tensor once): a border input written by a Transpose to NCHW (perm 0, 3, 1, 2)
   is read in NHWC for free, and that Transpose goes when the region was its only reader; a
   border output that only Transposes to NHWC and order-keeping reshapes read costs nothing,
   and those Transposes go; every other border input or output (graph outputs included) costs
   a Transpose of its size.
3. A region flips when that removes more bytes than it adds, or as many when every border input
   is free (its ops then sit next to the NHWC producers, whose epilogues may take them, and the
   Transpose moves to the NCHW reader): each node becomes its NHWC form,
   a Transpose to NHWC feeds each border input, a Transpose to NCHW writes each border output
   read outside under its own name; cancel_transposes (next in the pipeline) composes the pairs.
Regions are separated by nodes of fixed layout, so one region's choice changes no other's price
(a Transpose two regions read is counted as kept): a greedy choice per region is the optimum of
this cost model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from polykit.compiler.ir.graph import Graph, Node
from polykit.compiler.ops.nn.channels_last import TO_NCHW, TO_NHWC
from polykit.compiler.passes.cancel_transposes import perm_of
from polykit.compiler.passes.nhwc_forms import NhwcNames, layout_rule, layout_tensor
from polykit.compiler.passes.rewrite import protected


def nbytes(graph: Graph, name: str) -> int:
    """Bytes of tensor `name` (an unknown dim counts 1: every tensor of a region shares it)."""
    v = graph.value(name)
    size = int(np.prod([d if isinstance(d, int) else 1 for d in v.shape or ()]))
    return size * (v.dtype.itemsize if v.dtype is not None else 4)


def _layout_inputs(graph: Graph, node: Node) -> list[str]:
    return list(dict.fromkeys(n for n in node.inputs if layout_tensor(graph, n)))


def _is_perm(graph: Graph, node: Node, perm: tuple[int, ...]) -> bool:
    return perm_of(graph, node) == list(perm)


def _flat_reader(graph: Graph, reader: Node, name: str) -> bool:
    """A Reshape / Flatten of `name` whose NCHW and NHWC forms hold the same data in the same
    order (only size-1 dims move): cancel_transposes lets it read the NHWC form."""
    shape = graph.value(name).shape
    if reader.domain != "" or reader.op_type not in ("Reshape", "Flatten") or reader.input(0) != name:
        return False
    moved = [a for a in TO_NHWC if shape[a] != 1]
    return moved == sorted(moved)


@dataclass
class Region:
    """Connected nodes that have an NHWC form, their border tensors and the flip's price in bytes."""

    nodes: list[Node]
    inputs: list[str]
    outputs: list[str]
    added: int = 0
    removed: int = 0
    free_entry: bool = True  # every input is read in NHWC without a new Transpose


class _Planner:
    def __init__(self, graph: Graph, fixed: set[str]):
        self.graph = graph
        self.fixed = fixed
        self.producers = graph.producers()
        self.readers = graph.consumers()

    def regions(self) -> list[Region]:
        rules = {id(n): r for n in self.graph.nodes if (r := layout_rule(self.graph, n)) is not None}
        parent = {k: k for k in rules}

        def root(k: int) -> int:
            while parent[k] != k:
                parent[k] = parent[parent[k]]
                k = parent[k]
            return k

        for node in self.graph.nodes:
            if id(node) not in rules:
                continue
            for name in _layout_inputs(self.graph, node):
                producer = self.producers.get(name)
                if producer is not None and id(producer) in rules:
                    parent[root(id(producer))] = root(id(node))
        groups: dict[int, list[Node]] = {}
        for node in self.graph.nodes:
            if id(node) in rules:
                groups.setdefault(root(id(node)), []).append(node)
        return [self.priced(nodes) for nodes in groups.values()]

    def priced(self, nodes: list[Node]) -> Region:
        members = {id(n) for n in nodes}
        produced = {o for n in nodes for o in n.outputs if o and layout_tensor(self.graph, o)}
        inputs = list(dict.fromkeys(t for n in nodes for t in _layout_inputs(self.graph, n) if t not in produced))
        outputs = [t for t in produced
                   if t in self.fixed or any(id(r) not in members for r in self.readers.get(t, []))]
        region = Region(nodes, inputs, outputs)
        for t in inputs:
            size = 2 * nbytes(self.graph, t)
            producer = self.producers.get(t)
            readers = self.readers.get(t, [])
            if producer is not None and _is_perm(self.graph, producer, TO_NCHW):
                if t not in self.fixed and all(id(r) in members for r in readers):
                    region.removed += size
            elif not any(_is_perm(self.graph, r, TO_NHWC) for r in readers):
                region.added += size
                region.free_entry = False
        for t in outputs:
            size = 2 * nbytes(self.graph, t)
            outside = [r for r in self.readers.get(t, []) if id(r) not in members]
            into_nhwc = [r for r in outside if _is_perm(self.graph, r, TO_NHWC)]
            region.removed += size * len(into_nhwc)
            if t in self.fixed or any(r not in into_nhwc and not _flat_reader(self.graph, r, t) for r in outside):
                region.added += size
        return region

    def flip(self, region: Region) -> dict[int, list[Node]]:
        """The NHWC nodes of `region`, by the id of the node each replaces (entry Transposes
        before the first, exit Transposes after the last)."""
        ctx = NhwcNames(self.graph)
        entry: list[Node] = []
        for t in region.inputs:
            producer = self.producers.get(t)
            reuse = [r for r in self.readers.get(t, []) if _is_perm(self.graph, r, TO_NHWC)]
            if producer is not None and _is_perm(self.graph, producer, TO_NCHW):
                ctx.names[t] = producer.inputs[0]
            elif reuse:
                ctx.names[t] = reuse[0].outputs[0]
            else:
                ctx.names[t] = self.graph.fresh_name(f"{t}_nhwc")
                entry.append(Node("Transpose", [t], [ctx.names[t]], {"perm": list(TO_NHWC)},
                                  name=self.graph.fresh_name(f"{t}_to_nhwc")))
        replaced = {id(n): layout_rule(self.graph, n).rewrite(ctx, n) for n in region.nodes}
        exits = [Node("Transpose", [ctx.names[t]], [t], {"perm": list(TO_NCHW)}, name=self.graph.fresh_name(f"{t}_to_nchw"))
                 for t in region.outputs]
        replaced[id(region.nodes[0])] = entry + replaced[id(region.nodes[0])]
        replaced[id(region.nodes[-1])] = replaced[id(region.nodes[-1])] + exits
        return replaced


def plan_layouts(graph: Graph, *, keep: frozenset[str] = frozenset()) -> bool:
    """Run every region of layout-free ops NHWC where that moves fewer bytes through reformats (or
    as many, its inputs all NHWC already: module docstring); True if any region flipped."""
    planner = _Planner(graph, protected(graph, keep))
    replaced: dict[int, list[Node]] = {}
    for region in planner.regions():
        if region.removed > region.added or (region.removed == region.added and region.free_entry):
            replaced.update(planner.flip(region))
    if not replaced:
        return False
    graph.nodes = [m for n in graph.nodes for m in replaced.get(id(n), [n])]
    graph.toposort()
    return True

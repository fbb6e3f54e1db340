"""plan_layouts: run each region of layout-free ops NHWC or NCHW, whichever moves fewer bytes.

to_channels_last leaves every NHWC op (ConvNHWC, the NHWC pools) between Transposes, and
cancel_transposes sinks a Transpose one op at a time; that stops at a tensor two ops read
(SiLU's `x * sigmoid(x)`), at ops of several inputs (Concat, the squeeze-excitation scale) and
at ops it has no rule for (BatchNormalization, Pad, Resize, Slice). This pass plans by regions:

1. A *region* is a maximal set of nodes that have an NHWC form (LAYOUT_RULES: elementwise ops,
   Reduce*, Concat, Split, Slice, Gather of a constant 1-D index (a channel shuffle, see
   fold_axis_permutations), Pad, Resize, inference BatchNormalization as a per-channel
   Mul + Add on the last axis, MaxPool / AveragePool / GlobalAveragePool / GlobalMaxPool) on
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
from typing import Callable

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Graph, Node
from polykit.compiler.ops.math.reduce import REDUCE_OPS
from polykit.compiler.ops.nn.channels_last import TO_NCHW, TO_NHWC
from polykit.compiler.passes.cancel_transposes import elementwise, perm_of, reduce_axes
from polykit.compiler.passes.channels_last import nhwc_pool
from polykit.compiler.passes.rewrite import protected

RANK = 4


def nhwc_axis(axis: int) -> int:
    """Where NCHW axis `axis` (negative counts from the end) sits in NHWC."""
    return TO_NCHW[axis % RANK]


def _rank4(graph: Graph, name: str) -> bool:
    shape = graph.value(name).shape
    return shape is not None and len(shape) == RANK


def layout_tensor(graph: Graph, name: str) -> bool:
    """A rank-4 activation whose NHWC form differs from it (not a constant, not one element)."""
    if not name or name in graph.initializers or not _rank4(graph, name):
        return False
    shape = graph.value(name).shape
    return not all(isinstance(d, int) for d in shape) or int(np.prod(shape)) != 1


def nbytes(graph: Graph, name: str) -> int:
    """Bytes of tensor `name` (an unknown dim counts 1: every tensor of a region shares it)."""
    v = graph.value(name)
    size = int(np.prod([d if isinstance(d, int) else 1 for d in v.shape or ()]))
    return size * (v.dtype.itemsize if v.dtype is not None else 4)


class _Flip:
    """Names while a region is rewritten: each NCHW tensor's NHWC name, constants re-laid out."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.names: dict[str, str] = {}
        self.relaid: dict[str, str] = {}

    def nhwc(self, name: str) -> str:
        """What an NHWC node reads for input `name`: its NHWC form (a layout tensor), a constant
        re-laid out (ranked up to 4 first; one-element constants as they are), else `name`."""
        if name in self.names:
            return self.names[name]
        arr = self.graph.initializers.get(name) if name else None
        if arr is None or arr.size == 1:
            return name
        if name not in self.relaid:
            full = arr.reshape((1,) * (RANK - arr.ndim) + arr.shape)
            self.relaid[name] = self.graph.add_initializer(np.ascontiguousarray(np.transpose(full, TO_NHWC)),
                                                           f"{name}_nhwc")
        return self.relaid[name]

    def output(self, name: str) -> str:
        """A fresh name for the NHWC form of output `name` (rank 4) or `name` itself."""
        if not name or not _rank4(self.graph, name):
            return name
        self.names[name] = self.graph.fresh_name(f"{name}_nhwc")
        return self.names[name]

    def ints(self, values, prefix: str) -> str:
        return self.graph.add_initializer(np.array(values, dtype=np.int64), prefix)

    def node(self, node: Node, inputs: list[str], **attrs) -> Node:
        """`node` on NHWC inputs `inputs`, its outputs renamed, `attrs` replacing its own."""
        return Node(node.op_type, inputs, [self.output(o) for o in node.outputs], {**node.attrs, **attrs},
                    name=node.name, domain=node.domain)


@dataclass(frozen=True)
class LayoutRule:
    """An op's NHWC form: `accepts` says whether a node has one (its layout inputs and rank-4
    outputs aside, which the region machinery checks), `rewrite` gives the NHWC nodes."""

    accepts: Callable[[Graph, Node], bool]
    rewrite: Callable[[_Flip, Node], list[Node]]


def _constants(graph: Graph, node: Node, positions: range | tuple[int, ...]) -> bool:
    """Whether the node's inputs at `positions` are absent or constants."""
    return all(not node.input(i) or node.input(i) in graph.initializers for i in positions)


def _elementwise_ok(graph: Graph, node: Node) -> bool:
    return elementwise(graph, node) and all(
        not n or layout_tensor(graph, n) or (n in graph.initializers and graph.initializers[n].ndim <= RANK)
        or (graph.value(n).shape is not None and len(graph.value(n).shape) <= RANK
            and all(d == 1 for d in graph.value(n).shape))
        for n in node.inputs)


def _elementwise(ctx: _Flip, node: Node) -> list[Node]:
    return [ctx.node(node, [ctx.nhwc(n) for n in node.inputs])]


def _kept_order(axes: list[int]) -> bool:
    """Whether the axes a keepdims=0 reduction over NCHW `axes` keeps come in the same order in NHWC
    (then the result is the same tensor either way)."""
    kept = [a for a in TO_NHWC if a not in axes]
    return kept == sorted(kept)


def _reduce_ok(graph: Graph, node: Node) -> bool:
    axes = reduce_axes(graph, node, RANK) if layout_tensor(graph, node.input(0)) else None
    return (axes is not None and len(node.outputs) == 1
            and (bool(node.attrs.get("keepdims", 1)) or _kept_order(axes)))


def _reduce(ctx: _Flip, node: Node) -> list[Node]:
    inputs = [ctx.nhwc(node.input(0))]
    if node.input(1):
        axes = reduce_axes(ctx.graph, node, RANK)
        inputs.append(ctx.ints(sorted(nhwc_axis(a) for a in axes), f"{node.name}_axes"))
    return [ctx.node(node, inputs)]


def _concat_ok(graph: Graph, node: Node) -> bool:
    return all(layout_tensor(graph, n) or (n in graph.initializers and graph.initializers[n].ndim == RANK)
               for n in node.inputs)


def _concat(ctx: _Flip, node: Node) -> list[Node]:
    return [ctx.node(node, [ctx.nhwc(n) for n in node.inputs], axis=nhwc_axis(int(node.attrs.get("axis", 0))))]


def _split(ctx: _Flip, node: Node) -> list[Node]:
    """Split, or a Gather of constant 1-D indices: the same op along the axis's NHWC position."""
    return [ctx.node(node, [ctx.nhwc(node.input(0))] + node.inputs[1:], axis=nhwc_axis(int(node.attrs.get("axis", 0))))]


def _first_is_layout(graph: Graph, node: Node) -> bool:
    return layout_tensor(graph, node.input(0))


def _split_ok(graph: Graph, node: Node) -> bool:
    return _first_is_layout(graph, node) and _constants(graph, node, (1,))


def _slice_ok(graph: Graph, node: Node) -> bool:
    # axes (input 3) constant, or absent with constant starts (then they are the first len(starts))
    return _first_is_layout(graph, node) and (node.input(3) in graph.initializers
                                              or (not node.input(3) and node.input(1) in graph.initializers))


def _slice(ctx: _Flip, node: Node) -> list[Node]:
    init = ctx.graph.initializers
    axes = init[node.input(3)] if node.input(3) else np.arange(init[node.input(1)].size)
    inputs = [ctx.nhwc(node.input(0)), node.input(1), node.input(2),
              ctx.ints([nhwc_axis(int(a)) for a in axes.reshape(-1)], f"{node.name}_axes")] + node.inputs[4:]
    return [ctx.node(node, inputs)]


def _gather_ok(graph: Graph, node: Node) -> bool:
    index = graph.initializers.get(node.input(1))
    return _first_is_layout(graph, node) and index is not None and index.ndim == 1


def _pad_ok(graph: Graph, node: Node) -> bool:
    return _first_is_layout(graph, node) and _constants(graph, node, (1, 3))


def _pad(ctx: _Flip, node: Node) -> list[Node]:
    init = ctx.graph.initializers
    inputs = [ctx.nhwc(node.input(0)), node.input(1), node.input(2), node.input(3)]
    if node.input(3):  # pads follow the listed axes: relabel them
        inputs[3] = ctx.ints([nhwc_axis(int(a)) for a in init[node.input(3)].reshape(-1)], f"{node.name}_axes")
    else:
        pads = [int(p) for p in init[node.input(1)].reshape(-1)]
        inputs[1] = ctx.ints([pads[a] for a in TO_NHWC] + [pads[RANK + a] for a in TO_NHWC], f"{node.name}_pads")
    while not inputs[-1]:
        inputs.pop()
    return [ctx.node(node, inputs)]


def _resize_ok(graph: Graph, node: Node) -> bool:
    return _first_is_layout(graph, node) and _constants(graph, node, (1, 2, 3))


def _resize(ctx: _Flip, node: Node) -> list[Node]:
    if node.attrs.get("axes") is not None:  # roi / scales / sizes follow the listed axes: relabel them
        return [ctx.node(node, [ctx.nhwc(node.input(0))] + node.inputs[1:],
                         axes=[nhwc_axis(int(a)) for a in node.attrs["axes"]])]
    init = ctx.graph.initializers
    inputs = [ctx.nhwc(node.input(0))]
    for i, name in enumerate(node.inputs[1:4], 1):
        arr = init.get(name) if name else None
        if arr is None or arr.size == 0:
            inputs.append(name)
            continue
        flat = arr.reshape(-1)
        order = list(TO_NHWC) + [RANK + a for a in TO_NHWC] if flat.size == 2 * RANK else list(TO_NHWC)
        inputs.append(ctx.graph.add_initializer(np.ascontiguousarray(flat[order]), f"{name}_nhwc"))
    return [ctx.node(node, inputs)]


def _batchnorm_ok(graph: Graph, node: Node) -> bool:
    x = graph.value(node.input(0))
    params = [graph.initializers.get(node.input(i)) for i in range(1, 5)]
    return (_first_is_layout(graph, node) and not node.attrs.get("training_mode", 0)
            and x.dtype is not None and x.dtype.kind == "f" and not any(o for o in node.outputs[1:])
            and all(p is not None and p.ndim == 1 and p.size == x.shape[1] for p in params))


def _batchnorm(ctx: _Flip, node: Node) -> list[Node]:
    """Inference BatchNormalization as x * s + t, s and t per channel on NHWC's last axis."""
    scale, bias, mean, var = (ctx.graph.initializers[node.input(i)].astype(np.float64) for i in range(1, 5))
    dtype = ctx.graph.value(node.input(0)).dtype
    s = scale / np.sqrt(var + float(node.attrs.get("epsilon", 1e-5)))
    scaled = ctx.graph.fresh_name(f"{node.outputs[0]}_scaled")
    mul = Node("Mul", [ctx.nhwc(node.input(0)), ctx.graph.add_initializer(s.astype(dtype), f"{node.name}_scale")],
               [scaled], {}, name=node.name)
    add = Node("Add", [scaled, ctx.graph.add_initializer((bias - mean * s).astype(dtype), f"{node.name}_shift")],
               [ctx.output(node.outputs[0])], {}, name=ctx.graph.fresh_name(f"{node.name}_shift"))
    return [mul, add]


def _pool_ok(graph: Graph, node: Node) -> bool:
    # a MaxPool's Indices output (kept or not) makes it stay: its NHWC form has none
    return (_first_is_layout(graph, node) and not any(node.outputs[1:])
            and nhwc_pool(graph, node, set()) is not None)


def _pool(ctx: _Flip, node: Node) -> list[Node]:
    op, attrs = nhwc_pool(ctx.graph, node, set())
    inputs = [ctx.nhwc(node.input(0))]
    if op.startswith("Reduce"):
        inputs.append(ctx.ints([1, 2], f"{node.name}_axes"))
    return [Node(op, inputs, [ctx.output(node.outputs[0])], attrs, name=node.name,
                 domain="" if op.startswith("Reduce") else POLYKIT_DOMAIN)]


LAYOUT_RULES: dict[str, LayoutRule] = {
    **{op: LayoutRule(_reduce_ok, _reduce) for op in REDUCE_OPS},
    "Concat": LayoutRule(_concat_ok, _concat), "Split": LayoutRule(_split_ok, _split),
    "Slice": LayoutRule(_slice_ok, _slice), "Pad": LayoutRule(_pad_ok, _pad),
    "Gather": LayoutRule(_gather_ok, _split),
    "Resize": LayoutRule(_resize_ok, _resize), "BatchNormalization": LayoutRule(_batchnorm_ok, _batchnorm),
    **{op: LayoutRule(_pool_ok, _pool) for op in ("MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool")},
}
ELEMENTWISE_RULE = LayoutRule(_elementwise_ok, _elementwise)


def layout_rule(graph: Graph, node: Node) -> LayoutRule | None:
    """The rule that runs `node` NHWC, or None (its layout is fixed)."""
    if node.domain != "" or not node.outputs:
        return None
    rule = LAYOUT_RULES.get(node.op_type, ELEMENTWISE_RULE)
    outs_ok = all(not o or _rank4(graph, o) for o in node.outputs) or node.op_type in REDUCE_OPS
    return rule if outs_ok and rule.accepts(graph, node) else None


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
        ctx = _Flip(self.graph)
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

"""The NHWC form of each layout-free op, for plan_layouts: which nodes have one and what they become.

A node has an NHWC form when it computes the same on tensors transposed by (0, 2, 3, 1) once its
attributes and constant operands are relabelled: elementwise ops (constants re-laid out), Reduce*
(axes), Concat / Split / Slice / Gather of a constant 1-D index (axis), Pad (pads), Resize (roi,
scales, sizes), inference BatchNormalization (a per-channel Mul + Add on the last axis),
GroupNormalization / InstanceNormalization of a float tensor (ai.polykit GroupNormNHWC: statistics
per group of channels, whichever axis holds them) and the pools (their NHWC ops). Axis `a` of an
NCHW tensor is axis `TO_NCHW[a]` of its NHWC form.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Graph, Node
from polykit.compiler.ops.math.reduce import REDUCE_OPS
from polykit.compiler.ops.nn.group_norm_nhwc import CHANNEL_NORMS, FLOATS, group_norm_nhwc
from polykit.compiler.ops.nn.channels_last import TO_NCHW, TO_NHWC
from polykit.compiler.passes.cancel_transposes import elementwise, reduce_axes
from polykit.compiler.passes.channels_last import nhwc_pool

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


class NhwcNames:
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
    rewrite: Callable[[NhwcNames, Node], list[Node]]


def _constants(graph: Graph, node: Node, positions: range | tuple[int, ...]) -> bool:
    """Whether the node's inputs at `positions` are absent or constants."""
    return all(not node.input(i) or node.input(i) in graph.initializers for i in positions)


def _elementwise_ok(graph: Graph, node: Node) -> bool:
    return elementwise(graph, node) and all(
        not n or layout_tensor(graph, n) or (n in graph.initializers and graph.initializers[n].ndim <= RANK)
        or (graph.value(n).shape is not None and len(graph.value(n).shape) <= RANK
            and all(d == 1 for d in graph.value(n).shape))
        for n in node.inputs)


def _elementwise(ctx: NhwcNames, node: Node) -> list[Node]:
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


def _reduce(ctx: NhwcNames, node: Node) -> list[Node]:
    inputs = [ctx.nhwc(node.input(0))]
    if node.input(1):
        axes = reduce_axes(ctx.graph, node, RANK)
        inputs.append(ctx.ints(sorted(nhwc_axis(a) for a in axes), f"{node.name}_axes"))
    return [ctx.node(node, inputs)]


def _concat_ok(graph: Graph, node: Node) -> bool:
    return all(layout_tensor(graph, n) or (n in graph.initializers and graph.initializers[n].ndim == RANK)
               for n in node.inputs)


def _concat(ctx: NhwcNames, node: Node) -> list[Node]:
    return [ctx.node(node, [ctx.nhwc(n) for n in node.inputs], axis=nhwc_axis(int(node.attrs.get("axis", 0))))]


def _split(ctx: NhwcNames, node: Node) -> list[Node]:
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


def _slice(ctx: NhwcNames, node: Node) -> list[Node]:
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


def _pad(ctx: NhwcNames, node: Node) -> list[Node]:
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


def _resize(ctx: NhwcNames, node: Node) -> list[Node]:
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


def _batchnorm(ctx: NhwcNames, node: Node) -> list[Node]:
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


def _channel_norm_ok(graph: Graph, node: Node) -> bool:
    x = graph.value(node.input(0))
    return (_first_is_layout(graph, node) and x.dtype is not None and x.dtype.name in FLOATS
            and isinstance(x.shape[1], int) and len(node.outputs) == 1)


def _channel_norm(ctx: NhwcNames, node: Node) -> list[Node]:
    channels = ctx.graph.value(node.input(0)).shape[1]
    return [group_norm_nhwc(node, ctx.nhwc(node.input(0)), ctx.output(node.outputs[0]), channels)]


def _pool_ok(graph: Graph, node: Node) -> bool:
    # a MaxPool's Indices output (kept or not) makes it stay: its NHWC form has none
    return (_first_is_layout(graph, node) and not any(node.outputs[1:])
            and nhwc_pool(graph, node, set()) is not None)


def _pool(ctx: NhwcNames, node: Node) -> list[Node]:
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
    **{op: LayoutRule(_channel_norm_ok, _channel_norm) for op in CHANNEL_NORMS},
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

"""recognize_groupnorm: turn the exported group-norm chain back into one normalization node.

PyTorch exports GroupNorm(G, C) (and wav2vec2's GroupNorm(512, 512)) as

    r = Reshape(x, [N | 0, G, -1])          x [N, C, ...] (rank >= 3, C static, C % G == 0)
    n = InstanceNormalization(r, s, b)      s, b constants [G] (ones and zeros from torch)
    y = Reshape(n, x's shape) [* gamma] [+ beta]    gamma, beta constants per channel

which is GroupNormalization(x, scale, bias, num_groups=G) with per-channel scale = s[g] * gamma[c]
and bias = b[g] * gamma[c] + beta[c] (opset 21's form: InstanceNormalization when G == C, whose
identity Reshapes the cleanup has removed by then: an InstanceNormalization followed by a
per-channel Mul / Add takes them into its scale and bias). One
normalization layer instead of an InstanceNormalization, two Reshapes and the affine's
elementwise ops, and a node whose channels-last form (GroupNormNHWC) the layout passes know. Every
intermediate must be read only by the next step and be neither a graph output nor kept.
"""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir.graph import Graph, Node
from polykit.compiler.passes.rewrite import const, protected, sole_reader


def _per_channel(graph: Graph, name: str, rank: int, channels: int) -> np.ndarray | None:
    """A constant that broadcasts against [N, C, ...] along the channels only, as [C] float64."""
    value = const(graph, name)
    if value is None or value.ndim > rank or value.dtype.kind != "f":
        return None
    full = value.reshape((1,) * (rank - value.ndim) + value.shape)
    if any(d != 1 for i, d in enumerate(full.shape) if i != 1) or full.shape[1] not in (1, channels):
        return None
    return np.broadcast_to(full.reshape(-1).astype(np.float64), (channels,))


def _groups(graph: Graph, reshape: Node, shape: tuple) -> int | None:
    """G when `reshape` views x [N, C, ...] as [N, G, rest] (target [0 | N, G, -1 | rest])."""
    target = const(graph, reshape.input(1))
    if target is None or target.ndim != 1 or target.size != 3 or int(reshape.attrs.get("allowzero", 0)):
        return None
    n, groups, rest = (int(v) for v in target)
    c, spatial = shape[1], int(np.prod(shape[2:]))
    if n not in (0, shape[0]) or groups < 1 or c % groups or rest not in (-1, c // groups * spatial):
        return None
    return groups


def _grouped(graph: Graph, norm: Node, producers, readers, fixed: set[str]):
    """(x, G, [Reshape, norm, Reshape]) when `norm` normalizes x [N, C, ...] viewed [N, G, rest]."""
    reshape = producers.get(norm.input(0))
    if reshape is None or reshape.op_type != "Reshape" or reshape.domain != "":
        return None
    x = reshape.input(0)
    shape = graph.value(x).shape
    if shape is None or len(shape) < 3 or not all(isinstance(d, int) for d in shape) \
            or sole_reader(graph, reshape.outputs[0], readers, fixed) is not norm:
        return None
    groups = _groups(graph, reshape, shape)
    back = sole_reader(graph, norm.outputs[0], readers, fixed)
    if groups is None or back is None or back.op_type != "Reshape" or back.domain != "" \
            or back.input(0) != norm.outputs[0] or graph.value(back.outputs[0]).shape != tuple(shape):
        return None
    return x, groups, [reshape, norm, back]


def _chain(graph: Graph, norm: Node, producers, readers, fixed: set[str]):
    """(x, G, the nodes the chain replaces, its last output, per-channel scale, bias) or None. Without
    the Reshapes (G == C: cleanup removed them as identities) the norm itself, when an affine follows."""
    if norm.domain != "":
        return None
    grouped = _grouped(graph, norm, producers, readers, fixed)
    x, groups, nodes = grouped if grouped is not None else (norm.input(0), None, [norm])
    xv = graph.value(x)
    shape = xv.shape
    if shape is None or len(shape) < 3 or not isinstance(shape[1], int) or xv.dtype is None or xv.dtype.kind != "f":
        return None
    c = shape[1]
    groups = c if groups is None else groups
    s, b = const(graph, norm.input(1)), const(graph, norm.input(2))
    if s is None or b is None or s.size != groups or b.size != groups:
        return None
    per = c // groups
    scale = np.repeat(s.astype(np.float64).reshape(-1), per)
    bias = np.repeat(b.astype(np.float64).reshape(-1), per)
    out = nodes[-1].outputs[0]
    for op in ("Mul", "Add"):
        nxt = sole_reader(graph, out, readers, fixed)
        if nxt is None or nxt.op_type != op or nxt.domain != "" or len(nxt.inputs) != 2:
            continue
        other = nxt.inputs[1] if nxt.inputs[0] == out else nxt.inputs[0]
        param = _per_channel(graph, other, len(shape), c) if other != out else None
        if param is None or graph.value(nxt.outputs[0]).shape != graph.value(out).shape:
            continue
        if op == "Mul":
            scale, bias = scale * param, bias * param
        else:
            bias = bias + param
        nodes.append(nxt)
        out = nxt.outputs[0]
    if len(nodes) == 1:
        return None
    return x, groups, nodes, out, scale.astype(xv.dtype), bias.astype(xv.dtype)


def recognize_groupnorm(graph: Graph, *, keep: frozenset[str] = frozenset()) -> bool:
    """Replace exported group-norm chains (module docstring) by GroupNormalization (InstanceNormalization
    when every channel is its own group); True if any."""
    fixed = protected(graph, keep)
    producers, readers = graph.producers(), graph.consumers()
    replaced: dict[int, Node] = {}
    dead: set[int] = set()
    for norm in [n for n in graph.nodes if n.op_type == "InstanceNormalization"]:
        chain = _chain(graph, norm, producers, readers, fixed)
        if chain is None:
            continue
        x, groups, nodes, out, scale, bias = chain
        channels = graph.value(x).shape[1]
        inputs = [x, graph.add_initializer(scale, f"{norm.name}_gn_scale"),
                  graph.add_initializer(bias, f"{norm.name}_gn_bias")]
        eps = float(norm.attrs.get("epsilon", 1e-5))
        if groups == channels:
            new = Node("InstanceNormalization", inputs, [out], {"epsilon": eps}, name=norm.name)
        else:
            new = Node("GroupNormalization", inputs, [out], {"num_groups": groups, "epsilon": eps}, name=norm.name)
        replaced[id(nodes[-1])] = new
        dead.update(id(n) for n in nodes[:-1])
    if not replaced:
        return False
    graph.nodes = [replaced.get(id(n), n) for n in graph.nodes if id(n) not in dead]
    graph.toposort()
    return True

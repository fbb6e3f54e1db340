"""recognize_layernorm: turn the exported layer-norm chain back into ONNX LayerNormalization.

    mean = ReduceMean(x, axes)          d = x - mean
    var  = ReduceMean(d^2 | d*d, axes)  n = d / Sqrt(var + eps)   (or d * Reciprocal(Sqrt(..)))
    y = n [* gamma] [+ beta]

as PyTorch and TF export it, over trailing axes (keepdims=1). gamma/beta must be constants
(broadcastable to the normalized shape) or tensors of exactly the normalized shape.
Every intermediate must be read only inside the pattern.
"""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir import Graph, Node
from polykit.compiler.passes.rewrite import const, protected, scalar, sole_reader
from polykit.compiler.registry import is_supported


def _axes(graph: Graph, node: Node, rank: int) -> tuple[int, ...] | None:
    if node.op_type != "ReduceMean" or node.domain != "" or int(node.attrs.get("keepdims", 1)) != 1:
        return None
    axes = const(graph, node.input(1)) if node.input(1) else node.attrs.get("axes")
    if axes is None:
        return None
    axes = sorted(int(a) % rank for a in np.asarray(axes).reshape(-1))
    return tuple(axes) if axes and axes == list(range(rank - len(axes), rank)) else None


def _other(node: Node, name: str) -> str | None:
    if len(node.inputs) != 2 or name not in node.inputs:
        return None
    return node.inputs[1] if node.inputs[0] == name else node.inputs[0]


class _Chain:
    """Walks one candidate pattern from its first ReduceMean."""

    def __init__(self, graph: Graph, fixed: set[str], readers: dict[str, list[Node]]):
        self.graph, self.fixed, self.readers = graph, fixed, readers
        self.nodes: list[Node] = []

    def next(self, name: str, op: str) -> Node | None:
        node = sole_reader(self.graph, name, self.readers, self.fixed)
        if node is None or node.op_type != op or node.domain != "":
            return None
        self.nodes.append(node)
        return node

    def param(self, other: str, norm_shape: tuple, dtype) -> tuple[bool, np.ndarray | None]:
        """(usable, constant value broadcast to the normalized shape) for a gamma/beta operand."""
        value = const(self.graph, other)
        if value is None:
            return tuple(self.graph.value(other).shape or ()) == norm_shape, None
        lead = value.ndim - len(norm_shape)
        if lead > 0 and all(d == 1 for d in value.shape[:lead]):
            value = value.reshape(value.shape[lead:])
        try:
            if value.ndim > len(norm_shape) or np.broadcast_shapes(value.shape, norm_shape) != norm_shape:
                return False, None
        except ValueError:
            return False, None
        return True, np.broadcast_to(value, norm_shape).astype(dtype)

    def affine(self, name: str, op: str, norm_shape: tuple, dtype) -> tuple[str, str, np.ndarray | None] | None:
        """(operand name, new output, constant value) for `name * gamma` / `name + beta`."""
        users = self.readers.get(name, [])
        if name in self.fixed or len(users) != 1 or users[0].op_type != op or users[0].domain != "":
            return None
        other = _other(users[0], name)
        if other is None or other == name:
            return None
        usable, value = self.param(other, norm_shape, dtype)
        if not usable:
            return None
        self.nodes.append(users[0])
        return other, users[0].outputs[0], value


def recognize_layernorm(graph: Graph, *, keep: frozenset[str] = frozenset()) -> bool:
    """Replace layer-norm chains by LayerNormalization nodes; True if any."""
    if not is_supported("", "LayerNormalization"):
        return False
    fixed = protected(graph, keep)
    readers = graph.consumers()
    replaced: dict[int, Node] = {}
    dead: list[Node] = []
    for mean in graph.nodes:
        if mean.op_type != "ReduceMean" or id(mean) in replaced or any(mean is d for d in dead):
            continue
        found = _match(graph, mean, fixed, readers) or _match_tf(graph, mean, fixed, readers)
        if found is not None:
            nodes, new = found
            replaced[id(nodes[-1])] = new
            dead.extend(nodes[:-1])
    if not replaced:
        return False
    graph.nodes = [replaced.get(id(n), n) for n in graph.nodes]
    graph.remove_nodes(dead)
    return True


def _match(graph: Graph, mean: Node, fixed: set[str], readers: dict[str, list[Node]]) -> tuple[list[Node], Node] | None:
    x = mean.input(0)
    xv = graph.value(x)
    if xv.shape is None or xv.dtype is None:
        return None
    rank = len(xv.shape)
    axes = _axes(graph, mean, rank)
    chain = _Chain(graph, fixed, readers)
    chain.nodes.append(mean)
    sub = chain.next(mean.outputs[0], "Sub") if axes else None
    if sub is None or sub.inputs != [x, mean.outputs[0]]:
        return None
    d = sub.outputs[0]
    users = readers.get(d, [])
    if d in fixed or len(users) != 2:
        return None
    square = next((u for u in users if _is_square(graph, u, d)), None)
    divide = next((u for u in users if u is not square), None)
    if square is None or divide is None:
        return None
    chain.nodes.append(square)
    var = chain.next(square.outputs[0], "ReduceMean")
    if var is None or _axes(graph, var, rank) != axes:
        return None
    add = chain.next(var.outputs[0], "Add")
    eps = None if add is None else scalar(graph, _other(add, var.outputs[0]) or "")
    std = chain.next(add.outputs[0], "Sqrt") if eps is not None else None
    if std is None:
        return None
    normalized = _divided(chain, divide, d, std.outputs[0])
    if normalized is None:
        return None
    norm_shape = tuple(xv.shape[rank - len(axes):])
    out = normalized
    gamma = chain.affine(out, "Mul", norm_shape, xv.dtype)
    if gamma is not None:
        out = gamma[1]
    beta = chain.affine(out, "Add", norm_shape, xv.dtype)
    if beta is not None:
        out = beta[1]
    if gamma is None and not all(isinstance(k, int) for k in norm_shape):
        return None
    scale = _input(graph, gamma, np.ones(norm_shape, xv.dtype), "ln_scale")
    inputs = [x, scale] + ([_input(graph, beta, None, "ln_bias")] if beta is not None else [])
    node = Node("LayerNormalization", inputs, [out], {"axis": -len(axes), "epsilon": float(eps)},
                name=f"{mean.name}_layernorm")
    return chain.nodes, node


def _is_square(graph: Graph, node: Node, d: str) -> bool:
    if node.domain != "":
        return False
    if node.op_type == "Mul":
        return node.inputs == [d, d]
    return node.op_type == "Pow" and node.input(0) == d and scalar(graph, node.input(1)) == 2.0


def _divided(chain: _Chain, divide: Node, d: str, std: str) -> str | None:
    """Output of d / std or d * Reciprocal(std), with the nodes added to the chain."""
    if divide.domain != "":
        return None
    if divide.op_type == "Div" and divide.inputs == [d, std]:
        if chain.next(std, "Div") is not divide:
            return None
        return divide.outputs[0]
    recip = chain.next(std, "Reciprocal")
    if recip is None or divide.op_type != "Mul" or _other(divide, d) != recip.outputs[0]:
        return None
    if chain.next(recip.outputs[0], "Mul") is not divide:
        return None
    return divide.outputs[0]


def _input(graph: Graph, found: tuple[str, str, np.ndarray | None] | None, default: np.ndarray | None,
           prefix: str) -> str:
    if found is None:
        return graph.add_initializer(default, prefix)
    name, _, value = found
    return name if value is None else graph.add_initializer(value, prefix)


def _match_tf(graph: Graph, mean: Node, fixed: set[str], readers: dict[str, list[Node]]) -> tuple[list[Node], Node] | None:
    """TF's form: r = Reciprocal(Sqrt(var + eps)) [* gamma]; y = x * r + (beta - mean * r)."""
    x = mean.input(0)
    xv = graph.value(x)
    if xv.shape is None or xv.dtype is None or mean.outputs[0] in fixed:
        return None
    rank = len(xv.shape)
    axes = _axes(graph, mean, rank)
    users = readers.get(mean.outputs[0], [])
    if not axes or len(users) != 2:
        return None
    sub = next((u for u in users if u.op_type == "Sub" and u.inputs == [x, mean.outputs[0]]), None)
    mean_mul = next((u for u in users if u.op_type == "Mul" and u is not sub), None)
    if sub is None or mean_mul is None:
        return None
    chain = _Chain(graph, fixed, readers)
    chain.nodes += [mean, sub]
    square = sole_reader(graph, sub.outputs[0], readers, fixed)
    if square is None or not _is_square(graph, square, sub.outputs[0]):
        return None
    chain.nodes.append(square)
    var = chain.next(square.outputs[0], "ReduceMean")
    add = chain.next(var.outputs[0], "Add") if var is not None and _axes(graph, var, rank) == axes else None
    eps = None if add is None else scalar(graph, _other(add, var.outputs[0]) or "")
    std = chain.next(add.outputs[0], "Sqrt") if eps is not None else None
    recip = chain.next(std.outputs[0], "Reciprocal") if std is not None else None
    if recip is None:
        return None
    norm_shape = tuple(xv.shape[rank - len(axes):])
    gamma = chain.affine(recip.outputs[0], "Mul", norm_shape, xv.dtype)
    r = recip.outputs[0] if gamma is None else gamma[1]
    r_users = readers.get(r, [])
    x_mul = next((u for u in r_users if u.op_type == "Mul" and _other(u, r) == x), None)
    if r in fixed or len(r_users) != 2 or x_mul is None or mean_mul not in r_users or _other(mean_mul, r) != mean.outputs[0]:
        return None
    beta_sub = sole_reader(graph, mean_mul.outputs[0], readers, fixed)
    if beta_sub is None or beta_sub.op_type != "Sub" or beta_sub.input(1) != mean_mul.outputs[0]:
        return None
    usable, beta_value = chain.param(beta_sub.input(0), norm_shape, xv.dtype)
    out = sole_reader(graph, x_mul.outputs[0], readers, fixed)
    if not usable or out is None or out.op_type != "Add" or _other(out, x_mul.outputs[0]) != beta_sub.outputs[0]:
        return None
    if sole_reader(graph, beta_sub.outputs[0], readers, fixed) is not out:
        return None
    if gamma is None and not all(isinstance(k, int) for k in norm_shape):
        return None
    chain.nodes += [mean_mul, x_mul, beta_sub, out]
    scale = _input(graph, gamma, np.ones(norm_shape, xv.dtype), "ln_scale")
    bias = _input(graph, (beta_sub.input(0), "", beta_value), None, "ln_bias")
    node = Node("LayerNormalization", [x, scale, bias], [out.outputs[0]], {"axis": -len(axes), "epsilon": float(eps)},
                name=f"{mean.name}_layernorm")
    return chain.nodes, node

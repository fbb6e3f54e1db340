"""The tensor-parallel rules of polykit.compiler.builder.distributed, one per ONNX op.

A rule `fn(p, node) -> bool` emits the node's rank-local form through the Partitioner `p` and
says True, or emits nothing and says False (the node then runs on whole inputs). Tensors split on
an axis are named ("split", axis); a partial tensor is ("partial",), a summand of the whole.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from polykit.compiler.ir.graph import Node
from polykit.compiler.ops.elementwise_table import elementwise_op

Rule = Callable[["object", Node], bool]
RULES: dict[str, Rule] = {}


def rule(*ops: str) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        for op in ops:
            RULES[op] = fn
        return fn
    return register


def _split_axis(p, name: str) -> int | None:
    st = p.of(name)
    return st[1] if st is not None and st[0] == "split" else None


def _weight_2d(p, name: str) -> bool:
    return p.is_weight(name) and p.initializers[name].ndim == 2 and p.initializers[name].dtype.kind == "f"


@rule("MatMul")
def _matmul(p, node: Node) -> bool:
    a, b = node.inputs
    if _weight_2d(p, b):
        rank_a = len(p.shape(a))
        if _split_axis(p, a) == rank_a - 1 and p.shape(b)[0] % p.ranks == 0:  # row-parallel
            p.emit(node, [p.local[a], p.split(b, 0)], [("partial",)])
            return True
        if p.shape(b)[1] % p.ranks == 0 and node.name not in p.veto:  # column-parallel
            p.emit(node, [p.replicated(a), p.split(b, 1)], [("split", len(p.shape(node.outputs[0])) - 1)], True)
            return True
        return False
    return _batched(p, node)


def _batched(p, node: Node) -> bool:
    """A MatMul of activations split on one batch axis (attention heads): the batch stays split."""
    out_rank = len(p.shape(node.outputs[0]))
    if out_rank < 3:
        return False
    axes = {i: _split_axis(p, n) for i, n in enumerate(node.inputs)}
    aligned = {i: ax + out_rank - len(p.shape(node.inputs[i])) for i, ax in axes.items() if ax is not None}
    if not aligned or len(set(aligned.values())) != 1:
        return False
    axis = next(iter(aligned.values()))
    if axis >= out_rank - 2:
        return False
    return _elementwise_inputs(p, node, axis, [("split", axis)])


def _elementwise_inputs(p, node: Node, axis: int, states: list) -> bool:
    """Emit `node` with every input split on output axis `axis` (inputs broadcast along it kept)."""
    out_rank = len(p.shape(node.outputs[0]))
    inputs = []
    for name in node.inputs:
        if not name:
            inputs.append(name)
            continue
        shape = p.shape(name)
        local_axis = axis - (out_rank - len(shape))
        if local_axis < 0 or shape[local_axis] == 1:
            inputs.append(p.replicated(name))
            continue
        chunk = p.split(name, local_axis)
        if chunk is None:
            return False
        inputs.append(chunk)
    p.emit(node, inputs, states)
    return True


@rule("Gemm")
def _gemm(p, node: Node) -> bool:
    a, b = node.inputs[0], node.inputs[1]
    c = node.input(2)
    if node.attrs.get("transA", 0) or not _weight_2d(p, b):
        return False
    trans_b = int(node.attrs.get("transB", 0))
    k_axis, n_axis = (1, 0) if trans_b else (0, 1)
    if _split_axis(p, a) == 1 and p.shape(b)[k_axis] % p.ranks == 0:  # row-parallel; the bias after the sum
        partial = Node("Gemm", [a, b], [p.src.fresh_name(f"{node.outputs[0]}__partial")],
                       {k: v for k, v in node.attrs.items() if k != "beta"}, node.name)
        p.emit(partial, [p.local[a], p.split(b, k_axis)], [("partial",)])
        if not c:
            p.local[node.outputs[0]], p.state[node.outputs[0]] = p.local[partial.outputs[0]], ("partial",)
            return True
        return _bias_once(p, node, p.replicated(partial.outputs[0]), float(node.attrs.get("beta", 1.0)))
    if p.shape(b)[n_axis] % p.ranks or node.name in p.veto:
        return False
    inputs = [p.replicated(a), p.split(b, n_axis)]
    if c:
        c_shape = p.shape(c)
        inputs.append(p.replicated(c) if not c_shape or c_shape[-1] == 1 else p.split(c, len(c_shape) - 1))
        if inputs[-1] is None:
            return False
    p.emit(node, inputs, [("split", 1)], True)
    return True


def _bias_once(p, node: Node, summed: str, beta: float) -> bool:
    """A row-parallel Gemm's output: its all-reduced product plus beta * C, added once."""
    bias = p.replicated(node.inputs[2])
    if beta != 1.0:
        scaled = p.src.fresh_name(f"{node.outputs[0]}__scaled_bias")
        beta_c = p.constant(np.asarray(beta, dtype=p.src.value(node.inputs[2]).dtype), f"{node.name}__beta")
        p.emit(Node("Mul", [bias, beta_c], [scaled], {}, f"{node.name}__beta_mul"), [bias, beta_c], [None])
        bias = scaled
    p.emit(Node("Add", [summed, bias], [node.outputs[0]], {}, f"{node.name}__bias"), [summed, bias], [None])
    return True


def _generic_elementwise(p, node: Node) -> bool:
    """Elementwise ops keep a split when their split inputs agree on the (output) axis."""
    out_rank = len(p.shape(node.outputs[0]))
    axes = {_split_axis(p, n) + out_rank - len(p.shape(n)) for n in node.inputs if n and _split_axis(p, n) is not None}
    if len(axes) != 1 or any(p.of(n) == ("partial",) for n in node.inputs if n):
        return False
    axis = axes.pop()
    return _elementwise_inputs(p, node, axis, [("split", axis)] * len(node.outputs))


@rule("Identity", "Dropout")
def _passthrough(p, node: Node) -> bool:
    st = p.of(node.inputs[0])
    if st is None or len([o for o in node.outputs if o]) != 1:
        return False
    p.emit(node, [p.local[node.inputs[0]]] + [p.replicated(i) for i in node.inputs[1:]], [st])
    return True


@rule("Transpose")
def _transpose(p, node: Node) -> bool:
    st = p.of(node.inputs[0])
    if st is None:
        return False
    perm = node.attrs.get("perm") or list(reversed(range(len(p.shape(node.inputs[0])))))
    out = st if st[0] == "partial" else ("split", list(perm).index(st[1]))
    p.emit(node, [p.local[node.inputs[0]]], [out])
    return True


@rule("Reshape")
def _reshape(p, node: Node) -> bool:
    x = node.inputs[0]
    st = p.of(x)
    if st is None:
        return False
    if st[0] == "partial":
        p.emit(node, [p.local[x], p.replicated(node.inputs[1])], [st])
        return True
    full_in, full_out = p.shape(x), p.shape(node.outputs[0])
    prefix = math.prod(full_in[:st[1]])
    for b in range(len(full_out)):
        if math.prod(full_out[:b]) == prefix and full_out[b] > 1:
            if full_out[b] % p.ranks:
                return False
            local = list(full_out)
            local[b] //= p.ranks  # e.g. the head count of an attention split
            shape = p.constant(np.asarray(local, np.int64), f"{node.inputs[1] or node.name}__local")
            p.emit(node, [p.local[x], shape], [("split", b)])
            return True
    return False


def _normalizing(axis_attr: str, default: int, whole_tail: bool) -> Rule:
    """Softmax-like ops (whole_tail False: one axis) and LayerNormalization (the axes from it on)."""
    def fn(p, node: Node) -> bool:
        x = node.inputs[0]
        split = _split_axis(p, x)
        if split is None:
            return False
        rank = len(p.shape(x))
        axis = int(node.attrs.get(axis_attr, default)) % rank
        if split == axis or (whole_tail and split >= axis) or len([o for o in node.outputs if o]) != 1:
            return False
        p.emit(node, [p.local[x]] + [p.replicated(i) for i in node.inputs[1:]],
               [("split", split)] + [None] * (len(node.outputs) - 1))
        return True
    return fn


RULES["Softmax"] = RULES["LogSoftmax"] = _normalizing("axis", -1, False)
RULES["LayerNormalization"] = _normalizing("axis", -1, True)


@rule("Gather")
def _gather(p, node: Node) -> bool:
    """An embedding lookup: the table's columns split, the looked-up rows all-gathered at once (a
    residual stream that stayed split would be gathered again before every normalization)."""
    table, ids = node.inputs
    if int(node.attrs.get("axis", 0)) != 0 or not _weight_2d(p, table) or p.of(ids) is not None:
        return False
    if p.shape(table)[1] % p.ranks:
        return False
    out = node.outputs[0]
    p.emit(node, [p.split(table, 1), p.replicated(ids)], [("split", len(p.shape(out)) - 1)])
    p.local[out] = p.replicated(out)
    del p.state[out]
    return True


def rule_for(node: Node) -> Rule | None:
    """The node's rule: its op's own, else the generic one of the elementwise table's ops."""
    if node.domain != "":
        return None
    return RULES.get(node.op_type) or (_generic_elementwise if elementwise_op(node.op_type) else None)

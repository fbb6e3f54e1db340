"""pack_quantized_gemms: pack_gemms for FP8 layers. Sibling FP8 `QMatMul`s (docs/INT8.md "FP8") that read
the SAME float8_e4m3fn activation with constant [K, N] weights of one K become one QMatMul whose weight,
per-channel scale (`x_scale · w_scale · alpha`, a per-tensor one repeated over its member's columns), weight
zero points and bias are theirs concatenated along N; a Split along the last axis gives each former output
back under its name. BERT's Q, K and V projections are such a group: one N = 2304 FP8 GEMM instead of three
N = 768 ones, whose Split the attention reads as strided views (fold_attention_layouts), as the fp16 plan's
packed MatMul.

Exact: each output column is computed by the same operations as in its member, `fl(fl(acc) · scale[c]) +
B[c]` then the same requantization (the accumulator is the same sum of the same products: bit for bit on
the cpu target, whose FP8 sum is exact; a GPU tile sums in its own order either way). A member's epilogue
may be only its bias (one `Add` of a constant along the last axis, as a Linear's export writes it), which
moves into the B slot: `fl(v + b)` either way. Members pack only when all have a bias or none has
(a zero bias would turn a -0 output into +0), and when they share the X zero point, the output type and
the requantization (Y_scale, Y_zero_point) or its absence. X must have a static shape (the FP8 GEMM
tactics take static rows: channels_last's 1x1-conv form). Gated pairs stay apart (pack_gemms.ungated), and
so does a member whose output is a graph output or kept. The packed layer's `fused_from` lists the
members' own. INT8 QMatMuls are left as they are (their plans were not measured packed).

Runs right after pack_gemms (explicit Q/DQ models: fold_qdq ran first) and after the implicit path's
fold_qdq (`--fp8`), before recognize_attention / fold_attention_layouts see the projections.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Graph, Node
from polykit.compiler.ops.quant.int8 import FP8
from polykit.compiler.passes.pack_gemms import MIN_MEMBERS, column_split, ungated
from polykit.compiler.passes.rewrite import const, protected

KIND = "QMatMul"
#: QMatMul's slots (docs/INT8.md): X, X_zero_point, W, W_zero_point, scale, B, Y_scale, Y_zero_point
X, XZ, W, WZ, SCALE, BIAS, YS, YZ = range(8)


@dataclass
class _Member:
    node: Node
    n: int
    weight: np.ndarray  # [K, N] e4m3
    w_zero: np.ndarray  # [N]
    scale: np.ndarray  # [N] float32
    bias: np.ndarray | None  # [N] float32 (the B slot, or the bias Add of the epilogue)
    output: str


def pack_quantized_gemms(graph: Graph, *, keep: frozenset[str] = frozenset(), skip: tuple[str, ...] = ()) -> bool:
    """Pack each group of sibling FP8 QMatMuls into one QMatMul + Split; True if any was packed. A member
    named in `skip`, or a group whose packed layer would be (`<first member>_packed`: the builder names the
    layers no tactic of the target runs there), stays as it is."""
    if FP8 is None:
        return False
    fixed = protected(graph, keep)
    readers = graph.consumers()
    groups: dict[tuple, list[_Member]] = {}
    for node in graph.nodes:
        member = _member(graph, node, fixed) if node.name not in skip else None
        if member is not None:
            groups.setdefault(_key(graph, member), []).append(member)
    changed = False
    for members in groups.values():
        members = ungated(graph, members, readers)
        if len(members) >= MIN_MEMBERS and packed_name(members[0].node) not in skip:
            _pack(graph, members)
            changed = True
    return changed


def _member(graph: Graph, node: Node, fixed: set[str]) -> _Member | None:
    if node.op_type != KIND or node.domain != POLYKIT_DOMAIN or len(node.outputs) != 1 or node.outputs[0] in fixed:
        return None
    x = graph.value(node.input(X))
    weight, w_zero, scale = (const(graph, node.input(i)) for i in (W, WZ, SCALE))
    if x.dtype != FP8 or not x.is_static or len(x.shape) < 2 or node.input(X) in graph.initializers \
            or weight is None or weight.ndim != 2 or weight.dtype != FP8 or x.shape[-1] != weight.shape[0] \
            or w_zero is None or scale is None:
        return None
    n = int(weight.shape[1])
    if w_zero.size not in (1, n) or scale.size not in (1, n) or const(graph, node.input(XZ)) is None \
            or any(node.input(i) and const(graph, node.input(i)) is None for i in (BIAS, YS, YZ)):
        return None
    bias = const(graph, node.input(BIAS)) if node.input(BIAS) else None
    if bias is not None and bias.size not in (1, n):
        return None
    epilogue = node.attrs.get("epilogue")
    if epilogue is not None:
        if bias is not None:
            return None
        bias = _bias_step(graph, node, epilogue, n)
        if bias is None:
            return None
    elif len(node.inputs) > YZ + 1:
        return None
    return _Member(node, n, weight, np.broadcast_to(w_zero.reshape(-1), (n,)),
                   np.broadcast_to(scale.reshape(-1), (n,)).astype(np.float32),
                   None if bias is None else np.broadcast_to(bias.reshape(-1), (n,)).astype(np.float32),
                   node.outputs[0])


def _bias_step(graph: Graph, node: Node, epilogue: dict, n: int) -> np.ndarray | None:
    """The [N] float32 constant of an epilogue that is one Add of the product and it, or None."""
    body = epilogue.get("body") or []
    if len(body) != 1 or body[0]["op"] != "Add" or body[0].get("attrs") or len(body[0]["inputs"]) != 2 \
            or len(node.inputs) != YZ + 2 or epilogue.get("input") not in body[0]["inputs"]:
        return None
    step = body[0]
    other = next((i for i in step["inputs"] if i != epilogue["input"]), None)
    value = const(graph, other) if other == node.inputs[-1] else None
    if value is None or value.dtype != np.float32 or value.ndim < 1 or value.shape[-1] != n \
            or any(d != 1 for d in value.shape[:-1]) or value.ndim > len(graph.value(node.input(X)).shape):
        return None
    if node.input(YS):  # requantized: the step writes a body-local value; else the layer's output
        return value.reshape(n)
    return value.reshape(n) if step["outputs"] == [node.outputs[0]] else None


def _key(graph: Graph, member: _Member) -> tuple:
    node = member.node

    def data(i: int) -> tuple:
        value = const(graph, node.input(i)) if node.input(i) else None
        return (None,) if value is None else (value.dtype.str, value.reshape(-1).tobytes())

    out = graph.value(node.outputs[0])
    return (node.input(X), data(XZ), int(member.weight.shape[0]), member.bias is not None, data(YS), data(YZ),
            len(out.shape or ()), str(out.dtype))


def packed_name(first: Node) -> str:
    return f"{first.name or first.outputs[0]}_packed"


def _pack(graph: Graph, members: list[_Member]) -> None:
    first = members[0].node
    base = first.name or first.outputs[0]

    def add(array: np.ndarray, role: str) -> str:
        return graph.add_initializer(np.ascontiguousarray(array), f"{base}_packed_{role}")

    inputs = [first.input(X), first.input(XZ), add(np.concatenate([m.weight for m in members], axis=1), "weight"),
              add(np.concatenate([m.w_zero for m in members]), "w_zero_point"),
              add(np.concatenate([m.scale for m in members]), "scale"),
              add(np.concatenate([m.bias for m in members]), "bias") if members[0].bias is not None else "",
              first.input(YS), first.input(YZ)]
    packed = graph.fresh_name(f"{base}_packed")
    fused_from = [name for m in members for name in m.node.attrs.get("fused_from", [m.node.name])]
    name = packed_name(first)
    name = name if not any(n.name == name for n in graph.nodes) else graph.fresh_name(name)
    gemm = Node(KIND, inputs, [packed], {"fused_from": fused_from}, name,
                domain=POLYKIT_DOMAIN)
    rank = len(graph.value(first.outputs[0]).shape)
    split = column_split(graph, packed, [m.output for m in members], [m.n for m in members], rank, base)
    at = next(i for i, n in enumerate(graph.nodes) if n is first)
    graph.nodes[at:at] = [gemm, split]
    graph.remove_nodes([m.node for m in members])

"""pack_gemms: horizontal GEMM fusion (TensorRT's "horizontal fusion" of GEMMs sharing an input).

Several MatMul / Gemm nodes that read the SAME activation tensor with constant 2-D weights of
the same K become one GEMM whose weight is theirs concatenated along N; a Split along the last
axis gives each former output back under its name. A transformer's Q, K and V projections are
such a group: at batch 1 three N=768 GEMMs of M=128 fill a third of the SMs each, one N=2304 GEMM
fills them all, in one launch instead of three. The Split is no copy on the cuda plans: the
attention kernels read Q, K and V as strided views of the packed tensor (fold_attention_layouts),
pointwise layers (LLaMA's RoPE) read column slices through absorb_views - the path GPT-2's own
packed c_attn + Split takes.

A member is
- `MatMul(X, W)`, W a constant [K, N] (X of rank >= 2), or
- `Gemm(X, W, C?)` with transA=0 (transB, alpha, beta equal across the group), C absent or a
  constant [N] / [1, N],
optionally followed by its bias: the MatMul's (or Gemm without C's) only reader is an `Add` of
a constant broadcast along the last axis only ([N], [1, N], ...), and then by a `Mul` by a
one-element constant power of two (Whisper's q scaling), folded into the member's weight and bias
columns (exact in float32: a power of two scales every product and sum alike; once an fp16 build
casts them, a weight under 2^-14 / factor is subnormal, an absolute error under 2^-25 - far below
the fp16 rounding of the output). The members' biases pack
into one [N_total] bias (zeros for a member without one: x + 0 is x). The group is keyed on the
input, the op, its attributes, K and the weight dtype - op types and shapes only, never names.

Gated groups stay apart: members whose outputs meet in one elementwise op (a gated MLP's
SiLU(gate) * up) run as a GEMM + a GEMM with that op in its epilogue (fuse_bias_activation), as
many launches as the packed GEMM + a Pointwise over column views and without writing and reading
the packed [M, 2F] intermediate (LLaMA-small bs1: 12.5 MB more; `gated=True` packs them anyway).

Dynamic shapes (a profile build): a GEMM whose input has dynamic outer dims (batch, sequence) but
a static K packs as well when its output reaches attention's MatMuls only through Reshape-family
views that keep the input's dynamic dims whole (not [B*S, E] reshaped to [B, S, H, D]: a view cannot
split a merged dim), Transposes and scalings by a constant (SDPA's sqrt(scale) on q and k; `_to_heads_only`):
fold_attention_layouts makes those reads views whose outer strides are expressions of the packed
tensor's bound dims (`#k` entries, docs/FUSION.md), so the Split stays free. A member with another
reader (an elementwise one: RoPE, a gated MLP's product) stays apart there: absorb_views' views are
static-shape only, so its Split would be a copy of the projection.

Left out: GEMMs reading a tensor with a dynamic K, GEMMs reading a Transpose's output (move_row_transposes sinks such a Transpose through
each GEMM into the Attention layouts, which a Split would stop), a member whose output (or its
MatMul's, under its bias Add) is a graph output or kept (`keep`), or a node named in `skip`
(layers pinned to float32). The packed GEMM's `fused_from` names its members' nodes (layer
precisions and profiles find them). A group needs two members. The pass runs once, on the ONNX-level graph after
constant folding and fold_conv_batchnorm, before recognize_attention (so the Attention recognizer
sees the packed projection + Split that GPT-2's export already has, and the fusion passes after
give the packed GEMM its bias epilogue). Refit: the packed weight is derived by this pass from the
initializers, so a refit (which re-runs the build's front) re-derives it bit for bit
(tests/compiler/test_plan_refit.py). Q/DQ and weight-only folding run before it (their layers are
not MatMul/Gemm with float weights, so they never pack); builds that calibrate INT8 / FP8 skip it
(their activation scales are keyed by the GEMMs' own tensors).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from polykit.compiler.ir.graph import Graph, Node
from polykit.compiler.ir.symbolic import SymInt
from polykit.compiler.passes.fuse_pointwise import is_fusable
from polykit.compiler.passes.rewrite import protected

#: fewest members that make a group worth packing
MIN_MEMBERS = 2
#: views and transposes on the way from a member of dynamic shape to attention's MatMuls
HEAD_VIEWS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose"})
#: how many elementwise ops deep `ungated` looks for a node two members' outputs meet in
GATE_DEPTH = 8


@dataclass
class _Member:
    gemm: Node
    weight: np.ndarray  # as the op reads it ([K, N], or [N, K] for Gemm transB=1)
    n: int
    bias: np.ndarray | None  # [N] (Gemm: beta * C already applied)
    folded: list[Node]  # the bias Add and the power-of-two scale Mul taken into the pack, in order
    output: str  # the tensor the member's readers read


def pack_gemms(graph: Graph, *, keep: frozenset[str] = frozenset(), skip: tuple[str, ...] = (),
               gated: bool = False) -> bool:
    """Pack the groups of GEMMs reading one tensor into one GEMM + Split; True if any was packed.
    `gated=True` packs gated groups too (see the module docstring)."""
    fixed = protected(graph, keep)
    readers = graph.consumers()
    transposed = {n.outputs[0] for n in graph.nodes if n.op_type == "Transpose" and not n.domain and n.outputs}
    groups: dict[tuple, list[_Member]] = {}
    for node in graph.nodes:
        if node.domain or node.name in skip or node.input(0) in transposed:
            continue
        member = _member(graph, node, readers, fixed)
        if member is not None:
            groups.setdefault(_key(graph, node, member), []).append(member)
    changed = False
    for members in groups.values():
        if not gated:
            members = ungated(graph, members, readers)
        if len(members) >= MIN_MEMBERS:
            _pack(graph, members)
            changed = True
    return changed


def ungated(graph: Graph, members: list, readers: dict[str, list[Node]]) -> list:
    """The members (each with an `output`) whose outputs meet no other member's in an elementwise op (within GATE_DEPTH
    elementwise steps): a gated MLP's SiLU(gate) * up runs as the up GEMM's epilogue reading the
    gate GEMM's (fuse_bias_activation), as many launches as a packed GEMM + a Pointwise and
    without the packed intermediate's bytes."""
    reach = [_elementwise_below(graph, m.output, readers) for m in members]
    return [m for i, m in enumerate(members) if not any(reach[i] & r for j, r in enumerate(reach) if j != i)]


def _elementwise_below(graph: Graph, name: str, readers: dict[str, list[Node]]) -> set[int]:
    """ids of the elementwise nodes reached from `name` through elementwise nodes only."""
    seen: set[int] = set()
    frontier = [name]
    for _ in range(GATE_DEPTH):
        nxt = []
        for tensor in frontier:
            for r in readers.get(tensor, []):
                if id(r) not in seen and is_fusable(graph, r):
                    seen.add(id(r))
                    nxt.append(r.outputs[0])
        frontier = nxt
    return seen


def _member(graph: Graph, node: Node, readers: dict[str, list[Node]], fixed: set[str]) -> _Member | None:
    if node.op_type not in ("MatMul", "Gemm") or len(node.outputs) != 1:
        return None
    x, w = node.input(0), node.input(1)
    weight = graph.initializers.get(w)
    if not x or x in graph.initializers or weight is None or np.asarray(weight).ndim != 2:
        return None
    weight = np.asarray(weight)
    xv = graph.value(x)
    if weight.dtype.kind != "f" or xv.dtype is None or np.dtype(xv.dtype) != weight.dtype or xv.shape is None \
            or isinstance(xv.shape[-1], SymInt) or not isinstance(xv.shape[-1], (int, np.integer)):
        return None
    out = node.outputs[0]
    if out in fixed:
        return None
    dynamic = not xv.is_static
    bias = None
    if node.op_type == "MatMul":
        if len(xv.shape) < 2 or xv.shape[-1] != weight.shape[0]:
            return None
        n = int(weight.shape[1])
    else:
        if node.attr("transA", 0) or len(xv.shape) != 2:
            return None
        n = int(weight.shape[0] if node.attr("transB", 0) else weight.shape[1])
        c = node.input(2)
        if c:
            cval = graph.initializers.get(c)
            if cval is None or np.asarray(cval).dtype != weight.dtype or np.asarray(cval).shape not in ((n,), (1, n)):
                return None
            beta = np.asarray(node.attr("beta", 1.0), dtype=weight.dtype)
            bias = (np.asarray(cval).reshape(n) * beta).astype(weight.dtype)
    folded: list[Node] = []
    if bias is None:
        add = _bias_add(graph, out, n, weight.dtype, readers, fixed)
        if add is not None:
            add_node, bias = add
            folded.append(add_node)
            out = add_node.outputs[0]
    scale = _power_of_two_scale(graph, out, weight.dtype, readers, fixed)
    if scale is not None:  # (x W + b) * 2^k == x (W 2^k) + b 2^k exactly (Whisper's and BART's q scaling)
        mul, factor = scale
        weight = (weight * factor).astype(weight.dtype)
        bias = None if bias is None else (bias * factor).astype(weight.dtype)
        folded.append(mul)
        out = mul.outputs[0]
    if dynamic and not _to_heads_only(graph, out, readers, frozenset(d.expr for d in xv.shape if isinstance(d, SymInt))):
        return None  # dynamic outer dims: only Attention reads a column slice as a view (fold_attention_layouts)
    return _Member(node, weight, n, bias, folded, out)


def _to_heads_only(graph: Graph, out: str, readers: dict[str, list[Node]], dims: frozenset,
                   heads: bool = False) -> bool:
    """Whether `out` reaches MatMuls (attention's, before recognize_attention) only through
    Reshape-family views that keep the GEMM input's dynamic dims whole (each a dim of `dims`, their
    expressions), at least one Transpose (of the heads), then scalings by a constant, or is read by
    Shape: the reads fold_attention_layouts makes views of on a dynamic-shape tensor (it cannot
    split a merged B*S). absorb_views' views (elementwise readers: RoPE, a gated MLP's product) are
    static-shape only, so there the Split would stay a copy."""
    users = readers.get(out, [])
    for r in users:
        if r.domain:
            return False
        if r.op_type == "Shape" or (r.op_type == "MatMul" and heads):
            continue
        scale = heads and r.op_type in ("Mul", "Div") and _scalar_operand(graph, r, out)
        if (r.op_type not in HEAD_VIEWS and not scale) or r.inputs[0] != out or not _keeps(graph, r.outputs[0], dims) \
                or not _to_heads_only(graph, r.outputs[0], readers, dims, heads or r.op_type == "Transpose"):
            return False
    return bool(users)


def _keeps(graph: Graph, name: str, dims: frozenset) -> bool:
    """`name`'s shape is known and each of its dynamic dims is one of `dims`."""
    shape = graph.value(name).shape
    return shape is not None and all(not isinstance(d, SymInt) or d.expr in dims for d in shape)


def _scalar_operand(graph: Graph, node: Node, out: str) -> bool:
    """`node` (a Mul / Div reading `out` first) scales it by a one-element constant (SDPA's
    sqrt(scale) on q and k, which recognize_attention takes into the Attention's scale)."""
    if len(node.inputs) != 2 or node.inputs[1] == out:
        return False
    value = graph.initializers.get(node.inputs[1])
    return value is not None and np.asarray(value).size == 1


def _power_of_two_scale(graph: Graph, out: str, dtype: np.dtype, readers: dict[str, list[Node]],
                        fixed: set[str]) -> tuple[Node, float] | None:
    """The Mul that is `out`'s only reader and multiplies it by a one-element constant that is a
    power of two (scaling the weights by it is exact), and that factor."""
    users = readers.get(out, [])
    if len(users) != 1 or users[0].op_type != "Mul" or users[0].domain or len(users[0].inputs) != 2 \
            or users[0].outputs[0] in fixed:
        return None
    mul = users[0]
    other = mul.inputs[1] if mul.inputs[0] == out else mul.inputs[0]
    value = graph.initializers.get(other)
    if other == out or value is None or np.asarray(value).size != 1 or np.asarray(value).dtype != dtype \
            or np.asarray(value).ndim > len(graph.value(out).shape or ()):
        return None
    factor = float(np.asarray(value).reshape(-1)[0])
    mantissa, _ = np.frexp(factor)
    return (mul, factor) if factor > 0 and mantissa == 0.5 else None


def _bias_add(graph: Graph, out: str, n: int, dtype: np.dtype, readers: dict[str, list[Node]],
              fixed: set[str]) -> tuple[Node, np.ndarray] | None:
    """The Add that is `out`'s only reader and adds a constant along the last axis, and its [N] bias."""
    users = readers.get(out, [])
    if len(users) != 1:
        return None
    add = users[0]
    if add.op_type != "Add" or add.domain or len(add.inputs) != 2 or add.outputs[0] in fixed:
        return None
    other = add.inputs[1] if add.inputs[0] == out else add.inputs[0]
    if other == out:
        return None
    value = graph.initializers.get(other)
    if value is None:
        return None
    value = np.asarray(value)
    out_rank = len(graph.value(out).shape or ())
    if value.dtype != dtype or value.ndim < 1 or value.ndim > out_rank or value.shape[-1] != n \
            or any(d != 1 for d in value.shape[:-1]):
        return None
    return add, value.reshape(n)


def _key(graph: Graph, node: Node, member: _Member) -> tuple:
    x = node.input(0)
    if node.op_type == "MatMul":
        return x, "MatMul", member.weight.dtype.str, int(member.weight.shape[0])
    trans_b = int(node.attr("transB", 0))
    k = int(member.weight.shape[1] if trans_b else member.weight.shape[0])
    return x, "Gemm", member.weight.dtype.str, k, trans_b, float(node.attr("alpha", 1.0))  # beta: in each bias


def column_split(graph: Graph, packed: str, outputs: list[str], widths: list[int], rank: int, base: str) -> Node:
    """The Split of `packed` (rank `rank`) along its last axis into `outputs` of `widths` columns each."""
    attrs: dict = {"axis": rank - 1}
    inputs = [packed]
    if graph.opset >= 13:
        inputs.append(graph.add_initializer(np.array(widths, np.int64), f"{base}_packed_sizes"))
    else:
        attrs["split"] = [int(w) for w in widths]
    return Node("Split", inputs, outputs, attrs, graph.fresh_name(f"{base}_packed_split"))


def _pack(graph: Graph, members: list[_Member]) -> None:
    first = members[0].gemm
    dtype = members[0].weight.dtype
    trans_b = first.op_type == "Gemm" and int(first.attr("transB", 0))
    weight = np.concatenate([m.weight for m in members], axis=0 if trans_b else 1)
    base = first.name or first.outputs[0]
    w_name = graph.add_initializer(np.ascontiguousarray(weight), f"{base}_packed_weight")
    x = first.input(0)
    rank = len(graph.value(x).shape)
    packed = graph.fresh_name(f"{base}_packed")
    has_bias = any(m.bias is not None for m in members)
    bias = np.concatenate([m.bias if m.bias is not None else np.zeros(m.n, dtype) for m in members]) if has_bias \
        else None
    new: list[Node] = []
    fused_from = [n.name for m in members for n in (m.gemm, *m.folded)]  # the layer's ONNX nodes
    if first.op_type == "Gemm":
        attrs = {"transB": int(trans_b), "alpha": float(first.attr("alpha", 1.0)), "fused_from": fused_from}
        inputs = [x, w_name]
        if bias is not None:
            inputs.append(graph.add_initializer(bias, f"{base}_packed_bias"))
            attrs["beta"] = 1.0
        new.append(Node("Gemm", inputs, [packed], attrs, graph.fresh_name(f"{base}_packed")))
        split_in = packed
    else:
        name = graph.fresh_name(f"{base}_packed")
        new.append(Node("MatMul", [x, w_name], [packed], {"fused_from": fused_from}, name))
        split_in = packed
        if bias is not None:
            split_in = graph.fresh_name(f"{base}_packed_biased")
            b_name = graph.add_initializer(bias, f"{base}_packed_bias")
            new.append(Node("Add", [packed, b_name], [split_in], {}, graph.fresh_name(f"{base}_packed_bias_add")))
    new.append(column_split(graph, split_in, [m.output for m in members], [m.n for m in members], rank, base))
    dead = [n for m in members for n in (m.gemm, *m.folded)]
    at = next(i for i, n in enumerate(graph.nodes) if n is first)
    graph.nodes[at:at] = new
    graph.remove_nodes(dead)
    for m in members:  # the Split writes the old outputs; the tensors between a GEMM and them are gone
        for n in (m.gemm, *m.folded):
            if n.outputs[0] != m.output:
                graph.values.pop(n.outputs[0], None)

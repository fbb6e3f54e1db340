"""fold_index_ranges: index arithmetic over aranges, decided at build time.

Exporters write index tensors as arithmetic over `Range` (an arange): Hugging Face's attention
masks (transformers 5 `sdpa_mask`) gather the padding mask by `batch_idx * kv_len + kv_idx` over
broadcast aranges and test `kv_idx >= 0`; BERT's embeddings gather the position table by
`arange_buffer[:, :seq]` and the token-type table by a Slice / Expand / GatherElements of a zero
buffer. A static build folds these to constants (the Gather by a constant arange still runs); a
build for optimization profiles runs every Range, compare and Gather as a layer (BERT-base: 9
small kernels more than the static plan).

The pass follows, for integer tensors, the fact "every element is an affine function of its
index": `t[i] = base + sum_d coeffs[d] * i[d]` (an `Iota`; a dim of size 1 has coefficient 0,
a constant-valued tensor has all zero), made by Range with constant start and delta, by integer
initializers of that form, and carried through Unsqueeze / Squeeze / Reshape / Flatten that only
add or drop unit dims, Expand, integer Cast, Slice with constant non-negative starts and positive
steps, Mul by a known scalar (a constant or a shape value, e.g. a dim read by Shape), Add of two
such tensors, and GatherElements of a constant-valued tensor. Coefficients may be symbolic dims.
Then:

1. `Gather(D, idx, axis=0)` whose index enumerates D's leading axis in order (base 0, the
   non-unit dims' coefficients the row-major strides of their sizes, their product D's leading
   dim) is D reshaped: a Reshape to `Shape(idx) ++ Shape(D)[1:]` (a view); one whose index runs
   over one dim with coefficient 1 from a constant base is a Slice of D's leading axis, reshaped;
   one whose index is one constant k, into a constant table, read only by broadcasting
   elementwise ops that the row alone still broadcasts to the same shape, is the constant row
   `D[k]` (BERT's token types).
2. A comparison `x >= k` / `x > k` of an Iota with non-negative coefficients (symbolic dims are
   >= 0) decided by its base is all true; ConstantOfShape / constants of True, and And, Cast,
   Unsqueeze, Expand of all-true tensors are all true; `And(x, t)` with t all true and x already
   of the broadcast shape is x.

Shapes are compared by their dims' expressions (`term_of`), never at the opt shape alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from polykit.compiler.graph.infer import infer_shapes
from polykit.compiler.ir.graph import Graph, Node
from polykit.compiler.ir.symbolic import SymInt, term_of
from polykit.compiler.passes.rewrite import const, protected, replace_tensor

#: largest integer initializer tested for the Iota form
MAX_FIT = 1 << 16
#: ops that broadcast their operands elementwise (a smaller operand reads the same values)
BROADCASTING = frozenset({"Add", "Sub", "Mul", "Div", "Max", "Min", "Where", "And", "Or", "Pow"})
SHAPE_ONLY = frozenset({"Unsqueeze", "Squeeze", "Reshape", "Flatten"})


@dataclass(frozen=True)
class Iota:
    """t[i] = base + sum(coeffs[d] * i[d]); coeffs per dim of t (ints or SymInts)."""

    base: int
    coeffs: tuple


def fold_index_ranges(graph: Graph, *, keep: frozenset[str] = frozenset()) -> bool:
    """Apply the rules above; True if the graph changed."""
    fixed = protected(graph, keep)
    known = _known_values(graph)
    iotas, truths = _facts(graph, known)
    if not iotas and not truths:
        return False
    readers = _readers(graph)
    changed = False
    for node in list(graph.nodes):
        if node.domain not in ("", "ai.onnx") or any(o in fixed for o in node.outputs if o):
            continue
        if node.op_type == "Gather" and int(node.attrs.get("axis", 0)) == 0 and len(node.inputs) == 2:
            step = _gather(graph, node, iotas.get(node.input(1)), readers, fixed)
        elif node.op_type == "And" and len(node.inputs) == 2:
            step = _and(graph, node, truths, readers, fixed)
        else:
            continue
        if step:  # the readers changed: the next rewrite looks at the graph as it is now
            changed = True
            readers = _readers(graph)
    return changed


def _readers(graph: Graph) -> dict[str, list[Node]]:
    readers: dict[str, list[Node]] = {}
    for node in graph.nodes:
        for name in node.inputs:
            if name:
                readers.setdefault(name, []).append(node)
    return readers


# ---- facts -------------------------------------------------------------------------------------
def _known_values(graph: Graph) -> dict[str, np.ndarray]:
    try:
        return infer_shapes(graph, strict=False)
    except Exception:  # noqa: BLE001 - a graph inference refuses folds nothing here; the pipeline reports it
        return {}


def _shape(graph: Graph, name: str) -> tuple | None:
    v = graph.value(name) if name else None
    return None if v is None or v.shape is None or any(d is None or isinstance(d, str) for d in v.shape) else tuple(v.shape)


def _int_kind(graph: Graph, name: str) -> bool:
    v = graph.value(name)
    return v.dtype is not None and np.dtype(v.dtype).kind in "iu"


def _scalar(known: dict, graph: Graph, name: str) -> Any:
    """The one value of a one-element int constant or shape value (an int or a SymInt), else None."""
    arr = const(graph, name) if name in graph.initializers else known.get(name)
    if arr is None or np.size(arr) != 1:
        return None
    value = np.asarray(arr).reshape(-1)[0]
    if isinstance(value, SymInt):
        return value
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    return None


def _fit(arr: np.ndarray) -> Iota | None:
    """The Iota form of an integer array, if it has one."""
    if arr.dtype.kind not in "iu" or arr.size == 0 or arr.size > MAX_FIT:
        return None
    a = arr.astype(np.int64)
    base = int(a.reshape(-1)[0])
    coeffs = []
    for d, n in enumerate(a.shape):
        if n == 1:
            coeffs.append(0)
            continue
        step = [0] * a.ndim
        step[d] = 1
        coeffs.append(int(a[tuple(step)]) - base)
    grid = sum((c * np.arange(n).reshape([-1 if k == d else 1 for k in range(a.ndim)])
                for d, (c, n) in enumerate(zip(coeffs, a.shape))), np.int64(base))
    return Iota(base, tuple(coeffs)) if np.array_equal(np.broadcast_to(grid, a.shape), a) else None


def _same(a: Any, b: Any) -> bool:
    return term_of(a) == term_of(b)


def _regrid(src_shape: tuple, src: Iota, dst_shape: tuple) -> Iota | None:
    """src's fact on a tensor of dst_shape holding the same elements in the same order with unit
    dims added or dropped (None if the non-unit dims differ)."""
    a = [(d, c) for d, c in zip(src_shape, src.coeffs) if d != 1]
    b = [i for i, d in enumerate(dst_shape) if d != 1]
    if len(a) != len(b) or not all(_same(d, dst_shape[i]) for (d, _), i in zip(a, b)):
        return None
    coeffs = [0] * len(dst_shape)
    for (_, c), i in zip(a, b):
        coeffs[i] = c
    return Iota(src.base, tuple(coeffs))


def _aligned(fact: Iota, shape: tuple, out: tuple) -> list | None:
    """fact's coefficients right-aligned to a broadcast output shape (broadcast dims 0)."""
    if len(shape) > len(out):
        return None
    pad = len(out) - len(shape)
    coeffs = [0] * pad
    for d, c in zip(shape, fact.coeffs):
        coeffs.append(c if d != 1 else 0)
    return coeffs


def _facts(graph: Graph, known: dict) -> tuple[dict[str, Iota], set[str]]:
    iotas: dict[str, Iota] = {}
    truths: set[str] = set()
    for name, arr in graph.initializers.items():
        arr = np.asarray(arr)
        if arr.dtype == np.bool_ and arr.size and arr.all():
            truths.add(name)
        elif arr.dtype.kind in "iu" and arr.size <= MAX_FIT:
            fact = _fit(arr)
            if fact is not None:
                iotas[name] = fact
    for node in graph.nodes:
        if node.domain not in ("", "ai.onnx") or not node.outputs or not node.outputs[0]:
            continue
        out = node.outputs[0]
        shape = _shape(graph, out)
        if shape is None:
            continue
        op = node.op_type
        if op in ("ConstantOfShape",) and _all_true_attr(node):
            truths.add(out)
            continue
        if op in ("Unsqueeze", "Expand", "Cast", "Squeeze", "Reshape", "Flatten") and node.input(0) in truths \
                and graph.value(out).dtype == np.bool_:
            truths.add(out)
            continue
        if op == "And" and all(i in truths for i in node.inputs):
            truths.add(out)
            continue
        if op in ("GreaterOrEqual", "Greater") and len(node.inputs) == 2:
            fact, k = iotas.get(node.input(0)), _scalar(known, graph, node.input(1))
            if fact is not None and isinstance(k, int) and not isinstance(k, SymInt) and _non_negative(fact) \
                    and (fact.base >= k if op == "GreaterOrEqual" else fact.base > k):
                truths.add(out)
            continue
        if not _int_kind(graph, out):
            continue
        fact = _derive(graph, node, known, iotas, shape)
        if fact is not None:
            iotas[out] = fact
    return iotas, truths


def _all_true_attr(node: Node) -> bool:
    value = node.attrs.get("value")
    arr = np.asarray(value) if value is not None else None
    return arr is not None and arr.dtype == np.bool_ and arr.size > 0 and bool(arr.all())


def _non_negative(fact: Iota) -> bool:
    return all(isinstance(c, SymInt) or int(c) >= 0 for c in fact.coeffs)


def _derive(graph: Graph, node: Node, known: dict, iotas: dict[str, Iota], shape: tuple) -> Iota | None:
    """The Iota fact of `node`'s output (of `shape`), by the rule of its op type (IOTA_RULES)."""
    rule = IOTA_RULES.get(node.op_type)
    return rule(graph, node, known, iotas, shape) if rule is not None else None


def _source(graph: Graph, node: Node, iotas: dict[str, Iota]) -> tuple[Iota, tuple] | None:
    """(the fact of `node`'s first input, that input's shape), when both are known."""
    name = node.input(0) if node.inputs else ""
    fact, shape = iotas.get(name), _shape(graph, name) if name else None
    return (fact, shape) if fact is not None and shape is not None else None


def _range(graph: Graph, node: Node, known: dict, iotas: dict[str, Iota], shape: tuple) -> Iota | None:
    if len(node.inputs) != 3 or len(shape) != 1:
        return None
    start, delta = _scalar(known, graph, node.input(0)), _scalar(known, graph, node.input(2))
    if not all(isinstance(v, int) and not isinstance(v, SymInt) for v in (start, delta)) or delta == 0:
        return None
    return Iota(start, (delta if shape[0] != 1 else 0,))


def _same_order(graph: Graph, node: Node, known: dict, iotas: dict[str, Iota], shape: tuple) -> Iota | None:
    """Views (unit dims added or dropped) and integer Casts keep every element where it was."""
    found = _source(graph, node, iotas)
    return _regrid(found[1], found[0], shape) if found else None


def _expand(graph: Graph, node: Node, known: dict, iotas: dict[str, Iota], shape: tuple) -> Iota | None:
    found = _source(graph, node, iotas)
    coeffs = _aligned(found[0], found[1], shape) if found else None
    return Iota(found[0].base, tuple(coeffs)) if coeffs is not None else None


def _gather_elements(graph: Graph, node: Node, known: dict, iotas: dict[str, Iota], shape: tuple) -> Iota | None:
    """Any gather of a constant-valued tensor gives that value."""
    found = _source(graph, node, iotas)
    return Iota(found[0].base, (0,) * len(shape)) if found and not any(found[0].coeffs) else None


def _slice_rule(graph: Graph, node: Node, known: dict, iotas: dict[str, Iota], shape: tuple) -> Iota | None:
    found = _source(graph, node, iotas)
    return _slice(graph, node, found[0], found[1], shape) if found else None


def _slice(graph: Graph, node: Node, src: Iota, src_shape: tuple, shape: tuple) -> Iota | None:
    starts = const(graph, node.input(1))
    axes = const(graph, node.input(3)) if len(node.inputs) > 3 and node.input(3) else np.arange(len(src_shape))
    steps = const(graph, node.input(4)) if len(node.inputs) > 4 and node.input(4) else np.ones(len(axes), np.int64)
    if starts is None or axes is None or steps is None or len(shape) != len(src_shape):
        return None
    base, coeffs = src.base, list(src.coeffs)
    for s, a, st in zip(np.asarray(starts).reshape(-1), np.asarray(axes).reshape(-1), np.asarray(steps).reshape(-1)):
        a, s, st = int(a) % len(src_shape), int(s), int(st)
        if s < 0 or st <= 0:
            return None
        coeff = coeffs[a]
        if isinstance(coeff, SymInt) and s:
            return None  # the base stays a plain int
        base += int(coeff) * s
        coeffs[a] = coeff * st
    return Iota(base, tuple(c if d != 1 else 0 for c, d in zip(coeffs, shape)))


def _binary(graph: Graph, node: Node, known: dict, iotas: dict[str, Iota], shape: tuple) -> Iota | None:
    if len(node.inputs) != 2:
        return None
    a, b = node.inputs
    fa, fb = iotas.get(a), iotas.get(b)
    sa, sb = _shape(graph, a), _shape(graph, b)
    if sa is None or sb is None:
        return None
    if node.op_type == "Add" and fa is not None and fb is not None:
        ca, cb = _aligned(fa, sa, shape), _aligned(fb, sb, shape)
        if ca is None or cb is None:
            return None
        return Iota(fa.base + fb.base, tuple(x + y for x, y in zip(ca, cb)))
    if node.op_type != "Mul":
        return None
    for fact, fact_shape, other in ((fa, sa, b), (fb, sb, a)):
        s = _scalar(known, graph, other)
        if fact is None or s is None:
            continue
        if isinstance(s, SymInt) and fact.base:
            return None
        coeffs = _aligned(fact, fact_shape, shape)
        if coeffs is None:
            return None
        return Iota(0 if isinstance(s, SymInt) else fact.base * s, tuple(c * s if c else 0 for c in coeffs))
    return None


#: op type -> the rule giving its output's Iota fact from its inputs' (None: no fact)
IOTA_RULES = {"Range": _range, "Cast": _same_order, **{op: _same_order for op in SHAPE_ONLY}, "Expand": _expand,
              "GatherElements": _gather_elements, "Slice": _slice_rule, "Mul": _binary, "Add": _binary}


# ---- rewrites ----------------------------------------------------------------------------------
def _gather(graph: Graph, node: Node, fact: Iota | None, readers: dict, fixed: set[str]) -> bool:
    if fact is None:
        return False
    data, idx, out = node.input(0), node.input(1), node.outputs[0]
    dshape, ishape = _shape(graph, data), _shape(graph, idx)
    if dshape is None or ishape is None or not dshape:
        return False
    live = [(d, c) for d, c in zip(ishape, fact.coeffs) if d != 1]
    if not any(c for _, c in live):
        return _gather_row(graph, node, fact.base, dshape, ishape, readers, fixed)
    if fact.base == 0 and _enumerates(live, dshape[0]):
        _emit_view(graph, node, data, idx, out, dshape, None)
        return True
    if len(live) == 1 and not isinstance(live[0][1], SymInt) and int(live[0][1]) == 1 and fact.base >= 0 \
            and not isinstance(dshape[0], SymInt):
        _emit_view(graph, node, data, idx, out, dshape, (fact.base, ishape.index(live[0][0])))
        return True
    return False


def _enumerates(live: Sequence[tuple], leading: Any) -> bool:
    """The non-unit index dims (size, coefficient) enumerate 0..leading-1 in row-major order."""
    stride: Any = 1
    for size, coeff in reversed(live):
        if not _same(coeff, stride):
            return False
        stride = stride * size
    return _same(stride, leading)


def _emit_view(graph: Graph, node: Node, data: str, idx: str, out: str, dshape: tuple,
               window: tuple[int, int] | None) -> None:
    """Replace `node` (a Gather) by [Slice of D's leading axis] + Reshape to Shape(idx) ++ Shape(D)[1:]."""
    new: list[Node] = []

    def emit(op: str, inputs: list[str], **attrs: Any) -> str:
        name = graph.fresh_name(f"{node.name}_{op.lower()}")
        new.append(Node(op, inputs, [name], attrs, name=name))
        return name

    def ints(*values: int) -> str:
        return graph.add_initializer(np.array(values, dtype=np.int64), f"{node.name}_ints")

    index_shape = emit("Shape", [idx])
    source = data
    if window is not None:
        start, dim = window
        count = emit("Slice", [index_shape, ints(dim), ints(dim + 1)])
        end = emit("Add", [count, ints(start)])
        source = emit("Slice", [data, ints(start), end, ints(0)])
    rest = dshape[1:]
    tail = ints(*rest) if all(not isinstance(d, SymInt) for d in rest) else emit("Shape", [data], start=1)
    target = index_shape if not rest else emit("Concat", [index_shape, tail], axis=0)
    new.append(Node("Reshape", [source, target], [out], {}, name=node.name))
    at = graph.nodes.index(node)
    graph.nodes[at:at + 1] = new


def _gather_row(graph: Graph, node: Node, k: int, dshape: tuple, ishape: tuple, readers: dict,
                fixed: set[str]) -> bool:
    table = const(graph, node.input(0))
    out = node.outputs[0]
    if table is None or isinstance(dshape[0], SymInt) or not -dshape[0] <= k < dshape[0]:
        return False
    row_shape = (1,) * len(ishape) + tuple(dshape[1:])
    users = readers.get(out, [])
    if not users or out in fixed:
        return False
    for user in users:
        if user.op_type not in BROADCASTING or user.domain not in ("", "ai.onnx"):
            return False
        others = [_shape(graph, i) if i != out else row_shape for i in user.inputs]
        full = _shape(graph, user.outputs[0])
        if full is None or any(s is None for s in others) or not _broadcasts_to(others, full):
            return False
    row = graph.add_initializer(np.ascontiguousarray(np.asarray(table)[k].reshape(row_shape)), f"{node.name}_row")
    replace_tensor(graph, out, row)
    return True


def _broadcasts_to(shapes: Sequence[tuple], full: tuple) -> bool:
    """numpy broadcasting of `shapes` gives exactly `full` (by expression)."""
    rank = max(len(s) for s in shapes)
    if rank != len(full):
        return False
    for d in range(rank):
        dims = [s[d - rank + len(s)] for s in shapes if d - rank + len(s) >= 0]
        big = [x for x in dims if x != 1]
        if not big:
            if full[d] != 1:
                return False
        elif not all(_same(x, full[d]) for x in big):
            return False
    return True


def _and(graph: Graph, node: Node, truths: set[str], readers: dict, fixed: set[str]) -> bool:
    """And(x, t) with t all true is x: where x has the And's shape, or where x's smaller shape is all
    its readers need (`_shrinks`: the broadcast happens later anyway, e.g. in the scores' Add)."""
    a, b = node.inputs
    out = node.outputs[0]
    for keep_, true in ((a, b), (b, a)):
        if true not in truths:
            continue
        ks, os_ = _shape(graph, keep_), _shape(graph, out)
        if ks is None or os_ is None or len(ks) != len(os_):
            continue
        if all(_same(x, y) for x, y in zip(ks, os_)) or _shrinks(graph, out, ks, readers, fixed):
            replace_tensor(graph, out, keep_)
            graph.nodes.remove(node)
            return True
    return False


#: elementwise ops of one operand (output shape = input shape)
UNARY = frozenset({"Cast", "Not", "Neg", "Abs", "Relu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Reciprocal"})
#: how far `_shrinks` follows readers
MAX_SHRINK_DEPTH = 8


def _shrinks(graph: Graph, name: str, shape: tuple, readers: dict, fixed: set[str], depth: int = 0) -> bool:
    """Whether `name` may hold `shape` (which broadcasts to its own) with every value its readers
    compute unchanged: each path from it runs through elementwise ops (never a graph output or kept
    tensor) into one whose other operands already give its whole output shape."""
    users = readers.get(name, [])
    if name in fixed or not users or depth > MAX_SHRINK_DEPTH:
        return False
    for user in users:
        if user.domain not in ("", "ai.onnx") or len(user.outputs) != 1:
            return False
        if user.op_type in UNARY:
            if not _shrinks(graph, user.outputs[0], shape, readers, fixed, depth + 1):
                return False
            continue
        if user.op_type not in BROADCASTING:
            return False
        shapes = [shape if i == name else _shape(graph, i) for i in user.inputs]
        full = _shape(graph, user.outputs[0])
        if full is None or any(s is None for s in shapes):
            return False
        if _broadcasts_to(shapes, full):
            continue
        smaller = _broadcast(shapes)
        if smaller is None or not _shrinks(graph, user.outputs[0], smaller, readers, fixed, depth + 1):
            return False
    return True


def _broadcast(shapes: Sequence[tuple]) -> tuple | None:
    """numpy broadcasting of `shapes` by expression (None where two dims are neither equal nor 1)."""
    rank = max(len(s) for s in shapes)
    out = []
    for d in range(rank):
        big = [s[d - rank + len(s)] for s in shapes if d - rank + len(s) >= 0 and s[d - rank + len(s)] != 1]
        if big and not all(_same(x, big[0]) for x in big):
            return None
        out.append(big[0] if big else 1)
    return tuple(out)

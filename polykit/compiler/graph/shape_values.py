"""Shape tensors with symbolic values: Shape -> Gather -> Concat -> Reshape chains of a
build for optimization profiles.

Shape of a tensor with SymInt dims gives an object array of SymInts; the few ops shape
chains are made of (SHAPE_VALUE_OPS) compute on such arrays with numpy, so a Reshape, Expand
or ConstantOfShape downstream reads its target as SymInts (`InferContext.const`) and its
output dims become expressions. Values stay int64 arrays where no SymInt is left. The plan
still runs these nodes as layers (their kernels see concrete shapes at run time); this only
lets shape inference see through them.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from polykit.compiler.ir.dtypes import is_float
from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Graph, Node
from polykit.compiler.graph.shape_rules import RULED, RuledFloat
from polykit.errors import PolykitError
from polykit.compiler.ir.symbolic import OPS, SymInt, extreme, is_dynamic, term_of
from polykit.compiler.ops.data_dims import is_data_dependent
from polykit.compiler.ops.references import find_reference

ValueFn = Callable[[Node, list], "list[np.ndarray] | None"]

#: op type -> fn(node, args) computing outputs on object arrays of ints and SymInts
SHAPE_VALUE_OPS: dict[str, ValueFn] = {}


def value_op(*ops: str) -> Callable[[ValueFn], ValueFn]:
    def register(fn: ValueFn) -> ValueFn:
        for op in ops:
            SHAPE_VALUE_OPS[op] = fn
        return fn
    return register


def is_symbolic(value: np.ndarray | None) -> bool:
    return value is not None and value.dtype == object


def _ruled_floats(value: np.ndarray | None) -> bool:
    return is_symbolic(value) and any(isinstance(v, RuledFloat) for v in value.ravel())


def settle(value: np.ndarray, dtype: np.dtype | None = None) -> np.ndarray:
    """An object array without SymInts (or RuledFloats) becomes a `dtype` (default int64) array;
    with them it stays an object array."""
    arr = np.asarray(value, dtype=object)
    if not any(isinstance(v, (SymInt, RuledFloat)) for v in arr.ravel()):
        return np.asarray(arr.tolist(), dtype=dtype or np.int64).reshape(arr.shape)
    return arr


def host_values(known: dict, inputs: "list[str] | tuple[str, ...]" = ()) -> dict[str, np.ndarray]:
    """The symbolic values among `known` (infer_shapes' result) but `inputs`: tensors a plan
    computes on the host from the input dims at run time instead of running their layers (not a
    float cast of a ruled value: its layer runs; only shape rules read it)."""
    return {name: value for name, value in known.items()
            if is_symbolic(value) and not _ruled_floats(value) and name not in inputs}


def symbolic_values(node: Node, known: dict, graph: Graph) -> list[np.ndarray] | None:
    """`node`'s outputs when it is a shape-chain op (or a fused Pointwise group of them) over
    symbolic values; None otherwise."""
    if node.domain == POLYKIT_DOMAIN and node.op_type == "Pointwise":
        return _fused(node, known, graph)
    if node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type in ("Shape", "Size"):
        shape = graph.value(node.input(0)).shape  # static or not: its input may be a symbolic value
        if shape is None or not all(isinstance(d, int) for d in shape):
            return None
        return _shape_or_size(node, list(shape))  # int64 by the ONNX spec
    fn = SHAPE_VALUE_OPS.get(node.op_type)
    if fn is None and node.op_type in MOVEMENT_OPS:
        fn = find_reference("", node.op_type)
    args = [known.get(n) if n else None for n in node.inputs]
    if node.op_type in CAST_OPS and args and is_symbolic(args[0]):
        return _float_cast(node, args[0], graph)
    if any(map(_ruled_floats, args)) and node.op_type not in MOVEMENT_OPS:
        return None  # float arithmetic of a ruled value: no expression holds it, so no value at opt either
    if fn is None or any(n and a is None for n, a in zip(node.inputs, args)) or not any(map(is_symbolic, args)):
        return None
    try:
        outs = fn(node, args)
    except (ValueError, IndexError, TypeError, ZeroDivisionError, PolykitError):
        return None
    if outs is None:
        return None
    return [settle(o, graph.value(name).dtype) for o, name in zip(outs, node.outputs)]


def _fused(node: Node, known: dict, graph: Graph) -> list[np.ndarray] | None:
    """A Pointwise node's outputs, its body steps run as shape-chain ops (fuse_pointwise may
    group an Equal -> Where chain of dims)."""
    local = {name: known.get(name) for name in node.inputs if name}
    if not any(map(is_symbolic, local.values())):
        return None
    for step in node.attrs.get("body", ()):
        out = symbolic_values(Node(step["op"], list(step["inputs"]), list(step["outputs"]), dict(step["attrs"])),
                              local, graph)
        if out is None:
            return None
        local.update(zip(step["outputs"], out))
    return [local[name] for name in node.outputs]


def _shape_or_size(node: Node, dims: list) -> list[np.ndarray]:
    if node.op_type == "Size":
        total = 1
        for d in dims:
            total = total * d
        return [settle(np.array(total, dtype=object))]
    start, end = node.attrs.get("start", 0), node.attrs.get("end", len(dims))
    out = np.empty(len(dims[start:end]), dtype=object)
    out[:] = dims[start:end]
    return [settle(out)]


#: casts of shape values (symbolic_values: _float_cast)
CAST_OPS = frozenset({"Cast", "CastLike"})


def _float_cast(node: Node, value: np.ndarray, graph: Graph) -> list[np.ndarray] | None:
    """Cast (CastLike) of dims: int32/int64 stay dims; a float type of values over ruled symbols
    gives RuledFloats (a Range of a window's length reads them by its rule at bind time); else none."""
    dtype = graph.value(node.outputs[0]).dtype
    if dtype is not None and np.dtype(dtype) in (np.dtype(np.int32), np.dtype(np.int64)):
        return [settle(value, dtype)]
    ruled = graph.metadata.get(RULED) or set()
    if dtype is None or not is_float(dtype) or not ruled or \
            not all(isinstance(v, SymInt) and v.expr.symbols() & ruled for v in value.ravel()):
        return None
    out = np.empty(value.shape, dtype=object)
    out.ravel()[:] = [RuledFloat(float(v), v.expr) for v in value.ravel()]
    return [out]


@value_op("Gather")
def _gather(node: Node, args: list) -> list[np.ndarray]:
    return [np.asarray(np.take(args[0], np.asarray(args[1]).astype(np.int64), axis=int(node.attrs.get("axis", 0))),
                       dtype=object)]


#: ops that only move elements: their reference kernels run on object arrays as they are
MOVEMENT_OPS = frozenset({"Identity", "Unsqueeze", "Squeeze", "Concat", "Reshape", "Slice", "Split"})


def _elementwise(fn: Callable) -> ValueFn:
    def run(node: Node, args: list) -> list[np.ndarray]:
        a, b = (np.asarray(x, dtype=object) for x in args[:2])
        return [np.asarray(np.vectorize(fn, otypes=[object])(a, b), dtype=object)]
    return run


SHAPE_VALUE_OPS.update({
    "Add": _elementwise(lambda a, b: a + b),
    "Sub": _elementwise(lambda a, b: a - b),
    "Mul": _elementwise(lambda a, b: a * b),
    # ONNX integer Div truncates; dims are >= 0, and a negative operand is left unevaluated
    "Div": _elementwise(lambda a, b: a // b if a >= 0 and b > 0 else _no_value()),
    "Max": _elementwise(lambda a, b: _extreme("max", a, b)),
    "Min": _elementwise(lambda a, b: _extreme("min", a, b)),
    # comparisons of dims are decided at opt, like a shape rule's (the profile corners check them);
    # not those of a data-dependent dim (`boxes.numel() == 0`), which is only its bound there
    "Equal": _elementwise(lambda a, b: _compare("==", a, b)),
    "Less": _elementwise(lambda a, b: _compare("<", a, b)),
    "Greater": _elementwise(lambda a, b: _compare(">", a, b)),
})


def _compare(op: str, a: int, b: int) -> bool:
    """`a op b` of dims, decided at opt; of a data-dependent dim (only its bound there) only when
    every size gives the same answer: the dim against itself, or against a negative constant
    (expand_as exports Where(dims == -1, 1, dims)); ValueError (no value) otherwise."""
    value = {"==": int(a) == int(b), "<": int(a) < int(b), ">": int(a) > int(b)}[op]
    if not (is_data_dependent(a) or is_data_dependent(b)):
        return value
    if isinstance(a, SymInt) and isinstance(b, SymInt) and a.expr == b.expr:
        return op == "=="
    if any(not isinstance(v, SymInt) and int(v) < 0 for v in (a, b)):
        return value  # a size is >= 0 > the constant, whatever it is
    raise ValueError("a data-dependent dim is compared at run time")


def _reduction(fn: Callable) -> ValueFn:
    """ReduceMin/Max/Sum/Prod of dims (canonical form: axes an input): a detector's TopK reads
    k = ReduceMin(Concat(candidates, n)), the smaller of a constant and a filtered count."""
    def run(node: Node, args: list) -> list[np.ndarray]:
        x = np.asarray(args[0], dtype=object)
        axes = np.asarray(args[1]).reshape(-1).tolist() if len(args) > 1 and args[1] is not None else []
        if not axes and node.attrs.get("noop_with_empty_axes", 0):
            return [x]
        keep, out = bool(node.attrs.get("keepdims", 1)), x
        for axis in sorted({int(a) % x.ndim for a in axes} if axes else range(x.ndim), reverse=True):
            out = np.frompyfunc(fn, 2, 1).reduce(out, axis=axis, keepdims=keep)
        return [np.asarray(out, dtype=object)]
    return run


SHAPE_VALUE_OPS.update({
    "ReduceMax": _reduction(lambda a, b: _extreme("max", a, b)),
    "ReduceMin": _reduction(lambda a, b: _extreme("min", a, b)),
    "ReduceSum": _reduction(lambda a, b: a + b),
    "ReduceProd": _reduction(lambda a, b: a * b),
})


@value_op("Where")
def _where(node: Node, args: list) -> list[np.ndarray]:
    cond, x, y = (np.asarray(a, dtype=object) for a in args)
    return [np.asarray(np.where(cond.astype(bool), x, y), dtype=object)]


def _extreme(op: str, a: int, b: int) -> int:
    """max/min of two dims, an expression when one is a SymInt (not decided at opt: a ruled
    value symbol's corners are its opt, so nothing would check the choice)."""
    return SymInt(OPS[op][1](int(a), int(b)), extreme(op, term_of(a), term_of(b)))


def _no_value():
    raise ValueError("not a dim quotient")

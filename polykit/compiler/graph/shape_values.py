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

from polykit.compiler.ir.dtypes import is_float, to_numpy
from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Graph, Node
from polykit.compiler.graph.dim_floats import FLOAT_REDUCERS, FLOAT_VALUE_OPS, DimFloat, from_floats, holds_floats, \
    to_floats
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
    """An object array without SymInts (or RuledFloats, DimFloats) becomes a `dtype` (default int64)
    array; with them it stays an object array."""
    arr = np.asarray(value, dtype=object)
    if not any(isinstance(v, (SymInt, RuledFloat, DimFloat)) for v in arr.ravel()):
        return np.asarray(arr.tolist(), dtype=dtype or np.int64).reshape(arr.shape)
    return arr


def host_values(known: dict, inputs: "list[str] | tuple[str, ...]" = ()) -> dict[str, np.ndarray]:
    """The symbolic values among `known` (infer_shapes' result) but `inputs`: tensors a plan
    computes on the host from the input dims at run time instead of running their layers (not a
    float value, a ruled one's or dims': its layer runs; only shape chains and rules read it)."""
    return {name: value for name, value in known.items()
            if is_symbolic(value) and not _ruled_floats(value) and not holds_floats(value) and name not in inputs}


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
    if any(map(holds_floats, args)) and node.op_type not in MOVEMENT_OPS | {"Gather"}:  # moved as they are
        # float arithmetic of dims (polykit.compiler.graph.dim_floats)
        fn = FLOAT_VALUE_OPS.get(node.op_type) or (_reduce if node.op_type in FLOAT_REDUCERS else None)
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
        inner = Node(step["op"], list(step["inputs"]), list(step["outputs"]), dict(step["attrs"]))
        args = [local.get(n) if n else None for n in inner.inputs]
        if any(n and a is None for n, a in zip(inner.inputs, args)):
            return None
        # a step over plain values (Div of two static dims before a Mul with the batch) runs its reference
        out = symbolic_values(inner, local, graph) if any(map(is_symbolic, args)) else _concrete(inner, args)
        if out is None:
            return None
        local.update(zip(step["outputs"], out))
    return [local[name] for name in node.outputs]


def _concrete(node: Node, args: list) -> "list[np.ndarray] | None":
    fn = find_reference("", node.op_type)
    if fn is None:
        return None
    try:
        return [np.asarray(o) for o in fn(node, args)]
    except (ValueError, IndexError, TypeError, ArithmeticError, PolykitError):
        return None


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
    gives RuledFloats (a Range of a window's length reads them by its rule at bind time), of other
    dims DimFloats (float arithmetic of dims, dim_floats); float dims cast to ints are truncated."""
    dtype = graph.value(node.outputs[0]).dtype
    if dtype is None and node.op_type == "Cast" and "to" in node.attrs:  # a step inside a fused Pointwise node
        dtype = to_numpy(int(node.attrs["to"]))
    if dtype is None or _ruled_floats(value):
        return None
    ints = np.dtype(dtype) in (np.dtype(np.int32), np.dtype(np.int64))
    if holds_floats(value):  # float dims: truncated to ints, or cast to another float type
        if ints:
            return [settle(from_floats(value), dtype)]
        floats = to_floats(value, dtype) if is_float(dtype) else None
        return None if floats is None else [floats]
    if ints:
        return [settle(value, dtype)]
    if not is_float(dtype):
        return None
    ruled = graph.metadata.get(RULED) or set()
    if ruled and all(isinstance(v, SymInt) and v.expr.symbols() & ruled for v in value.ravel()):
        out = np.empty(value.shape, dtype=object)
        out.ravel()[:] = [RuledFloat(float(v), v.expr) for v in value.ravel()]
        return [out]
    floats = to_floats(value, dtype)
    return None if floats is None else [floats]


@value_op("Gather")
def _gather(node: Node, args: list) -> list[np.ndarray]:
    return [np.asarray(np.take(args[0], np.asarray(args[1]).astype(np.int64), axis=int(node.attrs.get("axis", 0))),
                       dtype=object)]


#: ops that only move elements: their reference kernels run on object arrays as they are
MOVEMENT_OPS = frozenset({"Identity", "Unsqueeze", "Squeeze", "Concat", "Reshape", "Slice", "Split", "Transpose",
                          "Expand", "Tile", "Flatten"})


def _elementwise(fn: Callable) -> ValueFn:
    """A binary op applied element by element with numpy broadcasting; a variadic one (Max, Min)
    folds its inputs left to right."""
    def run(node: Node, args: list) -> list[np.ndarray]:
        arrays = [np.asarray(x, dtype=object) for x in args if x is not None]
        out = arrays[0]
        for b in arrays[1:]:
            out = np.asarray(np.vectorize(fn, otypes=[object])(out, b), dtype=object)
        return [out]
    return run


def _unary(fn: Callable) -> ValueFn:
    def run(node: Node, args: list) -> list[np.ndarray]:
        a = np.asarray(args[0], dtype=object)
        return [np.asarray(np.vectorize(fn, otypes=[object])(a), dtype=object).reshape(a.shape)]
    return run


def _trunc_div(a: int, b: int) -> int:
    """ONNX integer Div: the quotient truncated toward zero (C's and onnxruntime's), the signs
    decided at opt (dims are >= 0; a negated dim stays negative over the profile, which the
    corners check)."""
    q = abs(a) // abs(b)
    return q if (int(a) >= 0) == (int(b) > 0) else -q


def _mod(node: Node, args: list) -> list[np.ndarray]:
    """ONNX Mod: fmod=0 takes the divisor's sign (Python's %, an exact expression: Swin's
    (-W) % window); fmod=1 the dividend's (C's fmod, the signs decided at opt)."""
    if node.attrs.get("fmod", 0):
        return _elementwise(lambda a, b: abs(a) % abs(b) if int(a) >= 0 else -(abs(a) % abs(b)))(node, args)
    return _elementwise(lambda a, b: a % b)(node, args)


def _reduce(node: Node, args: list) -> list[np.ndarray]:
    """ReduceSum/Prod/Max/Min of a shape vector (numel = ReduceProd(Shape(x))): axes from the
    attribute (before opset 18; ReduceSum 13) or the second input, keepdims, noop_with_empty_axes."""
    x = np.asarray(args[0], dtype=object)
    axes = node.attrs.get("axes")
    if len(args) > 1 and args[1] is not None:
        axes = [int(a) for a in np.asarray(args[1]).ravel()]
    if not axes:
        if node.attrs.get("noop_with_empty_axes", 0):
            return [x]
        axes = list(range(x.ndim))
    axes = sorted({int(a) % max(x.ndim, 1) for a in axes})
    keep = [a for a in range(x.ndim) if a not in axes]
    moved = np.transpose(x, keep + axes).reshape([x.shape[a] for a in keep] + [-1])
    combine = (FLOAT_REDUCERS if holds_floats(x) else REDUCERS)[node.op_type]
    out = np.empty(moved.shape[:-1], dtype=object)
    for index in np.ndindex(out.shape):
        values = list(moved[index])
        if not values and node.op_type in ("ReduceMax", "ReduceMin"):
            raise ValueError("an empty max/min")
        acc = 1 if node.op_type == "ReduceProd" else 0
        for i, v in enumerate(values):
            acc = v if i == 0 else combine(acc, v)
        out[index] = acc
    if node.attrs.get("keepdims", 1):
        out = out.reshape([1 if a in axes else x.shape[a] for a in range(x.ndim)])
    return [out]


#: how each Reduce op combines two elements of a shape vector
REDUCERS: dict[str, Callable] = {
    "ReduceSum": lambda a, b: a + b,
    "ReduceProd": lambda a, b: a * b,
    "ReduceMax": lambda a, b: _extreme("max", a, b),
    "ReduceMin": lambda a, b: _extreme("min", a, b),
}

SHAPE_VALUE_OPS.update({
    "Add": _elementwise(lambda a, b: a + b),
    "Sub": _elementwise(lambda a, b: a - b),
    "Mul": _elementwise(lambda a, b: a * b),
    "Div": _elementwise(_trunc_div),
    "Mod": _mod,
    "Neg": _unary(lambda a: -a),
    "Abs": _unary(abs),  # the sign decided at opt
    "Max": _elementwise(lambda a, b: _extreme("max", a, b)),
    "Min": _elementwise(lambda a, b: _extreme("min", a, b)),
    # comparisons of dims are decided at opt, like a shape rule's (the profile corners check them);
    # not those of a data-dependent dim (`boxes.numel() == 0`), which is only its bound there
    "Equal": _elementwise(lambda a, b: _compare("==", a, b)),
    "Less": _elementwise(lambda a, b: _compare("<", a, b)),
    "Greater": _elementwise(lambda a, b: _compare(">", a, b)),
    "LessOrEqual": _elementwise(lambda a, b: _compare("<=", a, b)),
    "GreaterOrEqual": _elementwise(lambda a, b: _compare(">=", a, b)),
    **{op: _reduce for op in REDUCERS},
})


def _compare(op: str, a: int, b: int) -> bool:
    """`a op b` of dims, decided at opt; of a data-dependent dim (only its bound there) only when
    every size gives the same answer: the dim against itself, or against a negative constant
    (expand_as exports Where(dims == -1, 1, dims)); ValueError (no value) otherwise."""
    value = {"==": int(a) == int(b), "<": int(a) < int(b), ">": int(a) > int(b),
             "<=": int(a) <= int(b), ">=": int(a) >= int(b)}[op]
    if not (is_data_dependent(a) or is_data_dependent(b)):
        return value
    if isinstance(a, SymInt) and isinstance(b, SymInt) and a.expr == b.expr:
        return op in ("==", "<=", ">=")
    if any(not isinstance(v, SymInt) and int(v) < 0 for v in (a, b)):
        return value  # a size is >= 0 > the constant, whatever it is
    raise ValueError("a data-dependent dim is compared at run time")


@value_op("Where")
def _where(node: Node, args: list) -> list[np.ndarray]:
    cond, x, y = (np.asarray(a, dtype=object) for a in args)
    return [np.asarray(np.where(cond.astype(bool), x, y), dtype=object)]


def _extreme(op: str, a: int, b: int) -> int:
    """max/min of two dims, an expression when one is a SymInt (not decided at opt: a ruled
    value symbol's corners are its opt, so nothing would check the choice)."""
    return SymInt(OPS[op][1](int(a), int(b)), extreme(op, term_of(a), term_of(b)))


#: every op whose outputs shape inference computes over symbolic shape values (docs/DYNAMIC_SHAPES.md's
#: table): Shape and Size make them, casts keep them, the rest compute on them (FLOAT_VALUE_OPS on float dims)
EVALUATED_OPS = frozenset({"Shape", "Size"} | CAST_OPS | set(SHAPE_VALUE_OPS) | MOVEMENT_OPS | set(FLOAT_VALUE_OPS))


def stopped_expression(graph: Graph, known: dict, name: str) -> "tuple[Node | None, str]":
    """Why tensor `name`'s dims are no expressions of the input dims: its producer, and a sentence
    naming the shape-chain node that stopped them (the first, in chain order, whose operands had
    values at build time but whose output got none) and what stopped it ("" when its own shape
    rule gave no dims from known operands)."""
    producers = graph.producers()
    node = producers.get(name)
    if node is None:
        return None, ""

    def unknown(n: Node) -> list[str]:  # small operands without a build-time value
        return [i for i in n.inputs if i and known.get(i) is None and _small(graph.value(i).shape)]

    seen: set[str] = set()
    frontier = unknown(node)
    while frontier:
        tensor = frontier.pop(0)
        if tensor in seen:
            continue
        seen.add(tensor)
        chain = producers.get(tensor)
        if chain is None:
            return node, f"it reads {tensor!r}, a graph input without build-time values (give it profile values)"
        deeper = unknown(chain)
        if deeper:
            frontier.extend(deeper)
            continue
        return node, f"it reads {tensor!r}, which {chain.describe()} computes from the dims: {_stopper(chain, known, graph)}"
    return node, ""


def _stopper(node: Node, known: dict, graph: Graph) -> str:
    """What stops `node` (a fused Pointwise group: its first step that does) from giving a value."""
    if node.domain == POLYKIT_DOMAIN and node.op_type == "Pointwise":
        for step in node.attrs.get("body", ()):
            if step["op"] not in EVALUATED_OPS:
                return f"its fused step {step['op']} -> {step['outputs'][0]!r}: " + _op_stopper(step["op"], [])
        return "a fused step over these values gives none"
    if node.domain not in ("", "ai.onnx"):
        return f"{node.domain} ops are not evaluated over symbolic dims"
    return _op_stopper(node.op_type, [known.get(i) for i in node.inputs if i])


def _op_stopper(op: str, args: list) -> str:
    floats = any(a is not None and (a.dtype.kind == "f" or holds_floats(a)) for a in args)
    if op not in EVALUATED_OPS or (floats and op not in FLOAT_VALUE_OPS.keys() | FLOAT_REDUCERS.keys() | CAST_OPS
                                   | MOVEMENT_OPS | {"Gather"}):
        return f"{op} is not evaluated over symbolic dims" + \
            (" of a float type (dim_floats.FLOAT_VALUE_OPS, FLOAT_REDUCERS list those that are)" if floats else
             " (shape_values.EVALUATED_OPS lists those that are)")
    return f"its operands {[a.tolist() if a is not None else None for a in args]} give no value (a division by " \
           f"zero or by a dim expression, a sign or comparison that differs)"


def _small(shape: "tuple | None") -> bool:
    """A shape-tensor-like shape: static, rank <= 1, a few elements."""
    return shape is not None and len(shape) <= 1 and all(isinstance(d, int) and not isinstance(d, SymInt) and d <= 64
                                                          for d in shape)

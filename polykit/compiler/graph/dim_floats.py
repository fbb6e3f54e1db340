"""Float values of dims in shape chains: `int(x.shape[2] * 0.5)`, F.interpolate's recomputed sizes,
torchvision's detection transform `floor(h * min(320 / min(h, w), 640 / max(h, w)))`, which exporters
write as Cast(float) -> Mul/Div/Reciprocal/Min -> Floor -> Cast(int64).

A `DimFloat` is such a value during a build: a float whose value is the one the graph computes at
opt, in the graph's float type (float32 or float64, rounded at every step as onnxruntime rounds
it), and whose `expr` is that computation over the dims' expressions, made of the float ops of
polykit.compiler.ir.symbolic.FLOAT_OPS. A Cast of dims to a float type makes them; Add, Sub, Mul,
Div, Neg, Reciprocal, Min, Max, ReduceMax and ReduceMin with float constants or with each other keep them; Floor and
Ceil keep them (a float holding floor(x), exactly), and a Cast back to an integer type gives a
dim again (`trunc`: a SymInt whose expression the binder evaluates once per shape set, with the
same rounding). So a float dim is never an exact fraction that rounds differently from the graph.
Anything else (Sqrt, float16) gives no value, so its consumers get no dim expression and the
build says which node stopped it (shape_values.stopped_expression).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from polykit.compiler.ir.graph import Node
from polykit.compiler.ir.symbolic import FLOAT_OPS, FLOAT_TYPES, Expr, SymInt, Term, float_type, term_of

#: numpy float type -> the cast op of symbolic.FLOAT_TYPES
CAST_OF = {np.dtype(t): name for name, t in FLOAT_TYPES.items()}


class DimFloat(float):
    """A float computed from dims: its value at opt (in its float type) and its expression `expr`."""

    expr: Expr
    cast: str  # "f32" or "f64": the float type

    def __new__(cls, value, expr: Expr, cast: str) -> "DimFloat":
        obj = super().__new__(cls, float(value))
        obj.expr, obj.cast = expr, cast
        return obj

    def __repr__(self) -> str:
        return f"DimFloat({float(self)!r}, {self.expr})"

    def __reduce__(self):  # copy.deepcopy keeps the parts
        return DimFloat, (float(self), self.expr, self.cast)


def holds_floats(value: "np.ndarray | None") -> bool:
    return value is not None and value.dtype == object and any(isinstance(v, DimFloat) for v in value.ravel())


def _part(x, cast: str) -> "tuple[object, Term]":
    """(value as the float type's numpy scalar, expression) of an operand element."""
    kind = FLOAT_TYPES[cast]
    if isinstance(x, DimFloat):
        if x.cast != cast:
            raise TypeError("float operands of two types")
        return kind(float(x)), x.expr
    if isinstance(x, SymInt):
        return kind(int(x)), Expr(cast, (x.expr,))
    value = kind(x)
    return value, Expr(cast, (float(value),))


def _float_op(op: str) -> Callable:
    """`op` over operand elements in float type `cast` (a DimFloat's, when not given): a DimFloat when
    one is a dim's, else the plain value (a constant element beside dims in the same array)."""
    fn = FLOAT_OPS[op][1]

    def run(*args, cast: "str | None" = None):
        cast = cast or next((a.cast for a in args if isinstance(a, DimFloat)), None)
        if cast is None:  # two plain floats (a Min/Max fold): exact, no type needed
            if op not in ("fmin", "fmax"):
                raise TypeError("float arithmetic of constants without a float type")
            return fn(*args)
        parts = [_part(a, cast) for a in args]
        value = fn(*(p[0] for p in parts))
        if not any(isinstance(a, (DimFloat, SymInt)) for a in args):
            return value
        return DimFloat(value, Expr(op, tuple(p[1] for p in parts)), cast)
    return run


def _rounded(op: str) -> Callable:
    """Floor/Ceil: the float holding the rounded value (exactly: floor of a float is one of its type)."""
    fn = FLOAT_OPS[op][1]

    def run(a, cast: "str | None" = None):
        cast = a.cast if isinstance(a, DimFloat) else cast
        value, expr = _part(a, cast)
        if not isinstance(a, DimFloat):
            return FLOAT_TYPES[cast](fn(value))
        return DimFloat(fn(value), Expr(cast, (Expr(op, (expr,)),)), cast)
    return run


def to_int(a) -> int:
    """A float dim cast to an integer type: truncated toward zero (`trunc`); a float that holds an
    int of its own type's ops (Floor's, Ceil's) is that int's expression."""
    if not isinstance(a, DimFloat):
        return int(a)
    inner = a.expr.args[0] if a.expr.op == a.cast else None
    if isinstance(inner, Expr) and inner.op in ("floor", "ceil", "trunc") and float_type(inner.args[0]) == a.cast:
        return SymInt(int(float(a)), inner)
    return SymInt(int(float(a)), Expr("trunc", (a.expr,)))


def _elementwise(fn: Callable) -> Callable[[Node, list], list[np.ndarray]]:
    """fn element by element (numpy broadcasting; a variadic Min/Max folds left to right), in the
    float type of the arrays' DimFloats."""
    def run(node: Node, args: list) -> list[np.ndarray]:
        arrays = [np.asarray(a, dtype=object) for a in args if a is not None]
        cast = next(v.cast for a in arrays for v in a.ravel() if isinstance(v, DimFloat))
        one = np.vectorize(lambda *xs: fn(*xs, cast=cast), otypes=[object])
        out = arrays[0]
        for b in arrays[1:]:
            out = np.asarray(one(out, b), dtype=object)
        if len(arrays) == 1:
            out = np.asarray(one(out), dtype=object).reshape(out.shape)
        return [out]
    return run


#: op -> fn(node, args) over object arrays holding DimFloats (and float constants)
FLOAT_VALUE_OPS: dict[str, Callable[[Node, list], list[np.ndarray]]] = {
    "Add": _elementwise(_float_op("f+")),
    "Sub": _elementwise(_float_op("f-")),
    "Mul": _elementwise(_float_op("f*")),
    "Div": _elementwise(_float_op("f/")),
    "Min": _elementwise(_float_op("fmin")),
    "Max": _elementwise(_float_op("fmax")),
    "Neg": _elementwise(lambda a, cast: _float_op("f*")(a, -1.0, cast=cast)),
    "Reciprocal": _elementwise(lambda a, cast: _float_op("f/")(1.0, a, cast=cast)),
    "Floor": _elementwise(_rounded("floor")),
    "Ceil": _elementwise(_rounded("ceil")),
}


#: Reduce op -> how it combines two float dims (shape_values' reductions of a shape vector)
FLOAT_REDUCERS: dict[str, Callable] = {"ReduceMax": _float_op("fmax"), "ReduceMin": _float_op("fmin")}


def to_floats(value: np.ndarray, dtype) -> "np.ndarray | None":
    """Dims (ints and SymInts) or float dims cast to float type `dtype` (None: a type no float op takes)."""
    cast = CAST_OF.get(np.dtype(dtype))
    if cast is None:
        return None
    kind = FLOAT_TYPES[cast]

    def one(v):
        if isinstance(v, DimFloat):
            return v if v.cast == cast else DimFloat(kind(float(v)), Expr(cast, (v.expr,)), cast)
        if isinstance(v, SymInt):
            return DimFloat(kind(int(v)), Expr(cast, (term_of(v),)), cast)
        return kind(v)

    out = np.empty(value.shape, dtype=object)
    out.ravel()[:] = [one(v) for v in value.ravel()]
    return out


def from_floats(value: np.ndarray) -> np.ndarray:
    """Float dims cast to an integer type."""
    out = np.empty(value.shape, dtype=object)
    out.ravel()[:] = [to_int(v) for v in value.ravel()]
    return out

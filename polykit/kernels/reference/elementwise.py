"""Reference kernels: elementwise math, comparisons, logic and variadic ops (numpy broadcasting)."""

from __future__ import annotations

import math

import numpy as np

from polykit.compiler.dtypes import is_float
from polykit.kernels.registry import reference

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _same(fn):
    """Wrap a numpy ufunc so the result keeps the first input's dtype."""

    def kernel(node, inputs):
        x = inputs[0]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return [np.asarray(fn(*inputs)).astype(x.dtype, copy=False)]

    return kernel


def _round_half_even(x):
    return np.round(x)


UNARY = {
    "Abs": np.abs, "Neg": np.negative, "Sqrt": np.sqrt, "Exp": np.exp, "Log": np.log,
    "Reciprocal": np.reciprocal, "Floor": np.floor, "Ceil": np.ceil, "Round": _round_half_even,
    "Sign": np.sign, "Sin": np.sin, "Cos": np.cos, "Tan": np.tan, "Asin": np.arcsin,
    "Acos": np.arccos, "Atan": np.arctan, "Sinh": np.sinh, "Cosh": np.cosh, "Asinh": np.arcsinh,
    "Acosh": np.arccosh, "Atanh": np.arctanh, "Not": np.logical_not, "BitwiseNot": np.invert,
}
for _op, _fn in UNARY.items():
    reference(_op)(_same(_fn))


@reference("Erf")
def erf(node, inputs):
    x = inputs[0]
    return [_erf(x.astype(np.float64)).astype(x.dtype)]


@reference("Identity")
def identity(node, inputs):
    return [inputs[0]]


BINARY = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "BitwiseAnd": np.bitwise_and,
    "BitwiseOr": np.bitwise_or, "BitwiseXor": np.bitwise_xor,
}
for _op, _fn in BINARY.items():
    reference(_op)(_same(_fn))


@reference("Div")
def div(node, inputs):
    a, b = inputs
    if np.issubdtype(a.dtype, np.integer):
        # ONNX integer division truncates toward zero (C semantics), numpy floors.
        with np.errstate(divide="ignore"):
            q = np.trunc(a.astype(np.float64) / b.astype(np.float64))
        return [q.astype(a.dtype)]
    return [np.divide(a, b).astype(a.dtype, copy=False)]


@reference("Pow")
def pow_(node, inputs):
    a, b = inputs
    if np.issubdtype(a.dtype, np.integer):
        return [np.power(a.astype(np.int64), b.astype(np.int64)).astype(a.dtype)]
    return [np.power(a, b.astype(a.dtype) if is_float(b.dtype) else b).astype(a.dtype)]


@reference("Mod")
def mod(node, inputs):
    a, b = inputs
    if node.attrs.get("fmod", 0) == 1:
        return [np.fmod(a, b).astype(a.dtype)]
    return [np.mod(a, b).astype(a.dtype)]


@reference("BitShift")
def bit_shift(node, inputs):
    a, b = inputs
    if node.attrs.get("direction", "LEFT") == "LEFT":
        return [np.left_shift(a, b).astype(a.dtype)]
    return [np.right_shift(a, b).astype(a.dtype)]


COMPARE = {
    "Equal": np.equal, "Less": np.less, "Greater": np.greater, "LessOrEqual": np.less_equal,
    "GreaterOrEqual": np.greater_equal, "And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor,
}


def _compare(fn):
    def kernel(node, inputs):
        return [np.asarray(fn(inputs[0], inputs[1]))]

    return kernel


for _op, _fn in COMPARE.items():
    reference(_op)(_compare(_fn))


def _variadic(fn, mean=False):
    def kernel(node, inputs):
        xs = [x for x in inputs if x is not None]
        out = xs[0]
        for x in xs[1:]:
            out = fn(out, x)
        if mean:
            out = out / len(xs)
        return [np.asarray(out).astype(xs[0].dtype)]

    return kernel


reference("Min")(_variadic(np.minimum))
reference("Max")(_variadic(np.maximum))
reference("Sum")(_variadic(np.add))
reference("Mean")(_variadic(np.add, mean=True))


@reference("Where")
def where(node, inputs):
    c, a, b = inputs
    return [np.where(c, a, b).astype(a.dtype)]


@reference("IsNaN")
def is_nan(node, inputs):
    return [np.isnan(inputs[0])]


@reference("IsInf")
def is_inf(node, inputs):
    x = inputs[0]
    pos, neg = node.attrs.get("detect_positive", 1), node.attrs.get("detect_negative", 1)
    return [(np.isposinf(x) & bool(pos)) | (np.isneginf(x) & bool(neg))]

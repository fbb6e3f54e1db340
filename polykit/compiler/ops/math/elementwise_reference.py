"""Elementwise math, comparisons, logic and variadic ops: numpy reference kernels and their
rows of the elementwise op table (polykit.compiler.ops.elementwise_table)."""

from __future__ import annotations

import math

import numpy as np

from polykit.compiler.ir.dtypes import is_float
from polykit.compiler.ops.math.elementwise import broadcast_bool, broadcast_first, predicate, same_as_input, variadic, where
from polykit.compiler.ops.elementwise_table import (ANY_KIND, FLOAT, INT, NUMERIC, ElementwiseOp, Fold, Infix, call, literal,
                                         register_elementwise)
from polykit.compiler.ops.tensor.cast_reference import float_to_int

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


def erf(node, inputs):
    x = inputs[0]
    return [_erf(x.astype(np.float64)).astype(x.dtype)]


def identity(node, inputs):
    return [inputs[0]]


def div(node, inputs):
    a, b = inputs
    if np.issubdtype(a.dtype, np.integer):
        # ONNX integer division truncates toward zero (C semantics), numpy floors. By zero
        # (undefined in ONNX) the quotient is +-inf or NaN, which polykit's float -> integer
        # rule (reference/cast.py) makes the type's max / min or 0.
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.trunc(a.astype(np.float64) / b.astype(np.float64))
        return [float_to_int(q, a.dtype)]
    return [np.divide(a, b).astype(a.dtype, copy=False)]


def pow_(node, inputs):
    a, b = inputs
    if np.issubdtype(a.dtype, np.integer):  # a float exponent truncates (NaN -> 0: cast.py's rule)
        e = float_to_int(b, np.int64) if is_float(b.dtype) else b.astype(np.int64)
        return [np.power(a.astype(np.int64), e).astype(a.dtype)]
    return [np.power(a, b.astype(a.dtype) if is_float(b.dtype) else b).astype(a.dtype)]


def mod(node, inputs):
    a, b = inputs
    if node.attrs.get("fmod", 0) == 1:
        return [np.fmod(a, b).astype(a.dtype)]
    return [np.mod(a, b).astype(a.dtype)]


def bit_shift(node, inputs):
    a, b = inputs
    if node.attrs.get("direction", "LEFT") == "LEFT":
        return [np.left_shift(a, b).astype(a.dtype)]
    return [np.right_shift(a, b).astype(a.dtype)]


def _compare(fn):
    def kernel(node, inputs):
        return [np.asarray(fn(inputs[0], inputs[1]))]

    return kernel


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


def where_(node, inputs):
    c, a, b = inputs
    return [np.where(c, a, b).astype(a.dtype)]


def is_nan(node, inputs):
    return [np.isnan(inputs[0])]


def is_inf(node, inputs):
    x = inputs[0]
    pos, neg = node.attrs.get("detect_positive", 1), node.attrs.get("detect_negative", 1)
    return [(np.isposinf(x) & bool(pos)) | (np.isneginf(x) & bool(neg))]


def _cuda_mod(a, at):
    return f"{'pk_fmod' if at.get('fmod', 0) else 'pk_mod'}({a[0]}, {a[1]})"


def _cuda_shift(a, at):
    return f"{'pk_shl' if at.get('direction', 'LEFT') == 'LEFT' else 'pk_shr'}({a[0]}, {a[1]})"


def _cuda_mean(a, at):
    present = [x for x in a if x]
    return f"pk_div({Fold('pk_add')(present, at)}, {len(present)})"


def _cuda_isinf(a, at):
    return f"pk_isinf({a[0]}, {literal(bool(at.get('detect_positive', 1)))}, {literal(bool(at.get('detect_negative', 1)))})"


#: unary math: (op, numpy function, CUDA function, dtype kinds, NetworkDefinition add_unary)
UNARY = (
    ("Abs", np.abs, "pk_abs", NUMERIC, True), ("Neg", np.negative, "pk_neg", NUMERIC, True),
    ("Sqrt", np.sqrt, "pk_sqrt", FLOAT, True), ("Exp", np.exp, "pk_exp", FLOAT, True),
    ("Log", np.log, "pk_log", FLOAT, True), ("Reciprocal", np.reciprocal, "pk_reciprocal", FLOAT, True),
    ("Floor", np.floor, "pk_floor", FLOAT, True), ("Ceil", np.ceil, "pk_ceil", FLOAT, True),
    ("Round", _round_half_even, "pk_round", FLOAT, True), ("Sign", np.sign, "pk_sign", NUMERIC, True),
    ("Sin", np.sin, "pk_sin", FLOAT, True), ("Cos", np.cos, "pk_cos", FLOAT, True),
    ("Tan", np.tan, "pk_tan", FLOAT, True), ("Asin", np.arcsin, "pk_asin", FLOAT, True),
    ("Acos", np.arccos, "pk_acos", FLOAT, True), ("Atan", np.arctan, "pk_atan", FLOAT, True),
    ("Sinh", np.sinh, "pk_sinh", FLOAT, True), ("Cosh", np.cosh, "pk_cosh", FLOAT, True),
    ("Asinh", np.arcsinh, "pk_asinh", FLOAT, True), ("Acosh", np.arccosh, "pk_acosh", FLOAT, True),
    ("Atanh", np.arctanh, "pk_atanh", FLOAT, True), ("BitwiseNot", np.invert, "pk_bitnot", INT, False),
)
#: binary arithmetic keeping the first input's dtype: (op, numpy function, CUDA function, kinds, add_elementwise)
BINARY = (
    ("Add", np.add, "pk_add", NUMERIC, True), ("Sub", np.subtract, "pk_sub", NUMERIC, True),
    ("Mul", np.multiply, "pk_mul", NUMERIC, True), ("BitwiseAnd", np.bitwise_and, "pk_band", INT, True),
    ("BitwiseOr", np.bitwise_or, "pk_bor", INT, True), ("BitwiseXor", np.bitwise_xor, "pk_bxor", INT, True),
)
#: comparisons and logic (bool result): (op, numpy function, C operator, kinds, add_elementwise name)
COMPARE = (
    ("Equal", np.equal, "==", ANY_KIND, "equal"), ("Less", np.less, "<", NUMERIC, "less"),
    ("Greater", np.greater, ">", NUMERIC, "greater"), ("LessOrEqual", np.less_equal, "<=", NUMERIC, "less_equal"),
    ("GreaterOrEqual", np.greater_equal, ">=", NUMERIC, "greater_equal"),
)
LOGIC = (("And", np.logical_and, "&&"), ("Or", np.logical_or, "||"), ("Xor", np.logical_xor, "!="))

ROWS = [
    *(ElementwiseOp(op, same_as_input, _same(fn), call(c), kinds, api="unary" if api else None)
      for op, fn, c, kinds, api in UNARY),
    ElementwiseOp("Erf", same_as_input, erf, call("pk_erf"), api="unary"),
    ElementwiseOp("Not", same_as_input, _same(np.logical_not), call("pk_not"), ANY_KIND, "bool", ("cond",), api="unary"),
    ElementwiseOp("Identity", same_as_input, identity, lambda a, at: a[0], ANY_KIND, fusable=False),
    ElementwiseOp("IsNaN", predicate, is_nan, call("pk_isnan"), result="bool"),
    ElementwiseOp("IsInf", predicate, is_inf, _cuda_isinf, result="bool",
                  variants=({}, {"detect_positive": 0}, {"detect_negative": 0})),
    *(ElementwiseOp(op, broadcast_first, _same(fn), call(c), kinds, arity=2, api="binary" if api else None)
      for op, fn, c, kinds, api in BINARY),
    ElementwiseOp("Div", broadcast_first, div, call("pk_div"), NUMERIC, arity=2, api="binary"),
    ElementwiseOp("Pow", broadcast_first, pow_, call("pk_pow"), NUMERIC, roles=("data", "exp"), arity=2,
                  api="binary"),
    ElementwiseOp("Mod", broadcast_first, mod, _cuda_mod, NUMERIC, arity=2, variants=({}, {"fmod": 1}), api="binary"),
    ElementwiseOp("BitShift", broadcast_first, bit_shift, _cuda_shift, INT, arity=2,
                  variants=({}, {"direction": "RIGHT"})),
    *(ElementwiseOp(op, broadcast_bool, _compare(fn), Infix(c), kinds, "bool", arity=2, api="binary", api_name=name)
      for op, fn, c, kinds, name in COMPARE),
    *(ElementwiseOp(op, broadcast_bool, _compare(fn), Infix(c, "(bool)"), ANY_KIND, "bool", ("cond", "cond"),
                    arity=2, api="binary") for op, fn, c in LOGIC),
    ElementwiseOp("Min", variadic, _variadic(np.minimum), Fold("pk_min"), NUMERIC, arity=3, api="binary"),
    ElementwiseOp("Max", variadic, _variadic(np.maximum), Fold("pk_max"), NUMERIC, arity=3, api="binary"),
    ElementwiseOp("Sum", variadic, _variadic(np.add), Fold("pk_add"), NUMERIC, arity=3),
    ElementwiseOp("Mean", variadic, _variadic(np.add, mean=True), _cuda_mean, NUMERIC, arity=3),
    ElementwiseOp("Where", where, where_, lambda a, at: f"({a[0]} ? {a[1]} : {a[2]})", ANY_KIND, "second", ("cond",),
                  arity=3),
]
for _row in ROWS:
    register_elementwise(_row)

"""Elementwise ops: unary math, broadcasting binary arithmetic, comparisons, logic, variadic."""

from __future__ import annotations

import numpy as np

from polykit.compiler.registry import InferContext, broadcast_shapes, shape_rule

UNARY_SAME = (
    "Abs", "Neg", "Sqrt", "Exp", "Log", "Erf", "Reciprocal", "Floor", "Ceil", "Round", "Sign",
    "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Not",
    "Identity", "BitwiseNot",
)
BINARY_SAME = ("Add", "Sub", "Mul", "Div", "Pow", "Mod", "BitwiseAnd", "BitwiseOr", "BitwiseXor",
               "BitShift")
COMPARE = ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual")
LOGIC = ("And", "Or", "Xor")
VARIADIC = ("Min", "Max", "Sum", "Mean")
BOOL = np.dtype(np.bool_)


@shape_rule(*UNARY_SAME)
def _unary(ctx: InferContext):
    return [(ctx.dtype(0), ctx.shape(0))]


@shape_rule(*BINARY_SAME)
def _binary(ctx: InferContext):
    return [(ctx.dtype(0), broadcast_shapes(ctx, ctx.shape(0), ctx.shape(1)))]


@shape_rule(*COMPARE, *LOGIC)
def _compare(ctx: InferContext):
    return [(BOOL, broadcast_shapes(ctx, ctx.shape(0), ctx.shape(1)))]


@shape_rule(*VARIADIC)
def _variadic(ctx: InferContext):
    shapes = [ctx.shape(i) for i in range(ctx.n_inputs) if ctx.has(i)]
    return [(ctx.dtype(0), broadcast_shapes(ctx, *shapes))]


@shape_rule("Where")
def _where(ctx: InferContext):
    return [(ctx.dtype(1), broadcast_shapes(ctx, ctx.shape(0), ctx.shape(1), ctx.shape(2)))]


@shape_rule("IsNaN", "IsInf")
def _is_special(ctx: InferContext):
    return [(BOOL, ctx.shape(0))]

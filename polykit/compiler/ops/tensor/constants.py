"""Constant-producing ops: Constant, ConstantOfShape, Range, EyeLike.

Constant is canonicalized to one form on import: its value always sits in the `value`
tensor attribute, whichever of value / value_float(s) / value_int(s) / value_string(s) /
sparse_value (made dense on import) the model used.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from polykit.compiler.ir import dtypes
from polykit.compiler.ir.graph import Node
from polykit.compiler.ops.tensor.shape_ops import const_ints, fresh_dim, unknown_dims
from polykit.compiler.ir.symbolic import SymInt, ceil_div
from polykit.compiler.ops.registry import InferContext, ImportContext, importer, shape_rule
from polykit.errors import NodeAttributeError

#: Constant attribute -> numpy dtype of the array it makes
CONSTANT_ATTRS = {
    "value": None, "sparse_value": None, "value_float": np.float32, "value_floats": np.float32,
    "value_int": np.int64, "value_ints": np.int64, "value_string": object, "value_strings": object,
}


def constant_value(node: Node) -> np.ndarray:
    """The array a Constant node produces (any of its attribute forms)."""
    present = [k for k in CONSTANT_ATTRS if k in node.attrs]
    if len(present) != 1:
        raise NodeAttributeError(
            f"Constant needs exactly one value attribute, found {present or 'none'}",
            where=node.describe(), hint=f"set one of {', '.join(CONSTANT_ATTRS)}",
        )
    key = present[0]
    dtype = CONSTANT_ATTRS[key]
    return np.asarray(node.attrs[key]) if dtype is None else np.asarray(node.attrs[key], dtype=dtype)


@importer("Constant", since=1)
def _constant_to_value(node: Node, ctx: ImportContext):
    node.attrs = {"value": constant_value(node)}


@shape_rule("Constant")
def _constant(ctx: InferContext):
    value = constant_value(ctx.node)
    return [(value.dtype, value.shape)]


def constant_of_shape_fill(node: Node) -> np.ndarray:
    """The one-element fill tensor of ConstantOfShape (default float32 0)."""
    value = node.attrs.get("value")
    if value is None:
        return np.zeros(1, np.float32)
    value = np.asarray(value)
    if value.size != 1:
        raise NodeAttributeError(f"value must hold one element, it holds {value.size}", where=node.describe())
    return value.reshape(1)


@shape_rule("ConstantOfShape")
def _constant_of_shape(ctx: InferContext):
    dtype = constant_of_shape_fill(ctx.node).dtype
    shape = const_ints(ctx, 0)
    if shape is None:
        spec = ctx.shape(0)
        return [(dtype, unknown_dims(spec[0] if spec and isinstance(spec[0], int) else None))]
    if any(d < 0 for d in shape):
        raise ctx.fail(f"shape {shape} has a negative dim")
    return [(dtype, tuple(shape))]


def range_length(start, limit, delta) -> int:
    """Elements of Range: max(ceil((limit - start) / delta), 0); integer operands of a dim
    expression (SymInt) keep it. Operands are scalars or one-element tensors (function-expanded
    graphs pass the [1]-shaped outputs of Split, as ONNX's reference accepts)."""
    items = [range_scalar(v) for v in (start, limit, delta)]
    if any(isinstance(v, SymInt) for v in items) and all(isinstance(v, int) for v in items):
        return max(ceil_div(items[1] - items[0], items[2]), 0)
    return max(int(np.ceil((float(items[1]) - float(items[0])) / float(items[2]))), 0)


def range_scalar(value) -> Any:
    """The one element of a Range operand (a scalar or a one-element tensor), as a Python number."""
    item = np.asarray(value).reshape(-1)[0]
    return item.item() if isinstance(item, np.generic) else item


@shape_rule("Range")
def _range(ctx: InferContext):
    start, limit, delta = ctx.const(0), ctx.const(1), ctx.const(2)
    if start is None or limit is None or delta is None:
        return [(ctx.dtype(0), (fresh_dim(ctx, "range"),))]
    if any(np.size(v) != 1 for v in (start, limit, delta)):
        raise ctx.fail("start, limit and delta must be scalars", hint="give Range 0-D (or one-element) operands")
    if range_scalar(delta) == 0:
        raise ctx.fail("delta is 0", hint="Range needs a non-zero delta")
    return [(ctx.dtype(0), (range_length(start, limit, delta),))]


@shape_rule("EyeLike")
def _eye_like(ctx: InferContext):
    if "dtype" in ctx.node.attrs:
        dtype = dtypes.to_numpy(ctx.attr("dtype"), where=ctx.node.describe())
    else:
        dtype = ctx.dtype(0)
    shape = ctx.shape(0)
    if shape is not None and len(shape) != 2:
        raise ctx.fail(f"input has rank {len(shape)}", hint="EyeLike takes a 2-D input")
    return [(dtype, shape)]

"""Cast, CastLike and BitCast.

Canonical Cast: `to` is an int (TensorProto.DataType). Cast-1..5 named the type with a
string; the importer maps it. A target type polykit does not run (bfloat16, float8, int4,
...) is a PolykitError at import, naming the node. `saturate` only affects float8 targets,
which polykit does not run, so it is kept and has no effect. BitCast (opset 26) reinterprets
the bytes of each element as `to`, a type of the same width.
"""

from __future__ import annotations

from polykit.compiler.ir import dtypes
from polykit.compiler.ir.graph import Node
from polykit.compiler.ops.registry import InferContext, ImportContext, importer, shape_rule
from polykit.errors import NodeAttributeError

_TYPE_BY_NAME = {name: code for code, name in dtypes.ONNX_TYPE_NAMES.items()}


def cast_target(node: Node):
    """numpy dtype of a Cast node's `to` (PolykitError if polykit does not run that type)."""
    if "to" not in node.attrs:
        raise NodeAttributeError("required attribute 'to' is missing", where=node.describe(),
                                 hint="set `to` to a TensorProto.DataType")
    return dtypes.to_numpy(node.attrs["to"], where=node.describe())


@importer("Cast", since=1)
def _cast_import(node: Node, ctx: ImportContext):
    to = node.attrs.get("to")
    if isinstance(to, str):
        code = _TYPE_BY_NAME.get(to.upper())
        if code is None:
            raise NodeAttributeError(f"unknown type name {to!r} in `to`", where=node.describe(),
                                     hint=f"use one of {', '.join(sorted(_TYPE_BY_NAME))}")
        node.attrs["to"] = code
    cast_target(node)


@shape_rule("Cast")
def _cast(ctx: InferContext):
    return [(cast_target(ctx.node), ctx.shape(0))]


@shape_rule("CastLike")
def _cast_like(ctx: InferContext):
    return [(ctx.dtype(1), ctx.shape(0))]


@shape_rule("BitCast")
def _bit_cast(ctx: InferContext):
    to = cast_target(ctx.node)
    have = ctx.dtype(0)
    if have is not None and (have.itemsize != to.itemsize or have == object or to == object):
        raise ctx.fail(f"BitCast from {have} ({8 * have.itemsize} bits) to {to} ({8 * to.itemsize} bits)",
                       hint="BitCast needs numeric types of the same bit width; use Cast to convert values")
    return [(to, ctx.shape(0))]

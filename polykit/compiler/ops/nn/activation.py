"""Activation ops: importers (old attribute forms -> canonical inputs), and the shape rules of
Clip (optional min/max inputs) and PRelu (its slope broadcast onto X, unidirectionally).

The other activations keep X's dtype and shape: their rows of the elementwise op table
(polykit.compiler.ops.nn.activation_reference) register that rule.
"""

from __future__ import annotations

from polykit.compiler.ir.graph import Node
from polykit.compiler.ops.registry import ImportContext, InferContext, broadcast_shapes, importer, shape_rule

#: Ops whose opset-1 form carried the legacy `consumed_inputs` attribute (dropped in opset 6).
_LEGACY_CONSUMED_INPUTS = ("Relu", "LeakyRelu", "Sigmoid", "HardSigmoid", "Tanh", "Elu", "Selu", "PRelu")


def _drop_consumed_inputs(node: Node, ctx: ImportContext) -> None:
    node.attrs.pop("consumed_inputs", None)


def _already_canonical(node: Node, ctx: ImportContext) -> None:
    """Marks the opset from which an op's form is canonical (older importers stop there)."""


for _op in _LEGACY_CONSUMED_INPUTS:
    if _op != "PRelu":  # PRelu's opset-1 importer (below) also reshapes a per-channel slope
        importer(_op, since=1)(_drop_consumed_inputs)
    importer(_op, since=7 if _op == "PRelu" else 6)(_already_canonical)


@importer("PRelu", since=1)
def _prelu_per_channel_slope(node: Node, ctx: ImportContext) -> None:
    """PRelu-1/6: a 1-D slope of C values is per channel (axis 1), not numpy-broadcast (PRelu-7)."""
    node.attrs.pop("consumed_inputs", None)
    slope = ctx.const(node.inputs[1]) if len(node.inputs) > 1 else None
    x = ctx.graph.value(node.inputs[0]).shape
    if slope is None or slope.ndim != 1 or slope.size == 1 or x is None or len(x) < 3 or x[1] != slope.size:
        return
    node.inputs[1] = ctx.add_constant(slope.reshape((-1,) + (1,) * (len(x) - 2)), "prelu_slope")
importer("Clip", since=11)(_already_canonical)


@importer("Clip", since=1)
def _clip_attrs_to_inputs(node: Node, ctx: ImportContext) -> list[Node] | None:
    """Clip-1/6: min/max attributes -> inputs of X's dtype (Clip-11 form).

    The bounds must have X's dtype; when it is not known at import time (an intermediate
    tensor without value_info) a CastLike to X converts the float32 attribute value.
    """
    node.attrs.pop("consumed_inputs", None)
    lo, hi = node.attrs.pop("min", None), node.attrs.pop("max", None)
    x = node.inputs[0]
    dtype = ctx.graph.value(x).dtype
    extra: list[Node] = []
    bounds = []
    for value, tag in ((lo, "min"), (hi, "max")):
        if value is None:
            bounds.append("")
            continue
        if dtype is not None:
            bounds.append(ctx.add_constant(value, prefix=f"{node.name}_{tag}", dtype=dtype))
            continue
        raw = ctx.add_constant(value, prefix=f"{node.name}_{tag}_f32", dtype="float32")
        cast = ctx.graph.fresh_name(f"{node.name}_{tag}")
        extra.append(Node("CastLike", [raw, x], [cast], {}, name=ctx.graph.fresh_name(f"{node.name}_{tag}_cast")))
        bounds.append(cast)
    while bounds and not bounds[-1]:
        bounds.pop()
    node.inputs = [x, *bounds]
    return [*extra, node] if extra else None


@shape_rule("Clip")
def _clip(ctx: InferContext):
    for i in (1, 2):
        shape = ctx.shape(i)
        if shape is not None and len(shape) > 1:
            raise ctx.fail(f"Clip bound input {i} must be a scalar (or 1-element tensor), got shape {shape}")
        dt = ctx.dtype(i)
        if dt is not None and ctx.dtype(0) is not None and dt != ctx.dtype(0):
            raise ctx.fail(
                f"Clip bound input {i} has dtype {dt}, X has {ctx.dtype(0)}",
                hint="min/max must have the same dtype as X (insert a Cast)",
            )
    return [(ctx.dtype(0), ctx.shape(0))]


@shape_rule("PRelu")
def _prelu(ctx: InferContext):
    out = broadcast_shapes(ctx, ctx.shape(0), ctx.shape(1))
    x = ctx.shape(0)
    if out is not None and x is not None and len(out) > len(x):
        raise ctx.fail(
            f"PRelu slope of shape {ctx.shape(1)} does not broadcast onto X of shape {x}",
            hint="the slope must be unidirectionally broadcastable to X",
        )
    return [(ctx.dtype(0), x if x is not None else out)]

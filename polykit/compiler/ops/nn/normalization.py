"""Normalization ops: importers (legacy BatchNormalization / GroupNormalization-18 forms)
and shape rules for BatchNormalization, InstanceNormalization, LayerNormalization,
GroupNormalization, RMSNormalization, LpNormalization, MeanVarianceNormalization."""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir import dtypes
from polykit.compiler.ir.graph import Node
from polykit.compiler.ops.registry import ImportContext, InferContext, importer, shape_rule
from polykit.errors import NodeAttributeError


def _already_canonical(node: Node, ctx: ImportContext) -> None:
    """This opset's form is the canonical one."""


# ---- BatchNormalization -----------------------------------------------------------------

@importer("BatchNormalization", since=1)
def _batchnorm_legacy(node: Node, ctx: ImportContext) -> list[Node] | None:
    """Opset < 14 -> opset 15 form.

    Drops consumed_inputs / is_test; opset 9-13 signalled training by declaring the extra
    outputs (mean, var, saved_mean, saved_var): the first two become training_mode=1's
    running mean/var, the saved statistics (gone in opset 14) must be unused. Non-spatial
    BN (spatial=0, opset 7-8; statistics of shape C x D1 x ... x Dn) is rewritten as
    elementwise ops, which broadcast those parameters exactly.
    """
    for key in ("consumed_inputs", "is_test"):
        node.attrs.pop(key, None)
    spatial = int(node.attrs.pop("spatial", 1))
    outputs = list(node.outputs)
    used = _used_names(ctx)
    saved = [o for o in outputs[3:] if o]
    if any(o in used for o in saved):
        raise NodeAttributeError(
            "the saved_mean / saved_var outputs of training-mode BatchNormalization are not supported",
            where=node.describe(),
            hint="export the model for inference (eval mode) so BatchNormalization has one output",
        )
    node.outputs = outputs[:3]
    while len(node.outputs) > 1 and not node.outputs[-1]:
        node.outputs.pop()
    if len(node.outputs) > 1:
        node.attrs["training_mode"] = 1
    if spatial == 0 and ctx.opset >= 7 and len(node.outputs) == 1:
        return _batchnorm_as_elementwise(node, ctx)
    if spatial == 0 and ctx.opset >= 7:
        raise NodeAttributeError(
            "non-spatial BatchNormalization in training mode is not supported",
            where=node.describe(),
            hint="export the model for inference",
        )
    return None


importer("BatchNormalization", since=14)(_already_canonical)


def _used_names(ctx: ImportContext) -> set[str]:
    names = set(ctx.graph.outputs)
    for n in ctx.graph.nodes:
        names.update(n.inputs)
    return names


def _batchnorm_as_elementwise(node: Node, ctx: ImportContext) -> list[Node]:
    """Y = (X - mean) / sqrt(var + eps) * scale + B with numpy broadcasting of the params."""
    x, scale, bias, mean, var = node.inputs[:5]
    g = ctx.graph
    dtype = g.value(var).dtype or np.dtype(np.float32)
    eps = ctx.add_constant(np.asarray(node.attrs.get("epsilon", 1e-5), dtype=dtype), prefix=f"{node.name}_eps")
    base = node.name or "BatchNormalization"
    t = {k: g.fresh_name(f"{base}_{k}") for k in ("var_eps", "std", "centered", "normed", "scaled")}

    def op(kind: str, ins: list[str], out: str) -> Node:
        return Node(kind, ins, [out], {}, name=g.fresh_name(f"{base}_{kind}"))

    return [
        op("Add", [var, eps], t["var_eps"]),
        op("Sqrt", [t["var_eps"]], t["std"]),
        op("Sub", [x, mean], t["centered"]),
        op("Div", [t["centered"], t["std"]], t["normed"]),
        op("Mul", [t["normed"], scale], t["scaled"]),
        op("Add", [t["scaled"], bias], node.outputs[0]),
    ]


@shape_rule("BatchNormalization")
def _batchnorm(ctx: InferContext):
    x = ctx.shape(0)
    if x is not None and len(x) < 2:
        raise ctx.fail(f"BatchNormalization needs X of rank >= 2 (N, C, ...), got shape {x}")
    channels = x[1] if x is not None else None
    _check_per_channel(ctx, channels, range(1, 5))
    out = [(ctx.dtype(0), x)]
    if ctx.attr("training_mode", 0):
        out += [(ctx.dtype(3), (channels,)), (ctx.dtype(4), (channels,))]
    elif ctx.n_outputs > 1:
        raise ctx.fail(
            "running mean/var outputs exist only with training_mode=1",
            hint="remove the extra outputs or set training_mode=1",
        )
    return out


def _check_per_channel(ctx: InferContext, channels, indices) -> None:
    for i in indices:
        s = ctx.shape(i)
        if s is None or not ctx.has(i):
            continue
        if len(s) != 1:
            raise ctx.fail(f"input {i} ({ctx.node.inputs[i]!r}) must be 1-D of size C, got shape {s}")
        if isinstance(s[0], int) and isinstance(channels, int) and s[0] != channels:
            raise ctx.fail(f"input {i} ({ctx.node.inputs[i]!r}) has {s[0]} entries for {channels} channels")


# ---- InstanceNormalization ----------------------------------------------------------------

@importer("InstanceNormalization", since=1)
def _instancenorm_legacy(node: Node, ctx: ImportContext) -> None:
    node.attrs.pop("consumed_inputs", None)


importer("InstanceNormalization", since=6)(_already_canonical)


@shape_rule("InstanceNormalization")
def _instancenorm(ctx: InferContext):
    x = ctx.shape(0)
    if x is not None and len(x) < 2:
        raise ctx.fail(f"InstanceNormalization needs X of rank >= 2 (N, C, ...), got shape {x}")
    _check_per_channel(ctx, None if x is None else x[1], (1, 2))
    return [(ctx.dtype(0), x)]


# ---- LayerNormalization / RMSNormalization ----------------------------------------------------

def stash_dtype(ctx_or_node) -> np.dtype:
    """The dtype LayerNormalization-style ops compute their statistics in (stash_type attr)."""
    attrs = ctx_or_node.node.attrs if isinstance(ctx_or_node, InferContext) else ctx_or_node.attrs
    return dtypes.to_numpy(int(attrs.get("stash_type", 1)))


@shape_rule("LayerNormalization")
def _layernorm(ctx: InferContext):
    x = ctx.shape(0)
    stats = None
    if x is not None:
        axis = ctx.normalize_axis(int(ctx.attr("axis", -1)), len(x))
        stats = tuple(x[:axis]) + (1,) * (len(x) - axis)
    return [(ctx.dtype(0), x), (stash_dtype(ctx), stats), (stash_dtype(ctx), stats)][: max(ctx.n_outputs, 1)]


@shape_rule("RMSNormalization")
def _rmsnorm(ctx: InferContext):
    x = ctx.shape(0)
    if x is not None:
        ctx.normalize_axis(int(ctx.attr("axis", -1)), len(x))
    return [(ctx.dtype(1) or ctx.dtype(0), x)]


# ---- GroupNormalization ---------------------------------------------------------------------------

@importer("GroupNormalization", since=18)
def _groupnorm_per_group_to_per_channel(node: Node, ctx: ImportContext) -> list[Node] | None:
    """Opset 18 gave scale/bias per group ([G]); opset 21 per channel ([C]): repeat each
    group's value C/G times. Constants with a known C are repeated here; otherwise a
    Shape/Div/Concat/Expand/Reshape chain does it (folded later when C is static)."""
    groups = int(node.attrs["num_groups"])
    x = node.inputs[0]
    channels = _static_channels(ctx.graph.value(x).shape)
    new_nodes: list[Node] = []
    for i in (1, 2):
        name = node.inputs[i]
        const = ctx.const(name)
        if const is not None and channels is not None:
            node.inputs[i] = ctx.add_constant(np.repeat(const, channels // groups), prefix=f"{name}_per_channel")
        else:
            chain, node.inputs[i] = _repeat_per_group_nodes(ctx, x, name, groups)
            new_nodes += chain
    return [*new_nodes, node] if new_nodes else None


importer("GroupNormalization", since=21)(_already_canonical)


def _static_channels(shape) -> int | None:
    if shape is not None and len(shape) >= 2 and isinstance(shape[1], int):
        return shape[1]
    return None


def _repeat_per_group_nodes(ctx: ImportContext, x: str, param: str, groups: int) -> tuple[list[Node], str]:
    g = ctx.graph
    c, per, shp, col, wide, out = (g.fresh_name(f"{param}_{k}") for k in ("C", "per_group", "shape", "col", "wide", "per_channel"))
    g_const = ctx.add_constant(np.array([groups], np.int64), prefix=f"{param}_G")
    col_shape = ctx.add_constant(np.array([groups, 1], np.int64), prefix=f"{param}_col_shape")
    flat = ctx.add_constant(np.array([-1], np.int64), prefix=f"{param}_flat")

    def op(kind, ins, o, **attrs):
        return Node(kind, ins, [o], attrs, name=g.fresh_name(f"{param}_{kind}"))

    nodes = [
        op("Shape", [x], c, start=1, end=2),
        op("Div", [c, g_const], per),
        op("Concat", [g_const, per], shp, axis=0),
        op("Reshape", [param, col_shape], col),
        op("Expand", [col, shp], wide),
        op("Reshape", [wide, flat], out),
    ]
    return nodes, out


@shape_rule("GroupNormalization")
def _groupnorm(ctx: InferContext):
    x = ctx.shape(0)
    groups = int(ctx.attr("num_groups"))
    if x is not None:
        if len(x) < 2:
            raise ctx.fail(f"GroupNormalization needs X of rank >= 2 (N, C, ...), got shape {x}")
        if isinstance(x[1], int) and groups > 0 and x[1] % groups:
            raise ctx.fail(f"{x[1]} channels do not split into num_groups={groups} groups")
    _check_per_channel(ctx, None if x is None else x[1], (1, 2))
    return [(ctx.dtype(0), x)]


# ---- LpNormalization / MeanVarianceNormalization --------------------------------------------

@shape_rule("LpNormalization")
def _lpnorm(ctx: InferContext):
    if ctx.rank(0) is not None:
        ctx.normalize_axis(int(ctx.attr("axis", -1)), ctx.rank(0))
    if int(ctx.attr("p", 2)) not in (1, 2):
        raise ctx.fail(f"LpNormalization p must be 1 or 2, got {ctx.attr('p')}")
    return [(ctx.dtype(0), ctx.shape(0))]


@shape_rule("MeanVarianceNormalization")
def _mvn(ctx: InferContext):
    rank = ctx.rank(0)
    if rank is not None:
        for a in ctx.attr("axes", [0, 2, 3]):
            ctx.normalize_axis(int(a), rank)
    return [(ctx.dtype(0), ctx.shape(0))]

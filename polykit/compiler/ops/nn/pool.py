"""Pooling and local normalization: MaxPool, AveragePool, LpPool, their Global forms, LRN,
MaxUnpool -- importers and shape rules.

Attributes added over the opsets (storage_order 8, ceil_mode 10, dilations 10/19) default to
the old behaviour, so old models need no rewrite; only LpPool/GlobalLpPool-1 carried `p` as a
float, which the importer turns into today's int.
"""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir.graph import Node
from polykit.compiler.ops.nn.conv import check_spatial_input, window_geometry
from polykit.compiler.ops.registry import ImportContext, InferContext, importer, shape_rule
from polykit.errors import NodeAttributeError

INT64 = np.dtype(np.int64)


@importer("LpPool", since=1)
@importer("GlobalLpPool", since=1)
def _lp_pool_p_as_int(node: Node, ctx: ImportContext) -> None:
    if "p" in node.attrs:  # a float in opset 1, an int since 2 (where this is a no-op)
        node.attrs["p"] = int(round(float(node.attrs["p"])))


def _pool_shape(ctx: InferContext):
    x = check_spatial_input(ctx)
    ks = ctx.attr("kernel_shape")
    if x is None:
        return None
    if len(ks) != len(x) - 2:
        raise NodeAttributeError(f"kernel_shape has {len(ks)} dims for an input of rank {len(x)}",
                                 where=ctx.node.describe(), hint="give one kernel size per spatial dim")
    geo = window_geometry(ctx.node.attrs, x[2:], [int(k) for k in ks], ceil_mode=bool(ctx.attr("ceil_mode", 0)),
                          where=ctx.node.describe())
    if any(isinstance(o, int) and o <= 0 for o in geo.out):
        raise ctx.fail(f"the output spatial shape {geo.out} is empty", hint="the kernel is larger than the padded input")
    return tuple(x[:2]) + geo.out


@shape_rule("MaxPool")
def _max_pool(ctx: InferContext):
    shape = _pool_shape(ctx)
    return [(ctx.dtype(0), shape), (INT64, shape)]


@shape_rule("AveragePool", "LpPool")
def _avg_pool(ctx: InferContext):
    return [(ctx.dtype(0), _pool_shape(ctx))]


@shape_rule("GlobalMaxPool", "GlobalAveragePool", "GlobalLpPool")
def _global_pool(ctx: InferContext):
    x = check_spatial_input(ctx)
    return [(ctx.dtype(0), None if x is None else tuple(x[:2]) + (1,) * (len(x) - 2))]


@shape_rule("LRN")
def _lrn(ctx: InferContext):
    x = ctx.shape(0)
    if x is not None and len(x) < 2:
        raise ctx.fail(f"LRN needs an (N, C, ...) input, got rank {len(x)}")
    ctx.attr("size")
    return [(ctx.dtype(0), x)]


def unpool_shape(attrs, spatial, where: str = ""):
    """MaxUnpool's default output spatial dims: (in - 1) * stride - pads + kernel."""
    ks = [int(k) for k in attrs["kernel_shape"]]
    n = len(ks)
    strides = list(attrs.get("strides") or [1] * n)
    pads = list(attrs.get("pads") or [0] * (2 * n))
    return tuple(
        (d - 1) * strides[i] - pads[i] - pads[n + i] + ks[i] if isinstance(d, int) else None
        for i, d in enumerate(spatial)
    )


@shape_rule("MaxUnpool")
def _max_unpool(ctx: InferContext):
    x = check_spatial_input(ctx)
    ctx.attr("kernel_shape")
    requested = ctx.const(2)
    if requested is not None:
        return [(ctx.dtype(0), tuple(int(d) for d in requested))]
    if ctx.has(2):
        rank = ctx.shape(2)[0] if ctx.shape(2) else None
        return [(ctx.dtype(0), None if not isinstance(rank, int) else (None,) * rank)]
    if x is None:
        return [(ctx.dtype(0), None)]
    return [(ctx.dtype(0), tuple(x[:2]) + unpool_shape(ctx.node.attrs, x[2:]))]

"""Block rearrangements: DepthToSpace (DCR/CRD) and SpaceToDepth -- shape rules.

DepthToSpace-1 had no `mode`; its behaviour is today's default DCR, so no importer is needed.
SpaceToDepth gained `mode` in opset 28 (default DCR, the old behaviour).
"""

from __future__ import annotations

from polykit.compiler.ops.registry import InferContext, shape_rule
from polykit.errors import NodeAttributeError

BLOCK_MODES = ("DCR", "CRD")


def block_attrs(attrs, where: str) -> tuple[int, str]:
    """The validated (blocksize, mode) of a DepthToSpace/SpaceToDepth node."""
    if "blocksize" not in attrs:
        raise NodeAttributeError("required attribute 'blocksize' is missing", where=where)
    b = int(attrs["blocksize"])
    mode = attrs.get("mode", "DCR")
    if b <= 0:
        raise NodeAttributeError(f"blocksize {b} must be positive", where=where)
    if mode not in BLOCK_MODES:
        raise NodeAttributeError(f"mode {mode!r} is not DCR or CRD", where=where)
    return b, mode


def _nchw(ctx: InferContext):
    x = ctx.shape(0)
    if x is not None and len(x) != 4:
        raise ctx.fail(f"input has rank {len(x)}, expected a 4-D (N, C, H, W) tensor")
    return x


@shape_rule("DepthToSpace")
def _depth_to_space(ctx: InferContext):
    b, _ = block_attrs(ctx.node.attrs, ctx.node.describe())
    x = _nchw(ctx)
    if x is None:
        return [(ctx.dtype(0), None)]
    n, c, h, w = x
    if isinstance(c, int) and c % (b * b):
        raise ctx.fail(f"{c} channels are not divisible by blocksize^2 = {b * b}")
    mul = lambda d: d * b if isinstance(d, int) else None  # noqa: E731
    return [(ctx.dtype(0), (n, c // (b * b) if isinstance(c, int) else None, mul(h), mul(w)))]


@shape_rule("SpaceToDepth")
def _space_to_depth(ctx: InferContext):
    b, _ = block_attrs(ctx.node.attrs, ctx.node.describe())
    x = _nchw(ctx)
    if x is None:
        return [(ctx.dtype(0), None)]
    n, c, h, w = x
    for name, d in (("height", h), ("width", w)):
        if isinstance(d, int) and d % b:
            raise ctx.fail(f"{name} {d} is not divisible by blocksize {b}")
    div = lambda d: d // b if isinstance(d, int) else None  # noqa: E731
    return [(ctx.dtype(0), (n, c * b * b if isinstance(c, int) else None, div(h), div(w)))]

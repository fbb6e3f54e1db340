"""ai.polykit ConcatGather: a Gather of a Concat along the same axis, reading the Concat's sources.

ConcatGather(indices, x_0, ..., x_{k-1}) -> y, 2 <= k <= MAX_SOURCES. Attribute `axis` (int, default 0).

    y = Gather(Concat(x_0, ..., x_{k-1}, axis), indices, axis)

`indices` is 1-D int64 (a constant where compose_concat_gathers makes the node); each index names
(source, position) by the sources' extents along `axis`; negative indices count from the end of the
concatenation. The sources have one rank and one dtype and agree on every other axis. ShuffleNet's
Concat(x1, branch) -> channel shuffle -> halves is two ConcatGathers and no Concat (docs/FUSION.md).
"""

from __future__ import annotations

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.ops.registry import InferContext, shape_rule

CONCAT_GATHER = "ConcatGather"
#: most sources one node reads (the cuda kernel's pointer arguments)
MAX_SOURCES = 4
_HINT = "compose_concat_gathers makes this node; rebuild the plan (or fix the edited inputs)"


@shape_rule(CONCAT_GATHER, domain=POLYKIT_DOMAIN)
def _concat_gather(ctx: InferContext):
    k = ctx.n_inputs - 1
    if not 2 <= k <= MAX_SOURCES or ctx.n_outputs != 1 or not all(ctx.has(i) for i in range(ctx.n_inputs)):
        raise ctx.fail(f"ConcatGather takes indices and 2 to {MAX_SOURCES} sources, has {k} sources", hint=_HINT)
    if ctx.rank(0) not in (None, 1):
        raise ctx.fail(f"ConcatGather's indices are 1-D, not rank {ctx.rank(0)}", hint=_HINT)
    dtypes = {ctx.dtype(i) for i in range(1, k + 1)} - {None}
    if len(dtypes) > 1:
        raise ctx.fail(f"ConcatGather's sources have dtypes {sorted(map(str, dtypes))}", hint=_HINT)
    shapes = [ctx.shape(i) for i in range(1, k + 1)]
    dtype = next(iter(dtypes), None)
    if any(s is None for s in shapes) or ctx.shape(0) is None:
        return [(dtype, None)]
    rank = len(shapes[0])
    axis = int(ctx.node.attrs.get("axis", 0))
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis < rank or any(len(s) != rank for s in shapes):
        raise ctx.fail(f"axis {axis} or the sources' ranks {[len(s) for s in shapes]} do not agree", hint=_HINT)
    for a in range(rank):
        if a != axis and len({s[a] for s in shapes}) > 1 and all(isinstance(s[a], int) for s in shapes):
            raise ctx.fail(f"the sources differ on axis {a}: {[s[a] for s in shapes]}", hint=_HINT)
    out = list(shapes[0])
    out[axis] = ctx.shape(0)[0]
    return [(dtype, tuple(out))]

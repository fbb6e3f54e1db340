"""NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss: shape rules (opset 12/13 forms are
the same op; no importer needed).

Both take scores [N, C, d1..dk] and int targets [N, d1..dk], an optional per-class weight [C],
`reduction` none / sum / mean and an optional `ignore_index`; SoftmaxCrossEntropyLoss may
also return its log-probabilities (the second output, shaped like the scores).
"""

from __future__ import annotations

from polykit.compiler.ops.registry import InferContext, shape_rule

REDUCTIONS = ("none", "sum", "mean")
LOSS_OPS = ("NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss")


def loss_reduction(attrs) -> str:
    """The node's `reduction` attribute (default "mean"), as str."""
    value = attrs.get("reduction", "mean")
    return value.decode() if isinstance(value, bytes) else str(value)


@shape_rule(*LOSS_OPS)
def _loss(ctx: InferContext):
    op = ctx.node.op_type
    reduction = loss_reduction(ctx.node.attrs)
    if reduction not in REDUCTIONS:
        raise ctx.fail(f"{op} reduction {reduction!r} is not one of {list(REDUCTIONS)}")
    scores, target = ctx.shape(0), ctx.shape(1)
    if scores is not None and len(scores) < 2:
        raise ctx.fail(f"{op} needs scores of rank >= 2 ([N, C, ...]), got shape {tuple(scores)}")
    if scores is not None and target is not None and len(target) != len(scores) - 1:
        raise ctx.fail(f"{op} target of shape {tuple(target)} for scores of shape {tuple(scores)}",
                       hint="the target is the scores' shape without the class dim C (dim 1)")
    if ctx.dtype(1) is not None and ctx.dtype(1).kind not in "iu":
        raise ctx.fail(f"{op} target must be an integer tensor, got {ctx.dtype(1)}")
    if ctx.has(2) and ctx.rank(2) not in (None, 1):
        raise ctx.fail(f"{op} weight must be a 1-D tensor of C values, got rank {ctx.rank(2)}")
    if reduction == "none":
        out = target if target is not None else (None if scores is None else (scores[0], *scores[2:]))
    else:
        out = ()
    results = [(ctx.dtype(0), out)]
    if ctx.n_outputs > 1:
        results.append((ctx.dtype(0), scores))
    return results

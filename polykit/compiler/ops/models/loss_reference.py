"""Reference kernels: NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss (float64 inside, one
rounding to the scores' dtype at the end)."""

from __future__ import annotations

import numpy as np

from polykit.compiler.ops.models.loss import loss_reduction
from polykit.errors import RuntimeInputError
from polykit.compiler.ops.references import reference


def nll_loss(node, log_prob: np.ndarray, target: np.ndarray, weight: np.ndarray | None) -> np.ndarray:
    """The loss of float64 log-probabilities [N, C, ...] against targets [N, ...]: per element
    -weight[t] * log_prob[n, t, ...] (0 where t == ignore_index), then none / sum / mean, where
    mean divides by the sum of the weights that were applied (the element count without weights)."""
    ignore = node.attrs.get("ignore_index")
    t = np.asarray(target).astype(np.int64)
    valid = np.ones(t.shape, bool) if ignore is None else t != int(ignore)
    n_classes = log_prob.shape[1]
    bad = valid & ((t < 0) | (t >= n_classes))
    if bad.any():
        raise RuntimeInputError(f"target value {int(t[bad].reshape(-1)[0])} is outside [0, {n_classes})",
                                where=node.describe(), hint="targets are class indices (or the ignore_index)")
    safe = np.where(valid, t, 0)
    picked = np.take_along_axis(log_prob, safe[:, None], axis=1)[:, 0]
    w = (np.ones(t.shape) if weight is None else weight.astype(np.float64)[safe]) * valid
    loss = -picked * w
    reduction = loss_reduction(node.attrs)
    if reduction == "sum":
        return np.asarray(loss.sum())
    if reduction == "mean":
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.asarray(loss.sum() / w.sum())
    return loss


def log_softmax_classes(x: np.ndarray) -> np.ndarray:
    """log(softmax(x)) over dim 1, in float64."""
    w = x.astype(np.float64)
    shifted = w - w.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


@reference("NegativeLogLikelihoodLoss")
def negative_log_likelihood_loss(node, inputs):
    x, target = inputs[0], inputs[1]
    weight = inputs[2] if len(inputs) > 2 else None
    return [nll_loss(node, x.astype(np.float64), target, weight).astype(x.dtype)]


@reference("SoftmaxCrossEntropyLoss")
def softmax_cross_entropy_loss(node, inputs):
    x, target = inputs[0], inputs[1]
    weight = inputs[2] if len(inputs) > 2 else None
    log_prob = log_softmax_classes(x)
    outs = [nll_loss(node, log_prob, target, weight).astype(x.dtype)]
    if len(node.outputs) > 1:
        outs.append(log_prob.astype(x.dtype))
    return outs

"""Shape rules of NegativeLogLikelihoodLoss / SoftmaxCrossEntropyLoss."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.ir.graph import Node
from polykit.compiler.ops.registry import InferContext, find_shape_rule
from polykit.errors import ShapeError

F32, I64 = np.dtype(np.float32), np.dtype(np.int64)


def infer(op, shapes, attrs=None, n_out=1, dtypes=None):
    node = Node(op, [f"in{i}" for i in range(len(shapes))], [f"out{i}" for i in range(n_out)], dict(attrs or {}),
                name=f"{op}_0")
    dtypes = dtypes or [F32, I64, F32][:len(shapes)]
    return find_shape_rule("", op)(InferContext(node, dtypes, shapes, [None] * len(shapes)))


@pytest.mark.parametrize("op", ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"])
def test_reduced_loss_is_a_scalar_of_the_scores_dtype(op):
    [(dt, shape)] = infer(op, [("n", 5, 7), ("n", 7), (5,)], {"reduction": "sum"})
    assert dt == F32 and shape == ()


def test_unreduced_loss_has_the_target_shape_and_log_prob_the_scores_shape():
    (loss, log_prob) = infer("SoftmaxCrossEntropyLoss", [("n", 5, 2, 3), ("n", 2, 3)], {"reduction": "none"}, n_out=2)
    assert loss == (F32, ("n", 2, 3)) and log_prob == (F32, ("n", 5, 2, 3))


def test_unreduced_loss_of_unknown_target_shape_comes_from_the_scores():
    [(_, shape)] = infer("NegativeLogLikelihoodLoss", [(4, 5, 6), None], {"reduction": "none"})
    assert shape == (4, 6)


@pytest.mark.parametrize("shapes,attrs,match", [
    ([(4, 5), (4, 1)], {}, "target of shape"),
    ([(4,), (4,)], {}, "rank >= 2"),
    ([(4, 5), (4,)], {"reduction": "average"}, "reduction"),
    ([(4, 5), (4,), (5, 1)], {}, "1-D"),
])
def test_bad_loss_nodes_are_shape_errors(shapes, attrs, match):
    with pytest.raises(ShapeError, match=match):
        infer("NegativeLogLikelihoodLoss", shapes, attrs)


def test_float_targets_are_a_shape_error():
    with pytest.raises(ShapeError, match="integer"):
        infer("NegativeLogLikelihoodLoss", [(4, 5), (4,)], dtypes=[F32, F32])

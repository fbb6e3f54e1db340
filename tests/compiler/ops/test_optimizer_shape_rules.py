"""Shape rules of the training-domain optimizers."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.ir.graph import Node
from polykit.compiler.ops.models.optimizer import TRAINING_DOMAIN
from polykit.compiler.ops.registry import InferContext, find_shape_rule
from polykit.errors import NodeAttributeError, ShapeError

F32, F64, I64 = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int64)


def infer(op, shapes, dtypes, n_out, attrs=None):
    node = Node(op, [f"in{i}" for i in range(len(shapes))], [f"out{i}" for i in range(n_out)], dict(attrs or {}),
                name=op, domain=TRAINING_DOMAIN)
    return find_shape_rule(TRAINING_DOMAIN, op)(InferContext(node, dtypes, shapes, [None] * len(shapes)))


def test_adam_outputs_are_the_new_x_v_h_of_each_tensor():
    shapes = [(), (), (2,), (3, 4), (2,), (3, 4), (2,), (3, 4), (2,), (3, 4)]
    dtypes = [F32, I64, F32, F64] * 2 + [F32, F64]
    out = infer("Adam", shapes, dtypes, 6)
    assert out == [(F32, (2,)), (F64, (3, 4))] * 3


def test_inputs_that_do_not_split_into_groups_are_a_shape_error():
    with pytest.raises(ShapeError, match="groups"):
        infer("Adagrad", [(), (), (2,), (2,)], [F32, I64, F32, F32], 2)


def test_momentum_needs_its_attributes():
    with pytest.raises(NodeAttributeError, match="alpha"):
        infer("Momentum", [(), (), (2,), (2,), (2,)], [F32, I64, F32, F32, F32], 2, {"mode": "standard"})

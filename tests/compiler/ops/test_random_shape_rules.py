"""Shape rules of the random ops."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.ir.graph import Node
from polykit.compiler.ops.registry import InferContext, find_shape_rule
from polykit.errors import ShapeError


def infer(op, shapes, dtypes, attrs):
    node = Node(op, [f"in{i}" for i in range(len(shapes))], ["out"], dict(attrs), name=f"{op}_0")
    return find_shape_rule("", op)(InferContext(node, dtypes, shapes, [None] * len(shapes)))


def test_random_uniform_takes_its_shape_and_dtype_attributes():
    assert infer("RandomUniform", [], [], {"shape": [2, 3], "dtype": 11}) == [(np.dtype(np.float64), (2, 3))]
    assert infer("RandomNormal", [], [], {"shape": [4]}) == [(np.dtype(np.float32), (4,))]


def test_like_forms_and_bernoulli_follow_the_input_unless_dtype_is_given():
    f16 = np.dtype(np.float16)
    assert infer("RandomNormalLike", [("n", 3)], [f16], {}) == [(f16, ("n", 3))]
    assert infer("Bernoulli", [(5,)], [f16], {"dtype": 9}) == [(np.dtype(np.bool_), (5,))]


def test_bernoulli_of_integer_probabilities_is_a_shape_error():
    with pytest.raises(ShapeError, match="floats"):
        infer("Bernoulli", [(5,)], [np.dtype(np.int32)], {})

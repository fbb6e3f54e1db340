"""WeightOnlyMatMul's shape rule (polykit.compiler.ops.quant.weight_only): the output shape of a
well-formed record, and errors naming the node for malformed ones."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.graph.infer import infer_shapes
from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Graph, Node, Value
from polykit.compiler.ops.quant.weight_only import KIND
from polykit.errors import ShapeError

F32, U8, I8 = np.dtype(np.float32), np.dtype(np.uint8), np.dtype(np.int8)


def infer(x=("b", 3, 72), w=(40, 48), s=(40, 5), z=(40, 5), b=(40,), dtypes=(F32, U8, F32, I8, F32), **attrs):
    attrs = {"weight_type": "int4", "block_size": 16, "K": 72, **attrs}
    names = ("x", "w", "s", "z", "b")
    shapes = (x, w, s, z, b)
    values = {n: Value(n, dt, shape) for n, dt, shape in zip(names, dtypes, shapes) if shape is not None}
    node = Node(KIND, [n if n in values else "" for n in names], ["y"], attrs, "wo0", domain=POLYKIT_DOMAIN)
    graph = Graph([node], ["x"], ["y"], {}, values)
    infer_shapes(graph)
    return graph.value("y")


def test_the_output_is_x_leading_dims_by_n_in_x_dtype():
    y = infer()
    assert y.shape == ("b", 3, 40) and y.dtype == F32
    assert infer(z=None, b=None).shape == ("b", 3, 40)


@pytest.mark.parametrize("change, message", [
    ({"weight_type": "int2"}, "weight_type"),
    ({"block_size": 0}, "block_size"),
    ({"w": (40, 36)}, "packed rows of K=72 int4 values take 48 bytes"),
    ({"s": (40, 4)}, r"scale has shape \(40, 4\)"),
    ({"z": (40, 1)}, "zero_point has shape"),
    ({"b": (41,)}, "B has shape"),
    ({"x": (2, 71)}, "K = 72"),
    ({"dtypes": (F32, U8, np.dtype(np.float16), I8, F32)}, "scale is float16"),
    ({"dtypes": (np.dtype(np.int32), U8, F32, I8, F32)}, "X is int32"),
    ({"dtypes": (F32, I8, F32, I8, F32)}, "packed uint8"),
])
def test_malformed_records_are_shape_errors_naming_the_node(change, message):
    with pytest.raises(ShapeError, match=message) as info:
        infer(**change)
    assert "wo0" in str(info.value)

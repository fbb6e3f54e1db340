"""Reference kernels: Constant, ConstantOfShape, Range, EyeLike."""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir import dtypes
from polykit.compiler.ops.tensor.constants import constant_of_shape_fill, constant_value, range_length
from polykit.errors import RuntimeInputError
from polykit.compiler.ops.references import reference


@reference("Constant")
def constant(node, inputs):
    return [np.array(constant_value(node))]


@reference("ConstantOfShape")
def constant_of_shape(node, inputs):
    fill = constant_of_shape_fill(node)
    shape = [int(d) for d in np.asarray(inputs[0]).reshape(-1)]
    if any(d < 0 for d in shape):
        raise RuntimeInputError(f"shape {shape} has a negative dim", where=node.describe(), hint="dims must be >= 0")
    return [np.full(shape, fill[0], dtype=fill.dtype)]


@reference("Range")
def range_(node, inputs):
    start, limit, delta = (np.asarray(x).reshape(()) for x in inputs)
    if float(delta) == 0:
        raise RuntimeInputError("delta is 0", where=node.describe(), hint="Range needs a non-zero delta")
    n = range_length(start, limit, delta)
    wide = np.float64 if dtypes.is_float(start.dtype) else np.int64
    # output[i] = start + i * delta, computed wide and rounded once to the inputs' dtype
    return [(start.astype(wide) + np.arange(n, dtype=wide) * delta.astype(wide)).astype(start.dtype)]


@reference("EyeLike")
def eye_like(node, inputs):
    x = inputs[0]
    dtype = dtypes.to_numpy(node.attrs["dtype"], where=node.describe()) if "dtype" in node.attrs else x.dtype
    rows, cols = x.shape
    return [np.eye(rows, cols, k=node.attrs.get("k", 0), dtype=dtype)]

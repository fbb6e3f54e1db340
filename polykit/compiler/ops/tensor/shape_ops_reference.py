"""Reference kernels: Reshape, Flatten, Squeeze, Unsqueeze, Expand, Shape, Size, Dropout."""

from __future__ import annotations

import numpy as np

from polykit.errors import RuntimeInputError
from polykit.compiler.ops.references import reference


def _ints(value) -> list[int]:
    return [int(v) for v in np.asarray(value).reshape(-1)]


def _bad(node, what: str, hint: str) -> RuntimeInputError:
    return RuntimeInputError(what, where=node.describe(), hint=hint)


@reference("Reshape")
def reshape(node, inputs):
    x, shape = inputs[0], _ints(inputs[1])
    if not node.attrs.get("allowzero", 0):
        shape = [x.shape[i] if d == 0 and i < x.ndim else d for i, d in enumerate(shape)]
    try:
        return [x.reshape(shape)]
    except ValueError as exc:
        raise _bad(node, f"cannot reshape {x.shape} to {shape}: {exc}", "the element counts must match") from None


@reference("Flatten")
def flatten(node, inputs):
    x = inputs[0]
    axis = node.attrs.get("axis", 1)
    axis = axis + x.ndim if axis < 0 else axis
    outer = int(np.prod(x.shape[:axis], dtype=np.int64))
    return [x.reshape(outer, int(np.prod(x.shape[axis:], dtype=np.int64)))]


@reference("Squeeze")
def squeeze(node, inputs):
    x = inputs[0]
    if len(inputs) < 2 or inputs[1] is None:
        return [np.squeeze(x)]
    axes = tuple(a % x.ndim if x.ndim else 0 for a in _ints(inputs[1]))
    if any(x.shape[a] != 1 for a in axes):
        raise _bad(node, f"cannot squeeze axes {axes} of shape {x.shape}", "only size-1 axes can be squeezed")
    return [np.squeeze(x, axis=axes)]


@reference("Unsqueeze")
def unsqueeze(node, inputs):
    x = inputs[0]
    rank = x.ndim + np.asarray(inputs[1]).size
    axes = sorted(a % rank for a in _ints(inputs[1]))
    return [np.expand_dims(x, tuple(axes))]


@reference("Expand")
def expand(node, inputs):
    x, shape = inputs[0], _ints(inputs[1])
    try:
        out_shape = np.broadcast_shapes(x.shape, tuple(shape))
    except ValueError:
        raise _bad(node, f"cannot expand {x.shape} to {shape}", "dims must be equal or 1") from None
    return [np.array(np.broadcast_to(x, out_shape))]


@reference("Shape")
def shape(node, inputs):
    dims = inputs[0].shape
    start, end = node.attrs.get("start", 0), node.attrs.get("end", len(dims))
    return [np.array(dims[start:end], dtype=np.int64)]


@reference("Size")
def size(node, inputs):
    return [np.array(inputs[0].size, dtype=np.int64)]


@reference("Dropout")
def dropout(node, inputs):
    """Inference (training_mode absent or false, or ratio 0) is the identity with an all-True
    mask; training mode draws the mask as ONNX's reference does (numpy seeded by `seed`)."""
    x = inputs[0]
    ratio = float(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else 0.5
    training = len(inputs) > 2 and inputs[2] is not None and bool(inputs[2])
    if not training or ratio == 0:
        return [x, np.ones(x.shape, dtype=np.bool_)]
    rng = np.random.RandomState(int(node.attrs.get("seed", 0)))
    mask = rng.uniform(0.0, 1.0, x.shape) >= ratio
    return [(mask * x * (1.0 / (1.0 - ratio))).astype(x.dtype), mask]

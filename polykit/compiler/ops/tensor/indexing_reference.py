"""Reference kernels: Gather, GatherElements, GatherND, ScatterND, ScatterElements, OneHot,
NonZero, Compress, Unique."""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir.dtypes import is_float
from polykit.errors import RuntimeInputError
from polykit.compiler.ops.tensor.cast_reference import float_to_int
from polykit.compiler.ops.references import reference

#: ScatterND / ScatterElements reduction -> numpy ufunc applied in place with `.at`
_REDUCE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _checked_indices(node, indices: np.ndarray, dim: int) -> np.ndarray:
    """Indices in [-dim, dim) made non-negative; RuntimeInputError for any outside."""
    indices = np.asarray(indices, dtype=np.int64)
    if indices.size and (indices.min() < -dim or indices.max() >= dim):
        raise RuntimeInputError(
            f"index out of range [{-dim}, {dim}): min {indices.min()}, max {indices.max()}",
            where=node.describe(), hint="indices must address elements of the data tensor",
        )
    return np.where(indices < 0, indices + dim, indices)


@reference("Gather")
def gather(node, inputs):
    x, idx = inputs
    axis = node.attrs.get("axis", 0) % max(x.ndim, 1)
    return [np.take(x, _checked_indices(node, idx, x.shape[axis]), axis=axis)]


@reference("GatherElements")
def gather_elements(node, inputs):
    x, idx = inputs
    axis = node.attrs.get("axis", 0) % x.ndim
    return [np.take_along_axis(x, _checked_indices(node, idx, x.shape[axis]), axis=axis)]


@reference("GatherND")
def gather_nd(node, inputs):
    x, idx = inputs[0], np.asarray(inputs[1], dtype=np.int64)
    b = node.attrs.get("batch_dims", 0)
    k = idx.shape[-1]
    batch = int(np.prod(x.shape[:b], dtype=np.int64))
    xs = x.reshape((batch,) + x.shape[b:])
    ids = idx.reshape((batch,) + idx.shape[b:])
    parts = []
    for i in range(batch):
        cols = [_checked_indices(node, ids[i][..., j], xs.shape[1 + j]) for j in range(k)]
        parts.append(xs[i][tuple(cols)])
    out_shape = idx.shape[:-1] + x.shape[b + k:]
    return [np.stack(parts).reshape(out_shape) if parts else np.zeros(out_shape, x.dtype)]


def _scatter_into(node, out: np.ndarray, index: tuple, updates: np.ndarray) -> np.ndarray:
    reduction = node.attrs.get("reduction", "none")
    if reduction == "none":
        out[index] = updates
    else:
        _REDUCE[reduction].at(out, index, updates)
    return out


@reference("ScatterND")
def scatter_nd(node, inputs):
    x, idx, updates = inputs[0], np.asarray(inputs[1], dtype=np.int64), inputs[2]
    k = idx.shape[-1]
    flat = idx.reshape(-1, k)
    index = tuple(_checked_indices(node, flat[:, j], x.shape[j]) for j in range(k))
    upd = updates.reshape((flat.shape[0],) + x.shape[k:])
    return [_scatter_into(node, np.array(x), index, upd)]


@reference("ScatterElements")
def scatter_elements(node, inputs):
    x, idx, updates = inputs
    axis = node.attrs.get("axis", 0) % x.ndim
    index = list(np.indices(np.shape(idx), sparse=True))
    index[axis] = _checked_indices(node, idx, x.shape[axis])
    return [_scatter_into(node, np.array(x), tuple(index), updates)]


@reference("OneHot")
def one_hot(node, inputs):
    idx, depth, values = inputs
    depth = int(np.asarray(depth).reshape(-1)[0])
    idx = np.asarray(idx)
    idx = float_to_int(idx, np.int64) if is_float(idx.dtype) else idx.astype(np.int64)  # NaN -> 0 (cast.py)
    idx = np.where(idx < 0, idx + depth, idx)
    rank = idx.ndim + 1
    axis = node.attrs.get("axis", -1) % rank
    classes = np.arange(depth).reshape([depth if i == axis else 1 for i in range(rank)])
    hot = np.expand_dims(idx, axis) == classes
    off, on = np.asarray(values).reshape(-1)[:2]
    return [np.where(hot, on, off).astype(values.dtype)]


@reference("NonZero")
def non_zero(node, inputs):
    x = inputs[0]
    if x.ndim == 0:
        return [np.zeros((0, int(bool(x))), dtype=np.int64)]
    return [np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)]


@reference("Compress")
def compress(node, inputs):
    x, cond = inputs
    cond = np.asarray(cond).reshape(-1).astype(bool)
    axis = node.attrs.get("axis")
    length = x.size if axis is None else x.shape[axis]
    if cond.size > length:
        raise RuntimeInputError(f"condition has {cond.size} entries for an axis of {length}",
                                where=node.describe(), hint="the condition may not be longer than the axis")
    return [np.compress(cond, x, axis=axis)]


@reference("Unique")
def unique(node, inputs):
    x = inputs[0]
    axis = node.attrs.get("axis")
    if axis is not None:
        axis %= x.ndim
    source = x.reshape(-1) if axis is None else x
    y, first, inverse, counts = np.unique(source, return_index=True, return_inverse=True, return_counts=True, axis=axis)
    inverse = inverse.reshape(-1)
    if not node.attrs.get("sorted", 1):
        order = np.argsort(first, kind="stable")  # order of first occurrence
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        y = np.take(y, order, axis=0 if axis is None else axis)
        first, counts, inverse = first[order], counts[order], rank[inverse]
    return [y, first.astype(np.int64), inverse.astype(np.int64), counts.astype(np.int64)]

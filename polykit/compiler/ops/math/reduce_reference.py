"""Reference kernels: Reduce* (float accumulation in float64), ArgMax, ArgMin.

Reducing an empty set gives the op's identity: 0 for sums, 1 for ReduceProd, -inf for
ReduceMax / ReduceLogSum / ReduceLogSumExp, +inf for ReduceMin (the dtype's lowest / highest
value for integers, False / True for bool).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from polykit.compiler.ir.dtypes import is_float
from polykit.compiler.ops.references import reference


def _axes(node, inputs) -> tuple[int, ...] | None:
    """Axes to reduce; None means "all"; () means "none" (noop_with_empty_axes)."""
    x = inputs[0]
    given = inputs[1] if len(inputs) > 1 and inputs[1] is not None else None
    if given is None or np.asarray(given).size == 0:
        return () if node.attrs.get("noop_with_empty_axes", 0) else None
    return tuple(sorted({int(a) % max(x.ndim, 1) for a in np.asarray(given).reshape(-1)}))


def _accumulator(dtype: np.dtype) -> np.dtype:
    if is_float(dtype):
        return np.dtype(np.float64)
    if dtype == np.bool_:
        return np.dtype(np.int64)
    return np.dtype(np.uint64) if np.issubdtype(dtype, np.unsignedinteger) else np.dtype(np.int64)


def _reduction(fn: Callable[[np.ndarray, tuple[int, ...] | None], np.ndarray]):
    """Kernel that applies `fn(x_acc, axes)` (keepdims=True) and shapes/casts the result."""

    def kernel(node, inputs):
        x = inputs[0]
        axes = _axes(node, inputs)
        if axes == ():
            return [x.copy()]
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            y = np.asarray(fn(x, axes))
        if not node.attrs.get("keepdims", 1):
            y = np.squeeze(y, axis=tuple(range(x.ndim)) if axes is None else axes)
        return [_cast(y, x.dtype)]

    return kernel


def _cast(y: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if np.issubdtype(dtype, np.integer) and np.issubdtype(y.dtype, np.floating):
        y = np.trunc(y)
    return y.astype(dtype)


def _acc(x: np.ndarray) -> np.ndarray:
    return x.astype(_accumulator(x.dtype))


def _sum(x, axes):
    return np.sum(_acc(x), axis=axes, keepdims=True)


def _mean(x, axes):
    count = x.size if axes is None else int(np.prod([x.shape[a] for a in axes]))
    return np.sum(_acc(x), axis=axes, keepdims=True).astype(np.float64) / count


def _extreme(fn, which: str):
    def reduce(x, axes):
        if x.dtype == np.bool_:
            initial = which == "min"
        elif np.issubdtype(x.dtype, np.integer):
            info = np.iinfo(x.dtype)
            initial = info.max if which == "min" else info.min
        else:
            initial = np.inf if which == "min" else -np.inf
        return fn(x, axis=axes, keepdims=True, initial=initial)

    return reduce


def _prod(x, axes):
    return np.prod(_acc(x), axis=axes, keepdims=True)


def _l1(x, axes):
    return np.sum(np.abs(_acc(x)), axis=axes, keepdims=True)


def _l2(x, axes):
    xf = x.astype(np.float64)
    return np.sqrt(np.sum(xf * xf, axis=axes, keepdims=True))


def _sum_square(x, axes):
    xa = _acc(x)
    return np.sum(xa * xa, axis=axes, keepdims=True)


def _log_sum(x, axes):
    return np.log(np.sum(x.astype(np.float64), axis=axes, keepdims=True))


def _log_sum_exp(x, axes):
    xf = x.astype(np.float64)
    if xf.size == 0 or (axes is not None and any(x.shape[a] == 0 for a in axes)):
        return np.log(np.sum(np.exp(xf), axis=axes, keepdims=True))
    peak = np.max(xf, axis=axes, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0.0)
    return peak + np.log(np.sum(np.exp(xf - peak), axis=axes, keepdims=True))


REDUCTIONS = {
    "ReduceSum": _sum, "ReduceMean": _mean, "ReduceMax": _extreme(np.max, "max"),
    "ReduceMin": _extreme(np.min, "min"), "ReduceProd": _prod, "ReduceL1": _l1, "ReduceL2": _l2,
    "ReduceSumSquare": _sum_square, "ReduceLogSum": _log_sum, "ReduceLogSumExp": _log_sum_exp,
}
for _op, _fn in REDUCTIONS.items():
    reference(_op)(_reduction(_fn))


def _arg_reduce(pick: Callable[..., np.ndarray]):
    def kernel(node, inputs):
        x = inputs[0]
        axis = int(node.attrs.get("axis", 0)) % max(x.ndim, 1)
        if node.attrs.get("select_last_index", 0):
            flipped = np.flip(x, axis=axis)
            idx = x.shape[axis] - 1 - pick(flipped, axis=axis)
        else:
            idx = pick(x, axis=axis)
        idx = np.asarray(idx, dtype=np.int64)
        if node.attrs.get("keepdims", 1):
            idx = np.expand_dims(idx, axis)
        return [idx]

    return kernel


reference("ArgMax")(_arg_reduce(np.argmax))
reference("ArgMin")(_arg_reduce(np.argmin))

"""Reference kernels: CumSum, CumProd, TopK (stable ties), Trilu, Einsum (float64 accumulation)."""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir.dtypes import is_float
from polykit.compiler.ops.math.math_misc import parse_einsum
from polykit.compiler.ops.references import reference


def _wide(x: np.ndarray) -> np.ndarray:
    """x in the accumulation dtype: float64 for floats, 64-bit for integers."""
    if is_float(x.dtype):  # ml_dtypes floats
        return x.astype(np.float64)
    if np.issubdtype(x.dtype, np.unsignedinteger):
        return x.astype(np.uint64)
    return x.astype(np.int64)


@reference("CumSum", "CumProd")
def cumulative(node, inputs):
    """Running sum / product along the axis in the accumulation dtype (integer products wrap
    modulo 2**64 before the cast back, as the cuda kernels' do)."""
    x, axis = inputs
    a = int(np.asarray(axis).reshape(())) % max(x.ndim, 1)
    w = _wide(x)
    if node.attrs.get("reverse", 0):
        w = np.flip(w, axis=a)
    if node.op_type == "CumSum":
        out = np.cumsum(w, axis=a)
        if node.attrs.get("exclusive", 0):
            out = out - w
    else:
        if node.attrs.get("exclusive", 0):  # a 1 in front, the last element dropped (no division by zero)
            pad = [(0, 0)] * w.ndim
            pad[a] = (1, 0)
            w = np.take(np.pad(w, pad, constant_values=1), np.arange(w.shape[a]), axis=a)
        out = np.cumprod(w, axis=a)
    if node.attrs.get("reverse", 0):
        out = np.flip(out, axis=a)
    return [out.astype(x.dtype)]


@reference("TopK")
def topk(node, inputs):
    """The k largest (or smallest) along the axis; equal values keep ascending index order."""
    x, k = inputs
    k = int(np.asarray(k).reshape(-1)[0])
    axis = int(node.attrs.get("axis", -1)) % x.ndim
    n = x.shape[axis]
    if node.attrs.get("largest", 1):
        # a stable ascending sort of the reversed axis, read backwards: descending values,
        # ties by ascending original index
        order = np.flip(np.argsort(np.flip(x, axis=axis), axis=axis, kind="stable"), axis=axis)
        order = n - 1 - order
    else:
        order = np.argsort(x, axis=axis, kind="stable")
    idx = np.take(order, np.arange(k), axis=axis).astype(np.int64)
    return [np.take_along_axis(x, idx, axis=axis), idx]


@reference("Trilu")
def trilu(node, inputs):
    x = inputs[0]
    k = int(np.asarray(inputs[1]).reshape(())) if len(inputs) > 1 and inputs[1] is not None else 0
    fn = np.triu if node.attrs.get("upper", 1) else np.tril
    return [fn(x, k).astype(x.dtype)]


@reference("Einsum")
def einsum(node, inputs):
    terms, rhs = parse_einsum(node.attrs["equation"], len(inputs))
    out = np.einsum(",".join(terms) + "->" + rhs, *[_wide(x) for x in inputs])
    return [np.asarray(out).astype(inputs[0].dtype)]

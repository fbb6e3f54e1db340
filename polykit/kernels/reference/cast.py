"""Reference kernels: Cast and CastLike (numpy conversion; strings parse and print)."""

from __future__ import annotations

import numpy as np

from polykit.compiler import dtypes
from polykit.compiler.ops.cast import cast_target
from polykit.errors import PolykitError
from polykit.kernels.registry import reference

_STRING = np.dtype(object)


def convert(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """x as `dtype` with ONNX Cast semantics for the types polykit runs."""
    x = np.asarray(x)
    dtype = np.dtype(dtype)
    if dtype == _STRING and x.dtype != _STRING:
        return np.vectorize(_format, otypes=[object])(x) if x.size else np.empty(x.shape, object)
    if x.dtype == _STRING and dtype != _STRING:
        parsed = np.vectorize(lambda s: float(s.decode() if isinstance(s, bytes) else s), otypes=[np.float64])(x)
        x = parsed if x.size else np.empty(x.shape, np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(dtype)


def _format(v) -> str:
    if isinstance(v, (float, np.floating)):
        return str(np.float32(v)) if np.isfinite(v) else ("NaN" if np.isnan(v) else ("INF" if v > 0 else "-INF"))
    return str(v.item() if hasattr(v, "item") else v)


@reference("Cast")
def cast(node, inputs):
    return [convert(inputs[0], cast_target(node))]


@reference("CastLike")
def cast_like(node, inputs):
    like = np.asarray(inputs[1]).dtype
    if like not in dtypes.NUMPY_TO_ONNX:
        raise PolykitError(f"cannot cast to {like}: polykit does not run that element type",
                           where=node.describe(), hint="polykit runs float16/32/64, (u)int8-64, bool and string tensors")
    return [convert(inputs[0], like)]

"""Reference kernels: Cast (a row of the elementwise op table), CastLike (numpy conversion;
strings parse and print), BitCast."""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir import dtypes
from polykit.compiler.ops.tensor.cast import cast_target
from polykit.errors import PolykitError
from polykit.compiler.ops.elementwise_table import ANY_KIND, ElementwiseOp, register_elementwise
from polykit.compiler.ops.references import reference

_STRING = np.dtype(object)


#: float8 targets that `saturate=1` clamps to their finite range (ONNX Cast-19)
_SATURATING = {dtypes.ONNX_TO_NUMPY[code] for code in (17, 18, 19, 20) if code in dtypes.ONNX_TO_NUMPY}
_E8M0 = dtypes.ONNX_TO_NUMPY.get(24)


def convert(x: np.ndarray, dtype: np.dtype, saturate: bool = True, round_mode: str = "up") -> np.ndarray:
    """x as `dtype` with ONNX Cast semantics for the types polykit runs."""
    x = np.asarray(x)
    dtype = np.dtype(dtype)
    if dtype in _SATURATING and saturate and x.dtype != _STRING:
        import ml_dtypes

        info = ml_dtypes.finfo(dtype)
        with np.errstate(invalid="ignore"):
            return np.clip(x.astype(np.float32), float(info.min), float(info.max)).astype(dtype)
    if _E8M0 is not None and dtype == _E8M0 and x.dtype != _STRING:
        return _to_e8m0(x, saturate, round_mode)
    if dtype == _STRING and x.dtype != _STRING:
        return np.vectorize(_format, otypes=[object])(x) if x.size else np.empty(x.shape, object)
    if x.dtype == _STRING and dtype != _STRING:
        parsed = np.vectorize(lambda s: float(s.decode() if isinstance(s, bytes) else s), otypes=[np.float64])(x)
        x = parsed if x.size else np.empty(x.shape, np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(dtype)


def _to_e8m0(x: np.ndarray, saturate: bool, round_mode: str) -> np.ndarray:
    """float8e8m0 (a power-of-two exponent): the float32 exponent, rounded as `round_mode` says."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)
    exponent = ((bits >> 23) & 0xFF).astype(np.uint16)
    normal = exponent != 0xFF
    if round_mode == "up":
        up = ((bits & 0x7FFFFF) > 0) & normal
    elif round_mode == "nearest":
        guard, rest = (bits & 0x400000) > 0, (bits & 0x3FFFFF) > 0
        up = guard & (rest | (exponent > 0)) & normal
    else:  # "down"
        up = np.zeros(bits.shape, bool)
    if saturate:
        up &= exponent != 0xFE
    out = np.where(normal, exponent + up, 0xFF).astype(np.uint8)
    return out.view(_E8M0)


def _format(v) -> str:
    if isinstance(v, (float, np.floating)):
        return str(np.float32(v)) if np.isfinite(v) else ("NaN" if np.isnan(v) else ("INF" if v > 0 else "-INF"))
    return str(v.item() if hasattr(v, "item") else v)


def cast(node, inputs):
    return [convert(inputs[0], cast_target(node), bool(node.attrs.get("saturate", 1)),
                    str(node.attrs.get("round_mode", "up")))]


# shape rule and importers: compiler/ops/tensor/cast.py; the CUDA expression needs the CUDA storage
# types, so the CUDA side supplies it (kernels/cuda/storage_types.py: cast_expression)
register_elementwise(ElementwiseOp("Cast", None, cast, None, ANY_KIND, "cast", ("cast",),
                                   variants=({"to": 10}, {"to": 1})))


@reference("CastLike")
def cast_like(node, inputs):
    like = np.asarray(inputs[1]).dtype
    if like not in dtypes.NUMPY_TO_ONNX:
        raise PolykitError(f"cannot cast to {like}: polykit does not run that element type",
                           where=node.describe(), hint="polykit runs float16/32/64, (u)int8-64, bool and string tensors")
    return [convert(inputs[0], like, bool(node.attrs.get("saturate", 1)), str(node.attrs.get("round_mode", "up")))]


@reference("BitCast")
def bit_cast(node, inputs):
    """The same bytes read as `to` (a type of the input's width; the shape rule checks it)."""
    return [np.asarray(inputs[0], order="C").view(cast_target(node))]

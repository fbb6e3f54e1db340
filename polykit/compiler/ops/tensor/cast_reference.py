"""Reference kernels: Cast (a row of the elementwise op table), CastLike (numpy conversion;
strings parse and print), BitCast.

Float -> integer, for every integer type (int2/4/8/16/32/64 and the unsigned ones). ONNX's Cast
leaves NaN and out-of-range values undefined (only float8 targets saturate; QuantizeLinear
saturates); so do C and numpy's `astype` built on it, whose results differ between processors.
polykit's rule, the same on every target and machine:

    NaN -> 0; otherwise truncate toward zero, and a result below the type's minimum (-Inf
    included) or above its maximum (+Inf included) becomes that minimum / maximum.

Saturation rather than wrapping: it is the GPU's own conversion (PTX `cvt.rzi` saturates and
maps NaN to 0), Rust's `as` and WebAssembly's `trunc_sat`; it gives Inf a value (wrapping has
none), and it is QuantizeLinear's rule: polykit quantizes by applying it to rint(x / scale) +
zero_point (so NaN quantizes to 0). onnxruntime 1.32 (CPU, x86) has no rule of its own: it
keeps x86's invalid-conversion result (the most negative int32 / int64) and narrows 8/16/4-bit
targets through int32, so NaN, +-Inf and |x| >= 2**31 give 0 for int4/int8/int16 (as here for
NaN), INT32_MIN for int32, INT64_MIN for int64 (NaN, +-Inf); values inside int32 wrap
(300.0 -> int8 44, here 127); int4 rounds to nearest first (7.9 -> -8, here 7). Its
QuantizeLinear maps NaN to the type's minimum.
Integer -> integer keeps ONNX's rule (the low bits, two's complement); float -> bool is x != 0.
`float_to_int` implements the rule; on the device dtypes.cuh (Cvt), lowp.cuh (intn_bits),
tensor_misc.cu (cast_any), quantize.cu and int8_out.cuh (requantize) do.
"""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir import dtypes
from polykit.compiler.ops.tensor.cast import cast_target
from polykit.errors import PolykitError
from polykit.compiler.ops.elementwise_table import ANY_KIND, ElementwiseOp, register_elementwise
from polykit.compiler.ops.references import reference

try:  # the float8 / 4-bit types; without ml_dtypes (a lean install) they do not exist, numpy's iinfo serves
    import ml_dtypes
except ImportError:  # pragma: no cover - onnx, the toolkit's, depends on ml_dtypes
    ml_dtypes = None

_STRING = np.dtype(object)
_iinfo = ml_dtypes.iinfo if ml_dtypes is not None else np.iinfo


#: float8 targets that `saturate=1` clamps to their finite range (ONNX Cast-19)
_SATURATING = {dtypes.ONNX_TO_NUMPY[code] for code in (17, 18, 19, 20) if code in dtypes.ONNX_TO_NUMPY}
_E8M0 = dtypes.ONNX_TO_NUMPY.get(24)
#: ml_dtypes' integer types (numpy calls their dtypes kind "V", not integers)
_LOWP_INTS = {dtypes.ONNX_TO_NUMPY[code] for code in (21, 22, 25, 26) if code in dtypes.ONNX_TO_NUMPY}


def is_integer(dtype: np.dtype) -> bool:
    """numpy's integer types and ml_dtypes' 4- and 2-bit ones (bool is not an integer here)."""
    dtype = np.dtype(dtype)
    return bool(np.issubdtype(dtype, np.integer)) or dtype in _LOWP_INTS


def float_to_int(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Floats as the integer `dtype` by polykit's rule (module docstring): NaN -> 0, truncated
    toward zero, saturated to the type's range. Only in-range integral values reach `astype`."""
    dtype = np.dtype(dtype)
    info = _iinfo(dtype)
    with np.errstate(invalid="ignore"):  # (a signalling NaN warns as it becomes a quiet one)
        t = np.trunc(np.asarray(x, np.float64))  # every float type converts to float64 exactly
        # float(info.max) is info.max or, past 2**53, the power of two above it: either way a
        # truncated t below it is in range, and one at or above it saturates
        high, low = t >= float(info.max), t <= float(info.min)
        safe = np.where(np.isnan(t) | high | low, 0.0, t)
    wide = np.uint64 if info.max > np.iinfo(np.int64).max else np.int64
    out = safe.astype(wide)
    out = np.where(high, wide(info.max), np.where(low, wide(info.min), out))
    return out.astype(dtype)


def convert(x: np.ndarray, dtype: np.dtype, saturate: bool = True, round_mode: str = "up") -> np.ndarray:
    """x as `dtype` with ONNX Cast semantics for the types polykit runs."""
    x = np.asarray(x)
    dtype = np.dtype(dtype)
    if dtype in _SATURATING and saturate and x.dtype != _STRING:
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
    if is_integer(dtype) and dtypes.is_float(x.dtype):
        return float_to_int(x, dtype)
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

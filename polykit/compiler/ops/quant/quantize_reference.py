"""Reference kernels: QuantizeLinear (round half to even, saturate), DequantizeLinear,
DynamicQuantizeLinear (uint8, as ONNX defines it). An integer output is rint(x / scale) +
zero_point converted by polykit's float -> integer rule (reference/cast.py): saturated to the
type's range, as ONNX says, and NaN -> 0, where ONNX says nothing."""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir import dtypes
from polykit.compiler.ops.tensor.cast_reference import float_to_int
from polykit.compiler.ops.references import reference


def _broadcast_param(p: np.ndarray, x: np.ndarray, node) -> np.ndarray:
    """A scale / zero point shaped to broadcast against x (per tensor, axis or block)."""
    p = np.asarray(p)
    block = int(node.attrs.get("block_size", 0))
    if p.size == 1 and block <= 0 or x.ndim == 0:  # per tensor: `axis` is not read
        return p.reshape(())
    axis = int(node.attrs.get("axis", 1)) % x.ndim
    if block > 0:
        return np.repeat(p, block, axis=axis)[tuple(slice(0, n) for n in x.shape)]
    return p.reshape([-1 if i == axis else 1 for i in range(x.ndim)])


def _out_dtype(node, zero_point: np.ndarray | None) -> np.dtype:
    if zero_point is not None:
        return zero_point.dtype
    code = int(node.attrs.get("output_dtype", 0))
    return dtypes.to_numpy(code) if code else np.dtype(np.uint8)


@reference("QuantizeLinear")
def quantize_linear(node, inputs):
    x, scale = inputs[0], inputs[1]
    zp = inputs[2] if len(inputs) > 2 else None
    out = _out_dtype(node, zp)
    # the division runs in the scale's dtype (or `precision`), as the spec says; rint rounds half to even
    code = int(node.attrs.get("precision", 0))
    precision = dtypes.to_numpy(code) if code else scale.dtype
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        q = np.rint(x.astype(precision) / _broadcast_param(scale, x, node).astype(precision)).astype(np.float64)
    if out.name.startswith("float"):  # float8 / float4 (ml_dtypes): a saturating cast of x / scale, no rounding
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            y = x.astype(precision) / _broadcast_param(scale, x, node).astype(precision)
        if zp is not None and out.name.startswith("float4"):
            y = y + _broadcast_param(zp, x, node).astype(np.float32)
        if bool(node.attrs.get("saturate", 1)) or out.name.startswith("float4"):
            import ml_dtypes  # `out` is one of its types, so it is installed

            info = ml_dtypes.finfo(out)
            y = np.clip(y, float(info.min), float(info.max))
        return [y.astype(out)]
    if zp is not None:
        q = q + _broadcast_param(zp, x, node).astype(np.float64)
    return [float_to_int(q, out)]


@reference("DequantizeLinear")
def dequantize_linear(node, inputs):
    x, scale = inputs[0], inputs[1]
    zp = inputs[2] if len(inputs) > 2 else None
    code = int(node.attrs.get("output_dtype", 0))
    out = dtypes.to_numpy(code) if code else scale.dtype
    centered = x.astype(np.float64)
    if zp is not None:
        centered = centered - _broadcast_param(zp, x, node).astype(np.float64)
    return [(centered * _broadcast_param(scale, x, node).astype(np.float64)).astype(out)]


@reference("DynamicQuantizeLinear")
def dynamic_quantize_linear(node, inputs):
    """uint8 with the range [min(x, 0), max(x, 0)], computed in float32 like ONNX's spec."""
    x = inputs[0].astype(np.float32)
    hi = np.float32(max(0.0, float(np.max(x)))) if x.size else np.float32(0)
    lo = np.float32(min(0.0, float(np.min(x)))) if x.size else np.float32(0)
    scale = np.float32(1.0 if hi == lo else hi - lo) / np.float32(255)
    with np.errstate(invalid="ignore"):  # x holding both infinities: scale inf, -lo / scale NaN
        zp = np.rint(np.float32(0) - lo / scale)
        y = np.rint(x / scale) + float_to_int(zp, np.uint8)
    return [float_to_int(y, np.uint8), np.array(scale, np.float32), float_to_int(zp, np.uint8)]

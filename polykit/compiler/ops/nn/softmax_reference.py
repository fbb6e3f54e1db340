"""Reference kernels: Softmax, LogSoftmax, Hardmax along one axis (opset-13 form).

Softmax of float32/float64 computes in float64 and rounds once. float16/bfloat16 compute stage
by stage in their own type, as the spec's function body does (ReduceMax, Sub, Exp, ReduceSum,
Div, each giving T), with numpy's arithmetic for that type: numpy sums float16 in float32 and
rounds once, and bfloat16 (ml_dtypes) one addition at a time in bfloat16, in index order. That
is what ONNX's expected outputs hold (the 16-bit Attention expansions, bit for bit), and what
polykit's ONNX Attention reference does for its softmax stage.
"""

from __future__ import annotations

import numpy as np

from polykit.compiler.ops.references import reference


def _axis(node, x: np.ndarray) -> int:
    return int(node.attrs.get("axis", -1)) % x.ndim


def _empty_passthrough(kernel):
    """Empty input -> returned as is (np.max of an empty axis would raise); fp warnings silenced."""

    def wrapped(node, inputs):
        if inputs[0].size == 0:
            return [inputs[0].copy()]
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):  # all -inf rows give NaN, as in ONNX
            return kernel(node, inputs)

    wrapped.__doc__ = kernel.__doc__
    return wrapped


@reference("Softmax")
@_empty_passthrough
def softmax(node, inputs):
    x = inputs[0]
    a = _axis(node, x)
    if x.dtype.itemsize < 4:
        e = np.exp(x - np.max(x, axis=a, keepdims=True))
        return [(e / np.sum(e, axis=a, keepdims=True)).astype(x.dtype)]
    x64 = x.astype(np.float64)
    e = np.exp(x64 - np.max(x64, axis=a, keepdims=True))
    return [(e / np.sum(e, axis=a, keepdims=True)).astype(x.dtype)]


@reference("LogSoftmax")
@_empty_passthrough
def log_softmax(node, inputs):
    x = inputs[0]
    a = _axis(node, x)
    x64 = x.astype(np.float64)
    shifted = x64 - np.max(x64, axis=a, keepdims=True)
    return [(shifted - np.log(np.sum(np.exp(shifted), axis=a, keepdims=True))).astype(x.dtype)]


@reference("Hardmax")
@_empty_passthrough
def hardmax(node, inputs):
    """1 at the first maximum along the axis, 0 elsewhere."""
    x = inputs[0]
    a = _axis(node, x)
    first = np.expand_dims(np.argmax(x, axis=a), a)
    out = np.zeros_like(x)
    np.put_along_axis(out, first, 1, axis=a)
    return [out]

"""Reference kernels: Softmax, LogSoftmax, Hardmax along one axis (opset-13 form)."""

from __future__ import annotations

import numpy as np

from polykit.kernels.registry import reference


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

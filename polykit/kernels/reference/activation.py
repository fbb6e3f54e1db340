"""Reference kernels: activations (float math in float64, cast back to X's dtype)."""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from polykit.kernels.registry import reference

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _in_float64(fn: Callable[..., np.ndarray]):
    """A kernel computing `fn(x64, node)` in float64 and returning X's dtype."""

    def kernel(node, inputs):
        x = inputs[0]
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            y = fn(x.astype(np.float64), node)
        return [np.asarray(y).astype(x.dtype)]

    return kernel


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # exp of a negative magnitude only: no overflow for large |x|
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)


def _elu(x, node):
    alpha = node.attrs.get("alpha", 1.0)
    return np.where(x < 0, alpha * np.expm1(x), x)


def _selu(x, node):
    alpha = node.attrs.get("alpha", 1.67326319217681884765625)
    gamma = node.attrs.get("gamma", 1.05070102214813232421875)
    return gamma * np.where(x <= 0, alpha * np.expm1(x), x)


def _celu(x, node):
    alpha = node.attrs.get("alpha", 1.0)
    return np.maximum(0.0, x) + np.minimum(0.0, alpha * np.expm1(x / alpha))


def _hard_sigmoid(x, node):
    alpha, beta = node.attrs.get("alpha", 0.2), node.attrs.get("beta", 0.5)
    return np.clip(alpha * x + beta, 0.0, 1.0)


def _hard_swish(x, node):
    return x * np.clip(x / 6.0 + 0.5, 0.0, 1.0)


def _gelu(x, node):
    if node.attrs.get("approximate", "none") == "tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def _leaky_relu(x, node):
    return np.where(x < 0, node.attrs.get("alpha", 0.01) * x, x)


def _thresholded_relu(x, node):
    return np.where(x > node.attrs.get("alpha", 1.0), x, 0.0)


def _shrink(x, node):
    bias, lambd = node.attrs.get("bias", 0.0), node.attrs.get("lambd", 0.5)
    return np.where(x < -lambd, x + bias, np.where(x > lambd, x - bias, 0.0))


def _swish(x, node):
    return x * _sigmoid(node.attrs.get("alpha", 1.0) * x)


FLOAT_ACTIVATIONS: dict[str, Callable[[np.ndarray, object], np.ndarray]] = {
    "Sigmoid": lambda x, node: _sigmoid(x),
    "Tanh": lambda x, node: np.tanh(x),
    "Softplus": lambda x, node: _softplus(x),
    "Softsign": lambda x, node: x / (1.0 + np.abs(x)),
    "Mish": lambda x, node: x * np.tanh(_softplus(x)),
    "Elu": _elu,
    "Selu": _selu,
    "Celu": _celu,
    "HardSigmoid": _hard_sigmoid,
    "HardSwish": _hard_swish,
    "Gelu": _gelu,
    "LeakyRelu": _leaky_relu,
    "ThresholdedRelu": _thresholded_relu,
    "Shrink": _shrink,
    "Swish": _swish,
}
for _op, _fn in FLOAT_ACTIVATIONS.items():
    reference(_op)(_in_float64(_fn))


@reference("Relu")
def relu(node, inputs):
    x = inputs[0]
    return [np.maximum(x, np.zeros((), x.dtype))]


@reference("PRelu")
def prelu(node, inputs):
    x, slope = inputs
    if np.issubdtype(x.dtype, np.integer):
        y = np.where(x < 0, x.astype(np.int64) * slope.astype(np.int64), x)
    else:
        y = np.where(x < 0, x.astype(np.float64) * slope.astype(np.float64), x)
    return [np.broadcast_to(y, x.shape).astype(x.dtype)]


@reference("Clip")
def clip(node, inputs):
    x = inputs[0]
    lo = inputs[1] if len(inputs) > 1 else None
    hi = inputs[2] if len(inputs) > 2 else None
    y = x
    # max then min, as ONNX defines it: with min > max every element becomes max
    if lo is not None:
        y = np.maximum(y, np.asarray(lo).reshape(()).astype(x.dtype))
    if hi is not None:
        y = np.minimum(y, np.asarray(hi).reshape(()).astype(x.dtype))
    return [np.asarray(y, dtype=x.dtype)]

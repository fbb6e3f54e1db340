"""Activations: numpy reference kernels (float math in float64, cast back to X's dtype) and their
rows of the elementwise op table (polykit.compiler.ops.elementwise_table)."""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from polykit.compiler.ops.math.elementwise import same_as_input
from polykit.compiler.ops.elementwise_table import NUMERIC, ElementwiseOp, call, register_elementwise

_erf = np.vectorize(math.erf, otypes=[np.float64])


SELU_ALPHA, SELU_GAMMA = 1.67326319217681884765625, 1.05070102214813232421875


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
    alpha = node.attrs.get("alpha", SELU_ALPHA)
    gamma = node.attrs.get("gamma", SELU_GAMMA)
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


def _cuda_gelu(a, at):
    return f"pk_gelu_tanh({a[0]})" if at.get("approximate", "none") == "tanh" else f"pk_gelu({a[0]})"


def _cuda_clip(a, at):
    x, lo, hi = (a + [None, None, None])[:3]
    if lo and hi:
        return f"pk_clip({x}, {lo}, {hi})"
    if lo:
        return f"pk_clip_lo({x}, {lo})"
    return f"pk_clip_hi({x}, {hi})" if hi else x


#: float activations computed in float64: (op, f(x64, node), CUDA emitter); NetworkDefinition's
#: add_activation takes each under its snake-case name, with the emitter's attributes
FLOAT_ACTIVATIONS = (
    ("Sigmoid", lambda x, node: _sigmoid(x), call("pk_sigmoid")),
    ("Tanh", lambda x, node: np.tanh(x), call("pk_tanh")),
    ("Softplus", lambda x, node: _softplus(x), call("pk_softplus")),
    ("Softsign", lambda x, node: x / (1.0 + np.abs(x)), call("pk_softsign")),
    ("Mish", lambda x, node: x * np.tanh(_softplus(x)), call("pk_mish")),
    ("Elu", _elu, call("pk_elu", alpha=1.0)),
    ("Selu", _selu, call("pk_selu", alpha=SELU_ALPHA, gamma=SELU_GAMMA)),
    ("Celu", _celu, call("pk_celu", alpha=1.0)),
    ("HardSigmoid", _hard_sigmoid, call("pk_hard_sigmoid", alpha=0.2, beta=0.5)),
    ("HardSwish", _hard_swish, call("pk_hard_swish")),
    ("LeakyRelu", _leaky_relu, call("pk_leaky_relu", alpha=0.01)),
    ("ThresholdedRelu", _thresholded_relu, call("pk_thresholded_relu", alpha=1.0)),
    ("Shrink", _shrink, call("pk_shrink", bias=0.0, lambd=0.5)),
    ("Swish", _swish, call("pk_swish", alpha=1.0)),
)


def relu(node, inputs):
    x = inputs[0]
    return [np.maximum(x, np.zeros((), x.dtype))]


def prelu(node, inputs):
    x, slope = inputs
    if np.issubdtype(x.dtype, np.integer):
        y = np.where(x < 0, x.astype(np.int64) * slope.astype(np.int64), x)
    else:
        y = np.where(x < 0, x.astype(np.float64) * slope.astype(np.float64), x)
    return [np.broadcast_to(y, x.shape).astype(x.dtype)]


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


ROWS = [
    *(ElementwiseOp(op, same_as_input, _in_float64(fn), cuda, api="activation") for op, fn, cuda in FLOAT_ACTIVATIONS),
    ElementwiseOp("Gelu", same_as_input, _in_float64(_gelu), _cuda_gelu, api="activation", params=("approximate",),
                  variants=({}, {"approximate": "tanh"})),
    ElementwiseOp("Relu", same_as_input, relu, call("pk_relu"), NUMERIC, api="activation"),
    # PRelu and Clip: shape rules with their importers (compiler/ops/activation.py); add_activation
    # takes them as prelu(slope) and clip(min, max), inputs rather than attributes
    ElementwiseOp("PRelu", None, prelu, call("pk_prelu"), arity=2),
    ElementwiseOp("Clip", None, clip, _cuda_clip, NUMERIC, arity=3),
]
for _row in ROWS:
    register_elementwise(_row)

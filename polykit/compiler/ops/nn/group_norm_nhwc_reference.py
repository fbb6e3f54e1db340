"""Reference kernel of ai.polykit GroupNormNHWC (group_norm_nhwc.py): the channels-last input moved
to channels first, ONNX GroupNormalization's reference, the result moved back; then the node's
`activation` on the normalized values (rounded to X's dtype first, as the unfused norm stored them),
computed in float64 like the activation ops' references."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.ops.nn.activation_reference import _gelu, _sigmoid
from polykit.compiler.ops.nn.group_norm_nhwc import GROUP_NORM_NHWC, norm_activation
from polykit.compiler.ops.nn.normalization_reference import group_normalization
from polykit.compiler.ops.references import reference

_ERF_GELU = Node("Gelu", [], [], {"approximate": "none"})
_TANH_GELU = Node("Gelu", [], [], {"approximate": "tanh"})
#: NORM_ACTIVATIONS (but "none") on float64 values
ACTIVATIONS = {
    "relu": lambda y: np.maximum(y, 0.0),
    "sigmoid": _sigmoid,
    "tanh": np.tanh,
    "silu": lambda y: y * _sigmoid(y),
    "gelu": lambda y: _gelu(y, _ERF_GELU),
    "gelu_tanh": lambda y: _gelu(y, _TANH_GELU),
}


@reference(GROUP_NORM_NHWC, domain=POLYKIT_DOMAIN)
def group_norm_nhwc(node: Node, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    x, scale, bias = inputs[:3]
    first = np.moveaxis(x, -1, 1)
    (y,) = group_normalization(node, [first, scale, bias])
    y = np.ascontiguousarray(np.moveaxis(y, 1, -1))
    act = norm_activation(node.attrs)
    if act != "none":
        with np.errstate(over="ignore", invalid="ignore"):
            y = ACTIVATIONS[act](y.astype(np.float64)).astype(x.dtype)
    return [y]

"""Reference kernel of ai.polykit GroupNormNHWC (group_norm_nhwc.py): the channels-last input moved
to channels first, ONNX GroupNormalization's reference, the result moved back."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.ops.nn.group_norm_nhwc import GROUP_NORM_NHWC
from polykit.compiler.ops.nn.normalization_reference import group_normalization
from polykit.compiler.ops.references import reference


@reference(GROUP_NORM_NHWC, domain=POLYKIT_DOMAIN)
def group_norm_nhwc(node: Node, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    x, scale, bias = inputs[:3]
    first = np.moveaxis(x, -1, 1)
    (y,) = group_normalization(node, [first, scale, bias])
    return [np.ascontiguousarray(np.moveaxis(y, 1, -1))]

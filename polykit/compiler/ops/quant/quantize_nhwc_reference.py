"""Reference kernel of ai.polykit QuantizeNHWC: QuantizeLinear's reference, transposed to NHWC,
the channels past X's filled with the zero point."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.ops.nn.channels_last import TO_NHWC
from polykit.compiler.ops.quant.quantize_nhwc import KIND
from polykit.compiler.ops.quant.quantize_reference import quantize_linear
from polykit.compiler.ops.references import reference


@reference(KIND, domain=POLYKIT_DOMAIN)
def quantize_nhwc(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x, scale, zero = inputs[:3]
    (q,) = quantize_linear(Node("QuantizeLinear", list(node.inputs[:3]), list(node.outputs)), [x, scale, zero])
    n, c, h, w = x.shape
    y = np.full((n, h, w, int(node.attrs["channels"])), np.asarray(zero).reshape(()), zero.dtype)
    y[..., :c] = np.transpose(q, TO_NHWC)
    return [y]

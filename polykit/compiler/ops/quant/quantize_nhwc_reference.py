"""Reference kernel of ai.polykit QuantizeNHWC: QuantizeLinear's reference of X (zero-padded by `pads`
and space-to-depth'd by `block`, when given: ONNX Pad then SpaceToDepth, DCR), transposed to NHWC, the
channels past its own filled with the zero point."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.ops.nn.channels_last import TO_NHWC
from polykit.compiler.ops.quant.quantize_nhwc import KIND, block_and_pads
from polykit.compiler.ops.quant.quantize_reference import quantize_linear
from polykit.compiler.ops.references import reference
from polykit.errors import ShapeError


@reference(KIND, domain=POLYKIT_DOMAIN)
def quantize_nhwc(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x, scale, zero = inputs[:3]
    geometry = block_and_pads(node.attrs)
    if isinstance(geometry, str):
        raise ShapeError(geometry, where=node.describe(), hint="fuse_quantize_nhwc builds it")
    s, (top, left, bottom, right) = geometry
    if s > 1 or any((top, left, bottom, right)):
        x = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
        n, c, h, w = x.shape
        if h % s or w % s:
            raise ShapeError(f"padded X {x.shape} is not whole blocks of {s}", where=node.describe(),
                             hint="pads must make the height and width multiples of block")
        # SpaceToDepth (DCR): channel (bh * s + bw) * C + c of block (i, j) is X[c, i * s + bh, j * s + bw]
        x = np.ascontiguousarray(x.reshape(n, c, h // s, s, w // s, s).transpose(0, 3, 5, 1, 2, 4))
        x = x.reshape(n, c * s * s, h // s, w // s)
    (q,) = quantize_linear(Node("QuantizeLinear", list(node.inputs[:3]), list(node.outputs)), [x, scale, zero])
    n, c, h, w = x.shape
    y = np.full((n, h, w, int(node.attrs["channels"])), np.asarray(zero).reshape(()), zero.dtype)
    y[..., :c] = np.transpose(q, TO_NHWC)
    return [y]

"""Reference kernel of ai.polykit AttentionQuantize: Attention's reference, then QuantizeLinear's on its
output (in Q's type), as the two ops computed it."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.ops.nn.fused_reference import attention
from polykit.compiler.ops.quant.attention_quantize import ATTENTION_ARITY, KIND, Y_SCALE, Y_ZERO
from polykit.compiler.ops.quant.quantize_reference import quantize_linear
from polykit.compiler.ops.references import reference


@reference(KIND, domain=POLYKIT_DOMAIN)
def attention_quantize(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    inner = Node("Attention", list(node.inputs[:ATTENTION_ARITY]), ["o"], dict(node.attrs), domain=POLYKIT_DOMAIN)
    (o,) = attention(inner, list(inputs[:ATTENTION_ARITY]) if inputs[3] is not None else list(inputs[:3]))
    (q,) = quantize_linear(Node("QuantizeLinear", ["o", *node.inputs[Y_SCALE:]], ["q"]),
                           [o, inputs[Y_SCALE], inputs[Y_ZERO]])
    return [q]

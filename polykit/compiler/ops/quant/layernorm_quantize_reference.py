"""Reference kernel of ai.polykit LayerNormQuantize: LayerNormalization's reference, then QuantizeLinear's
on its output (in X's type), as the two ops computed it."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.ops.nn.normalization_reference import layer_normalization
from polykit.compiler.ops.quant.layernorm_quantize import BIAS, KIND, X, Y_SCALE, Y_ZERO
from polykit.compiler.ops.quant.quantize_reference import quantize_linear
from polykit.compiler.ops.references import reference


@reference(KIND, domain=POLYKIT_DOMAIN)
def layernorm_quantize(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    norm = Node("LayerNormalization", list(node.inputs[:BIAS + 1]), ["y"], dict(node.attrs))
    (y,) = layer_normalization(norm, [a for a in inputs[:BIAS + 1] if a is not None])
    (q,) = quantize_linear(Node("QuantizeLinear", ["y", *node.inputs[Y_SCALE:]], ["q"]),
                           [y, inputs[Y_SCALE], inputs[Y_ZERO]])
    return [q, y][:len(node.outputs)]

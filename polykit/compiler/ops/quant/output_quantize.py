"""The layers whose output stage quantizes (passes.fuse_output_quantize): LayerNormQuantize, AttentionQuantize."""

from __future__ import annotations

from typing import Any

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.ops.quant.attention_quantize import KIND as ATTENTION_KIND
from polykit.compiler.ops.quant.layernorm_quantize import KIND as NORM_KIND

KINDS = frozenset({NORM_KIND, ATTENTION_KIND})


def is_quantized_output(layer: Any) -> bool:
    """Whether a layer or node is one of KINDS (the builder unfuses those no tactic of its target runs)."""
    kind = getattr(layer, "kind", None) or getattr(layer, "op_type", "")
    return layer.domain == POLYKIT_DOMAIN and kind in KINDS

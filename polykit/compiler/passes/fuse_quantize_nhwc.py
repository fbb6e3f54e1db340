"""fuse_quantize_nhwc: QuantizeLinear -> Transpose(0, 2, 3, 1) [-> Pad of the last dim with the
zero point] as one ai.polykit QuantizeNHWC (ops/quantize_nhwc.py): an --int8 plan's image input,
which to_channels_last leaves as three passes over the image (quantize, layout, channel pad).

Taken: float32 X of rank 4, a constant per-tensor float32 scale and a constant int8 / uint8 zero
point, or a float8_e4m3fn +0 one with saturate 1 (an --fp8 plan's image; no block_size, no precision
other than float32), a Pad in constant mode that pads only the
end of the last dim with a value equal to the zero point (none: the zero point's 0 default when
it is 0). The intermediate tensors must be read by the chain alone (patterns.py's rule).
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Graph, Node
from polykit.compiler.ops.nn.channels_last import TO_NHWC
from polykit.compiler.ops.quant.quantize_nhwc import INT8_DTYPES, KIND, OUT_DTYPES
from polykit.compiler.passes.patterns import Match, Op, Rule, Var, rewrite
from polykit.compiler.passes.rewrite import const

F32 = np.dtype(np.float32)
QUANTIZED = Op("QuantizeLinear", (Var("x"), Var("scale"), Var("zero")), node="q")
TRANSPOSED = Op("Transpose", (QUANTIZED,), node="t", where=lambda n, m: tuple(n.attrs.get("perm", ())) == TO_NHWC)
PADDED = Op("Pad", (TRANSPOSED, Var("pads")), rest=True, node="pad")


def _quantize_ok(m: Match) -> bool:
    g, q = m.graph, m.named["q"]
    x, scale, zero = g.value(m["x"]), const(g, m["scale"]), const(g, m["zero"])
    return (x.dtype == F32 and x.shape is not None and len(x.shape) == 4 and scale is not None
            and scale.dtype == F32 and scale.size == 1 and zero is not None and zero.size == 1
            and (zero.dtype in INT8_DTYPES or _e4m3_plus_zero(zero) and int(q.attrs.get("saturate", 1)))
            and int(q.attrs.get("block_size", 0)) <= 0 and int(q.attrs.get("precision", 0)) in (0, 1))


def _e4m3_plus_zero(zero: np.ndarray) -> bool:
    """A float8_e4m3fn zero point of +0 (the kernel pads with 0 bytes; -0 is 0x80)."""
    return zero.dtype in OUT_DTYPES[len(INT8_DTYPES):] and not zero.view(np.uint8).any()


def _channel_pad(m: Match) -> int | None:
    """The channels the Pad adds at the end of the last dim, or None when it does anything else."""
    g, pad = m.graph, m.named["pad"]
    pads = const(g, m["pads"])
    if (pad.attrs.get("mode", "constant") != "constant" or pads is None or pads.shape != (8,)
            or np.any(np.delete(pads, 7)) or pads[7] < 0 or (len(pad.inputs) > 3 and pad.inputs[3])):
        return None
    zero = const(g, m["zero"]).reshape(-1)[0]
    value = const(g, pad.input(2)) if pad.input(2) else np.zeros((), zero.dtype)
    ok = value is not None and value.dtype == zero.dtype and value.size == 1 and value.reshape(-1)[0] == zero
    return int(pads[7]) if ok else None


def _build(m: Match, extra: int) -> list[Node]:
    channels = int(m.graph.value(m["x"]).shape[1]) + extra
    return [Node(KIND, [m["x"], m["scale"], m["zero"]], [m.root.outputs[0]], {"channels": channels},
                 name=m.graph.fresh_name(f"{m.named['q'].name or 'quantize'}_nhwc"), domain=POLYKIT_DOMAIN)]


RULES = [Rule(PADDED, lambda m: _build(m, _channel_pad(m)), accept=lambda m: _quantize_ok(m) and _channel_pad(m) is not None),
         Rule(TRANSPOSED, lambda m: _build(m, 0), accept=_quantize_ok)]


def fuse_quantize_nhwc(graph: Graph, *, keep: Iterable[str] = frozenset()) -> bool:
    """Fold each quantize-to-NHWC chain into one QuantizeNHWC; True if any."""
    return rewrite(graph, RULES, keep=keep)

"""fuse_quantize_nhwc: QuantizeLinear -> Transpose(0, 2, 3, 1) [-> Pad of the last dim with the
zero point] as one ai.polykit QuantizeNHWC (ops/quantize_nhwc.py): an --int8 plan's image input,
which to_channels_last leaves as three passes over the image (quantize, layout, channel pad).
QuantizeLinear's X may be SpaceToDepth (DCR) of X or of a zero Pad of X's height and width (a
space-to-depth stem's input, space_to_depth_stems): they fold into the QuantizeNHWC's `block` and
`pads`, so an --fp16 --int8 / --fp8 build's image takes one pass where Cast, Pad, SpaceToDepth, Cast
and the quantize took five (fuse_quantize_nhwc runs in the layout group, before convert_precision).

Taken: float32 X of rank 4, a constant per-tensor float32 scale and a constant int8 / uint8 zero
point, or a float8_e4m3fn +0 one with saturate 1 (an --fp8 plan's image; no block_size, no precision
other than float32), a Pad in constant mode that pads only the
end of the last dim with a value equal to the zero point (none: the zero point's 0 default when
it is 0). The stem's Pad: constant mode, non-negative pads on the two spatial axes only, a value of
+0.0 or none (Q(0) is then the zero point's byte; -0.0 is refused: e4m3 encodes it 0x80), no `axes`.
The intermediate tensors must be read by the chain alone (patterns.py's rule): where the stem's Pad
or SpaceToDepth output is read elsewhere, the smaller chain after it is taken.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Graph, Node
from polykit.compiler.ops.nn.channels_last import TO_NHWC
from polykit.compiler.ops.quant.quantize_nhwc import INT8_DTYPES, KIND, OUT_DTYPES
from polykit.compiler.passes.patterns import Match, Op, Pattern, Rule, Var, rewrite
from polykit.compiler.passes.rewrite import const

F32 = np.dtype(np.float32)


def _dcr(node: Node, m: Match) -> bool:
    b = node.attrs.get("blocksize")
    return (node.attrs.get("mode", "DCR") == "DCR" and isinstance(b, (int, np.integer))
            and not isinstance(b, bool) and b >= 1)


def _spatial_zero_pad(node: Node, m: Match) -> bool:
    """A constant-mode Pad of a rank-4 tensor's height and width only, non-negative, by +0.0 (or no value)."""
    g = m.graph
    pads = const(g, node.input(1))
    if (node.attrs.get("mode", "constant") != "constant" or pads is None or pads.shape != (8,)
            or pads.dtype.kind not in "iu" or np.any(pads[[0, 1, 4, 5]]) or np.any(pads < 0)
            or (len(node.inputs) > 3 and node.inputs[3])):
        return False
    if not node.input(2):
        return True
    value = const(g, node.input(2))
    return (value is not None and value.dtype == F32 and value.size == 1
            and not value.reshape(-1)[:1].view(np.uint32).any())


def _chain(source: Pattern) -> tuple[Op, Op]:
    """(Q -> Transpose, Q -> Transpose -> Pad) patterns of a QuantizeLinear whose X `source` matches."""
    quantized = Op("QuantizeLinear", (source, Var("scale"), Var("zero")), node="q")
    transposed = Op("Transpose", (quantized,), node="t", where=lambda n, m: tuple(n.attrs.get("perm", ())) == TO_NHWC)
    return transposed, Op("Pad", (transposed, Var("pads")), rest=True, node="pad")


#: QuantizeLinear's X: SpaceToDepth of a spatial zero Pad of x, SpaceToDepth of x, x (the largest first)
SOURCES = (Op("SpaceToDepth", (Op("Pad", (Var("x"), Var("xpads")), rest=True, node="xpad", where=_spatial_zero_pad),),
              node="s2d", where=_dcr),
           Op("SpaceToDepth", (Var("x"),), node="s2d", where=_dcr),
           Var("x"))
CHAINS = [_chain(source) for source in SOURCES]
TRANSPOSED, PADDED = CHAINS[-1]


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


def _geometry(m: Match) -> tuple[int, list[int]] | None:
    """(block, [top, left, bottom, right]) the match folds (1 and zeros without a SpaceToDepth), or None where
    the padded height or width is not whole blocks or unknown."""
    s2d, pad = m.named.get("s2d"), m.named.get("xpad")
    if s2d is None:
        return 1, [0, 0, 0, 0]
    s = int(s2d.attrs["blocksize"])
    pads = [0, 0, 0, 0] if pad is None else [int(p) for p in const(m.graph, m["xpads"])[[2, 3, 6, 7]]]
    _, _, h, w = m.graph.value(m["x"]).shape
    if not isinstance(h, int) or not isinstance(w, int) or (h + pads[0] + pads[2]) % s or (w + pads[1] + pads[3]) % s:
        return None
    return s, pads


def _build(m: Match, extra: int) -> list[Node]:
    s, pads = _geometry(m)
    channels = int(m.graph.value(m["x"]).shape[1]) * s * s + extra
    attrs: dict = {"channels": channels}
    if s > 1:
        attrs["block"] = s
    if any(pads):
        attrs["pads"] = pads
    return [Node(KIND, [m["x"], m["scale"], m["zero"]], [m.root.outputs[0]], attrs,
                 name=m.graph.fresh_name(f"{m.named['q'].name or 'quantize'}_nhwc"), domain=POLYKIT_DOMAIN)]


def _ok(m: Match) -> bool:
    return _quantize_ok(m) and isinstance(m.graph.value(m["x"]).shape[1], int) and _geometry(m) is not None


RULES = ([Rule(padded, lambda m: _build(m, _channel_pad(m)), accept=lambda m: _ok(m) and _channel_pad(m) is not None)
          for _, padded in CHAINS]
         + [Rule(transposed, lambda m: _build(m, 0), accept=_ok) for transposed, _ in CHAINS])


def fuse_quantize_nhwc(graph: Graph, *, keep: Iterable[str] = frozenset()) -> bool:
    """Fold each quantize-to-NHWC chain into one QuantizeNHWC; True if any."""
    return rewrite(graph, RULES, keep=keep)

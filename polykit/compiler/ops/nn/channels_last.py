"""Channels-last (NHWC) ops of domain ai.polykit: ConvNHWC, MaxPoolNHWC, AveragePoolNHWC.

The `to_channels_last` pass creates them (docs/FUSION.md, "Channels last", is the contract).
Each is its ONNX namesake on transposed operands: X [N, H, W, C] instead of [N, C, H, W],
ConvNHWC's W [M, kH, kW, C/group] (KRSC) instead of [M, C/group, kH, kW], Y [N, OH, OW, M];
attributes as ONNX's, with explicit pads (no auto_pad). ConvNHWC may carry an epilogue like
the fused ai.polykit Conv (fused.py): then its extra inputs are in the output's NHWC layout.
Shape rules run the ONNX op's rule on the transposed shapes, so the geometry is the same code.

ConvNHWC's `depth_to_space` = [bH, bW] (block sizes; passes.fold_depth_to_space sets it) stores the
convolution's output [N, OH, OW, bH * bW * C] rearranged depth-to-space (ONNX DepthToSpace's DCR
order on NHWC): output channel j = (dy, dx, c) of pixel (n, oh, ow) goes to pixel (n, oh * bH + dy,
ow * bW + dx), channel c of Y [N, OH * bH, OW * bW, C]. Element (pixel m, channel j) lies at
row_off(m) + col_off(j) with row_off = ((n * OH + oh) * bH * OW * bW + ow * bW) * LDY and col_off
= (dy * OW * bW + dx) * LDY + c (LDY: elements between Y's pixels, C when dense), so a kernel computes
one term per row and one per column. An epilogue runs on Y's values (it may have no extra inputs).
"""

from __future__ import annotations

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node, Shape
from polykit.compiler.ops.nn.fused import infer_epilogue
from polykit.compiler.ops.registry import InferContext, find_shape_rule, shape_rule

#: NHWC op -> the ONNX op it transposes
NCHW_OPS = {"ConvNHWC": "Conv", "MaxPoolNHWC": "MaxPool", "AveragePoolNHWC": "AveragePool"}
#: NCHW -> NHWC and back (also KCRS weights -> KRSC and back)
TO_NHWC = (0, 2, 3, 1)
TO_NCHW = (0, 3, 1, 2)
#: ConvNHWC's attribute: its output stored depth-to-space with these [bH, bW] blocks (module docstring)
DEPTH_TO_SPACE = "depth_to_space"
#: ConvNHWC inputs of group-1 convolutions made by to_channels_last have C % CHANNEL_ALIGN == 0
CHANNEL_ALIGN = 8


def permuted(shape: Shape, perm: tuple[int, ...]) -> Shape:
    """`shape` with its dims in the order `perm` (numpy.transpose's rule); None stays None."""
    return None if shape is None else tuple(shape[p] for p in perm)


def nchw_node(node: Node) -> Node:
    """The ONNX node an NHWC node computes on NCHW operands (epilogue and fused_from dropped)."""
    attrs = {k: v for k, v in node.attrs.items() if k not in ("epilogue", "fused_from", DEPTH_TO_SPACE)}
    inputs = list(node.inputs[:3] if node.op_type == "ConvNHWC" else node.inputs[:1])
    return Node(NCHW_OPS[node.op_type], inputs, list(node.outputs[:1]), attrs, name=node.name)


@shape_rule(*NCHW_OPS, domain=POLYKIT_DOMAIN)
def _nhwc(ctx: InferContext):
    node = ctx.node
    if node.attrs.get("epilogue"):
        if node.op_type != "ConvNHWC":
            raise ctx.fail(f"{node.op_type} takes no epilogue", hint="only ConvNHWC has an epilogue form")
        return infer_epilogue(ctx)
    if node.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", ""):
        raise ctx.fail("auto_pad is not part of the NHWC ops' form", hint="give explicit pads (to_channels_last does)")
    base = nchw_node(node)
    spatial_operands = 2 if node.op_type == "ConvNHWC" else 1  # X, and ConvNHWC's W
    for i in range(spatial_operands):
        if ctx.rank(i) not in (None, 4):
            raise ctx.fail(f"input {i} has rank {ctx.rank(i)}; the NHWC ops are 2-D (rank 4)",
                           hint="1-D and 3-D convolutions and pools stay NCHW")
    n = len(base.inputs)
    shapes = [permuted(ctx.shape(i), TO_NCHW) if i < spatial_operands else ctx.shape(i) for i in range(n)]
    sub = InferContext(base, [ctx.dtype(i) for i in range(n)], shapes, [None] * n)
    (dtype, shape), *_ = find_shape_rule("", base.op_type)(sub)
    shape = permuted(shape, TO_NHWC)
    if DEPTH_TO_SPACE in node.attrs:
        if node.op_type != "ConvNHWC":
            raise ctx.fail(f"{node.op_type} takes no {DEPTH_TO_SPACE}", hint="only ConvNHWC stores depth-to-space")
        try:
            shape = depth_to_space_shape(shape, depth_to_space_blocks(node.attrs, ctx.fail))
        except ValueError as exc:
            raise ctx.fail(str(exc), hint=f"{DEPTH_TO_SPACE} needs output channels a multiple of bH * bW") from None
    return [(dtype, shape)]


def depth_to_space_blocks(attrs, fail) -> tuple[int, int] | None:
    """ConvNHWC's validated depth_to_space blocks (bH, bW), or None without the attribute;
    `fail(what, hint)` builds the error of a malformed one."""
    blocks = attrs.get(DEPTH_TO_SPACE)
    if blocks is None:
        return None
    try:
        bh, bw = (int(b) for b in blocks)
    except (TypeError, ValueError):
        raise fail(f"{DEPTH_TO_SPACE} is {blocks!r}, not two block sizes", hint="give [bH, bW], e.g. [2, 2]") from None
    if bh < 1 or bw < 1:
        raise fail(f"{DEPTH_TO_SPACE} blocks {[bh, bw]} are not positive", hint="give block sizes >= 1")
    return bh, bw


def conv_output_shape(attrs, stored: tuple[int, ...]) -> tuple[int, ...]:
    """The convolution's own output [N, OH, OW, M] of a ConvNHWC whose Y is `stored` (Y's shape,
    static): Y itself, or with depth_to_space [bH, bW] the shape before the rearrangement."""
    blocks = attrs.get(DEPTH_TO_SPACE)
    if blocks is None or len(stored) != 4:
        return tuple(stored)
    (n, h, w, c), (bh, bw) = stored, (int(b) for b in blocks)
    return (n, h // bh, w // bw, c * bh * bw)


def depth_to_space_shape(shape: Shape, blocks: tuple[int, int] | None) -> Shape:
    """Y's shape [N, OH * bH, OW * bW, C] of a convolution output [N, OH, OW, bH * bW * C] stored
    depth-to-space with `blocks` (None: unchanged); a ValueError when the channels do not divide."""
    if shape is None or blocks is None:
        return shape
    (n, oh, ow, m), (bh, bw) = shape, blocks
    if isinstance(m, int) and m % (bh * bw):
        raise ValueError(f"{m} output channels do not split into {bh} x {bw} blocks")
    scaled = lambda d, b: d * b if isinstance(d, int) else None  # noqa: E731
    return (n, scaled(oh, bh), scaled(ow, bw), m // (bh * bw) if isinstance(m, int) else None)

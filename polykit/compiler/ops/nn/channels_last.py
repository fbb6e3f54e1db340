"""Channels-last (NHWC) ops of domain ai.polykit: ConvNHWC, MaxPoolNHWC, AveragePoolNHWC.

The `to_channels_last` pass creates them (docs/FUSION.md, "Channels last", is the contract).
Each is its ONNX namesake on transposed operands: X [N, H, W, C] instead of [N, C, H, W],
ConvNHWC's W [M, kH, kW, C/group] (KRSC) instead of [M, C/group, kH, kW], Y [N, OH, OW, M];
attributes as ONNX's, with explicit pads (no auto_pad). ConvNHWC may carry an epilogue like
the fused ai.polykit Conv (fused.py): then its extra inputs are in the output's NHWC layout.
Shape rules run the ONNX op's rule on the transposed shapes, so the geometry is the same code.
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
#: ConvNHWC inputs of group-1 convolutions made by to_channels_last have C % CHANNEL_ALIGN == 0
CHANNEL_ALIGN = 8


def permuted(shape: Shape, perm: tuple[int, ...]) -> Shape:
    """`shape` with its dims in the order `perm` (numpy.transpose's rule); None stays None."""
    return None if shape is None else tuple(shape[p] for p in perm)


def nchw_node(node: Node) -> Node:
    """The ONNX node an NHWC node computes on NCHW operands (epilogue and fused_from dropped)."""
    attrs = {k: v for k, v in node.attrs.items() if k not in ("epilogue", "fused_from")}
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
    return [(dtype, permuted(shape, TO_NHWC))]

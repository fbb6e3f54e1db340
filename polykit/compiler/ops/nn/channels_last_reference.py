"""Reference kernels of the NHWC ops (ConvNHWC, MaxPoolNHWC, AveragePoolNHWC): transpose the
operands to NCHW, run the ONNX op's reference kernel, transpose the result back. A ConvNHWC
with an epilogue runs it on the NHWC result (fused.run_epilogue); one with depth_to_space [bH, bW]
rearranges the result [N, OH, OW, bH * bW * C] to [N, OH * bH, OW * bW, C] (DCR order, before the
epilogue: ops/nn/channels_last.py)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.ops.nn.channels_last import DEPTH_TO_SPACE, NCHW_OPS, TO_NCHW, TO_NHWC, nchw_node
from polykit.compiler.ops.nn.fused_reference import run_epilogue
from polykit.compiler.ops.references import reference, run_reference


@reference(*NCHW_OPS, domain=POLYKIT_DOMAIN)
def nhwc(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    if node.attrs.get("epilogue"):
        return run_epilogue(node, inputs)
    base = nchw_node(node)
    spatial_operands = 2 if node.op_type == "ConvNHWC" else 1
    args = [np.transpose(a, TO_NCHW) if i < spatial_operands else a for i, a in enumerate(inputs[:len(base.inputs)])]
    (y,) = run_reference(base, args)[:1]
    y = np.transpose(y, TO_NHWC)
    if DEPTH_TO_SPACE in node.attrs:
        y = depth_to_space_nhwc(y, *(int(b) for b in node.attrs[DEPTH_TO_SPACE]))
    return [np.ascontiguousarray(y)]


def depth_to_space_nhwc(y: np.ndarray, bh: int, bw: int) -> np.ndarray:
    """[N, H, W, bh * bw * C] -> [N, H * bh, W * bw, C]: channel (dy, dx, c) of pixel (h, w) to pixel
    (h * bh + dy, w * bw + dx) (ONNX DepthToSpace's DCR order, channels last)."""
    n, h, w, m = y.shape
    blocks = y.reshape(n, h, w, bh, bw, m // (bh * bw)).transpose(0, 1, 3, 2, 4, 5)
    return blocks.reshape(n, h * bh, w * bw, m // (bh * bw))

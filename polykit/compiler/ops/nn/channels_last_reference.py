"""Reference kernels of the NHWC ops (ConvNHWC, MaxPoolNHWC, AveragePoolNHWC): transpose the
operands to NCHW, run the ONNX op's reference kernel, transpose the result back. A ConvNHWC
with an epilogue runs it on the NHWC result (fused.run_epilogue)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.ops.nn.channels_last import NCHW_OPS, TO_NCHW, TO_NHWC, nchw_node
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
    return [np.ascontiguousarray(np.transpose(y, TO_NHWC))]

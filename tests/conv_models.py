"""ResNet-style ONNX models built in code (random weights), shared by compiler and runtime tests.

`resnet` follows torchvision's ResNet-50 (v1.5) layer by layer -- 7x7/2 stem conv + BN + Relu,
3x3/2 MaxPool, bottleneck stages (1x1, 3x3 with the stride, 1x1 x4 expansion, each with BN;
a strided 1x1 conv + BN on the first block's shortcut; residual Add; Relu), GlobalAveragePool,
Flatten, Gemm -- with the width and depths scaled down so the cpu reference kernels run it in
a moment. Inference BatchNormalizations with non-trivial statistics, as an export has them.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: ResNet-50's blocks per stage
RESNET50_DEPTHS = (3, 4, 6, 3)


class _Builder:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def init(self, array: np.ndarray, prefix: str) -> str:
        name = self.name(prefix)
        self.inits.append(numpy_helper.from_array(array.astype(np.float32), name))
        return name

    def node(self, op: str, inputs: list[str], **attrs) -> str:
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=f"{out}_node", **attrs))
        return out

    def conv_bn(self, x: str, cin: int, cout: int, k: int, stride: int = 1, relu: bool = True) -> str:
        w = self.rng.standard_normal((cout, cin, k, k)) * np.sqrt(2.0 / (cin * k * k))
        y = self.node("Conv", [x, self.init(w, "w")], kernel_shape=[k, k], strides=[stride, stride],
                      pads=[k // 2] * 4)
        gamma = self.rng.uniform(0.5, 1.5, cout) * (1.0 if relu else 0.3)  # residual branches stay small
        params = [gamma, self.rng.standard_normal(cout) * 0.1,
                  self.rng.standard_normal(cout) * 0.1, self.rng.uniform(0.5, 1.5, cout)]
        y = self.node("BatchNormalization", [y] + [self.init(p, "bn") for p in params], epsilon=1e-5)
        return self.node("Relu", [y]) if relu else y

    def bottleneck(self, x: str, cin: int, mid: int, stride: int) -> str:
        y = self.conv_bn(x, cin, mid, 1)
        y = self.conv_bn(y, mid, mid, 3, stride)
        y = self.conv_bn(y, mid, 4 * mid, 1, relu=False)
        skip = x if stride == 1 and cin == 4 * mid else self.conv_bn(x, cin, 4 * mid, 1, stride, relu=False)
        return self.node("Relu", [self.node("Add", [y, skip])])


def resnet(depths: Sequence[int] = RESNET50_DEPTHS, width: int = 8, image: int = 32, batch: int = 2,
           classes: int = 10, seed: int = 0) -> onnx.ModelProto:
    """A ResNet-50-shaped model: input "image" [batch, 3, image, image], output "logits"."""
    b = _Builder(seed)
    x = b.conv_bn("image", 3, width, 7, 2)
    x = b.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = width
    for stage, depth in enumerate(depths):
        mid = width * 2 ** stage
        for block in range(depth):
            x = b.bottleneck(x, cin, mid, 2 if stage > 0 and block == 0 else 1)
            cin = 4 * mid
    x = b.node("Flatten", [b.node("GlobalAveragePool", [x])], axis=1)
    fc = b.init(b.rng.standard_normal((classes, cin)) / np.sqrt(cin), "fc")
    b.nodes.append(helper.make_node("Gemm", [x, fc, b.init(b.rng.standard_normal(classes) * 0.1, "fcb")],
                                    ["logits"], name="fc", transB=1))
    graph = helper.make_graph(b.nodes, "resnet", [helper.make_tensor_value_info("image", TensorProto.FLOAT,
                                                                                 [batch, 3, image, image])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, classes])], b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model

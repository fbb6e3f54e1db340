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


class ModelBuilder:
    """Nodes and random initializers of an ONNX graph under construction (fresh names, fixed seed)."""

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

    def ints(self, values: Sequence[int], prefix: str) -> str:
        """An int64 initializer (axes, starts, ends)."""
        name = self.name(prefix)
        self.inits.append(numpy_helper.from_array(np.array(values, np.int64), name))
        return name

    def node(self, op: str, inputs: list[str], **attrs) -> str:
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=f"{out}_node", **attrs))
        return out

    def conv(self, x: str, cin: int, cout: int, k: int = 1) -> str:
        """A bare Conv (He-initialized weights, pads k // 2, no bias)."""
        w = self.rng.standard_normal((cout, cin, k, k)) * np.sqrt(2.0 / (cin * k * k))
        return self.node("Conv", [x, self.init(w, "w")], kernel_shape=[k, k], pads=[k // 2] * 4)

    def conv_bn(self, x: str, cin: int, cout: int, k: int, stride: int = 1, relu: bool | str = True,
                group: int = 1) -> str:
        """Conv (pads k // 2) + BatchNormalization [+ Relu, or the activation `relu` names]."""
        w = self.rng.standard_normal((cout, cin // group, k, k)) * np.sqrt(2.0 / (cin // group * k * k))
        y = self.node("Conv", [x, self.init(w, "w")], kernel_shape=[k, k], strides=[stride, stride],
                      pads=[k // 2] * 4, group=group)
        gamma = self.rng.uniform(0.5, 1.5, cout) * (1.0 if relu else 0.3)  # residual branches stay small
        params = [gamma, self.rng.standard_normal(cout) * 0.1,
                  self.rng.standard_normal(cout) * 0.1, self.rng.uniform(0.5, 1.5, cout)]
        y = self.node("BatchNormalization", [y] + [self.init(p, "bn") for p in params], epsilon=1e-5)
        if not relu:
            return y
        return self.node("Relu" if relu is True else relu, [y])

    def bottleneck(self, x: str, cin: int, mid: int, stride: int, groups: int = 1) -> str:
        y = self.conv_bn(x, cin, mid, 1)
        y = self.conv_bn(y, mid, mid, 3, stride, group=groups)
        y = self.conv_bn(y, mid, 4 * mid, 1, relu=False)
        skip = x if stride == 1 and cin == 4 * mid else self.conv_bn(x, cin, 4 * mid, 1, stride, relu=False)
        return self.node("Relu", [self.node("Add", [y, skip])])


def resnet(depths: Sequence[int] = RESNET50_DEPTHS, width: int = 8, image: int = 32, batch: int = 2,
           classes: int = 10, seed: int = 0, groups: int = 1) -> onnx.ModelProto:
    """A ResNet-50-shaped model: input "image" [batch, 3, image, image], output "logits"; with
    `groups`, ResNeXt-shaped (each bottleneck's 3x3 conv in that many groups)."""
    b = ModelBuilder(seed)
    x = b.conv_bn("image", 3, width, 7, 2)
    x = b.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = width
    for stage, depth in enumerate(depths):
        mid = width * 2 ** stage
        for block in range(depth):
            x = b.bottleneck(x, cin, mid, 2 if stage > 0 and block == 0 else 1, groups)
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


#: MobileNetV3-shaped inverted residual blocks: (expansion, out channels, kernel, stride, squeeze-excite)
MOBILENET_BLOCKS = ((1, 16, 3, 1, False), (4, 24, 3, 2, False), (3, 24, 5, 1, True), (3, 20, 3, 1, False),
                    (6, 40, 5, 2, True))


def mobilenet(blocks: Sequence[tuple[int, int, int, int, bool]] = MOBILENET_BLOCKS, image: int = 32, batch: int = 2,
              classes: int = 10, seed: int = 0) -> onnx.ModelProto:
    """A MobileNetV3-shaped model: 3x3/2 stem (16 channels, HardSwish), inverted residual blocks
    (1x1 expansion, depthwise k x k with the stride, squeeze-excite on some, 1x1 projection, a
    residual Add where shapes allow; 20 channels: not a multiple of 8), 1x1 head conv,
    GlobalAveragePool, Flatten, Gemm. Input "image" [batch, 3, image, image], output "logits"."""
    b = ModelBuilder(seed)
    x = b.conv_bn("image", 3, 16, 3, 2, relu="HardSwish")
    cin = 16
    for expansion, cout, k, stride, se in blocks:
        mid = cin * expansion
        y = b.conv_bn(x, cin, mid, 1, relu="HardSwish") if expansion != 1 else x
        y = b.conv_bn(y, mid, mid, k, stride, relu="Relu", group=mid)
        if se:
            squeeze = max(8, mid // 4)
            s = b.node("GlobalAveragePool", [y])
            s = b.node("Relu", [b.node("Conv", [s, b.init(b.rng.standard_normal((squeeze, mid, 1, 1)) * 0.3, "se"),
                                                 b.init(b.rng.standard_normal(squeeze) * 0.1, "seb")])])
            s = b.node("Conv", [s, b.init(b.rng.standard_normal((mid, squeeze, 1, 1)) * 0.3, "se"),
                                b.init(b.rng.standard_normal(mid) * 0.1, "seb")])
            y = b.node("Mul", [y, b.node("HardSigmoid", [s], alpha=1.0 / 6, beta=0.5)])
        y = b.conv_bn(y, mid, cout, 1, relu=False)
        x = b.node("Add", [x, y]) if stride == 1 and cin == cout else y
        cin = cout
    x = b.conv_bn(x, cin, 64, 1, relu="HardSwish")
    return _classifier(b, x, 64, "mobilenet", batch, image, classes)


def convnext(width: int = 16, depths: Sequence[int] = (2, 1), image: int = 32, batch: int = 2, classes: int = 10,
             seed: int = 0) -> onnx.ModelProto:
    """A ConvNeXt-shaped model as torch exports it: 4x4/4 stem conv; blocks of a 7x7 depthwise
    conv, Transpose to NHWC, LayerNormalization over channels, Linear (MatMul + Add) x4, Gelu,
    Linear back, layer scale (Mul), Transpose to NCHW, residual Add; a 2x2/2 conv doubles the
    width between stages; GlobalAveragePool, Flatten, Gemm."""
    b = ModelBuilder(seed)
    x = b.node("Conv", ["image", b.init(b.rng.standard_normal((width, 3, 4, 4)) * 0.2, "w")], kernel_shape=[4, 4],
               strides=[4, 4])
    c = width
    for stage, depth in enumerate(depths):
        if stage:
            x = b.node("Conv", [x, b.init(b.rng.standard_normal((2 * c, c, 2, 2)) / np.sqrt(4 * c), "w")],
                       kernel_shape=[2, 2], strides=[2, 2])
            c *= 2
        for _ in range(depth):
            w = b.rng.standard_normal((c, 1, 7, 7)) / 7
            y = b.node("Conv", [x, b.init(w, "w"), b.init(b.rng.standard_normal(c) * 0.1, "b")], kernel_shape=[7, 7],
                       pads=[3, 3, 3, 3], group=c)
            y = b.node("Transpose", [y], perm=[0, 2, 3, 1])
            y = b.node("LayerNormalization", [y, b.init(b.rng.uniform(0.5, 1.5, c), "ln"),
                                              b.init(b.rng.standard_normal(c) * 0.1, "ln")], axis=-1, epsilon=1e-6)
            y = b.node("Add", [b.node("MatMul", [y, b.init(b.rng.standard_normal((c, 4 * c)) / np.sqrt(c), "fc")]),
                               b.init(b.rng.standard_normal(4 * c) * 0.1, "fcb")])
            y = b.node("Gelu", [y])
            y = b.node("Add", [b.node("MatMul", [y, b.init(b.rng.standard_normal((4 * c, c)) / np.sqrt(4 * c), "fc")]),
                               b.init(b.rng.standard_normal(c) * 0.1, "fcb")])
            y = b.node("Mul", [y, b.init(b.rng.uniform(0.1, 0.5, c), "gamma")])
            x = b.node("Add", [x, b.node("Transpose", [y], perm=[0, 3, 1, 2])])
    return _classifier(b, x, c, "convnext", batch, image, classes)


def _classifier(b: ModelBuilder, x: str, cin: int, name: str, batch: int, image: int, classes: int) -> onnx.ModelProto:
    x = b.node("Flatten", [b.node("GlobalAveragePool", [x])], axis=1)
    fc = b.init(b.rng.standard_normal((classes, cin)) / np.sqrt(cin), "fc")
    b.nodes.append(helper.make_node("Gemm", [x, fc, b.init(b.rng.standard_normal(classes) * 0.1, "fcb")],
                                    ["logits"], name="fc", transB=1))
    graph = helper.make_graph(b.nodes, name, [helper.make_tensor_value_info("image", TensorProto.FLOAT,
                                                                             [batch, 3, image, image])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, classes])], b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def _audio_model(b: ModelBuilder, name: str, inp: tuple[str, list], out: str, opset: int = 21) -> onnx.ModelProto:
    graph = helper.make_graph(b.nodes, name, [helper.make_tensor_value_info(inp[0], TensorProto.FLOAT, inp[1])],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def whisper_frontend(batch: int | str = 2, mels: int = 80, length: int | str = 31, width: int = 48,
                     seed: int = 0) -> onnx.ModelProto:
    """Whisper's encoder front-end as torch exports it: mel [N, mels, L] -> Conv1d k3 p1 (bias) -> Gelu
    -> Conv1d k3 s2 p1 (bias) -> Gelu -> Transpose (0, 2, 1) -> LayerNormalization -> "hidden"
    [N, ceil(L / 2), width]. `batch` / `length` may be dim names (a dynamic axis)."""
    b = ModelBuilder(seed)
    x = "mel"
    for cin, stride in ((mels, 1), (width, 2)):
        w = b.rng.standard_normal((width, cin, 3)) / np.sqrt(3 * cin)
        x = b.node("Conv", [x, b.init(w, "w"), b.init(b.rng.standard_normal(width) * 0.1, "b")], kernel_shape=[3],
                   pads=[1, 1], strides=[stride])
        x = b.node("Gelu", [x])
    x = b.node("Transpose", [x], perm=[0, 2, 1])
    b.nodes.append(helper.make_node("LayerNormalization", [x, b.init(b.rng.uniform(0.5, 1.5, width), "ln"),
                                                           b.init(b.rng.standard_normal(width) * 0.1, "ln")],
                                    ["hidden"], name="ln", axis=-1, epsilon=1e-5))
    return _audio_model(b, "whisper_frontend", ("mel", [batch, mels, length]), "hidden")


def wav2vec2_frontend(batch: int = 2, length: int = 203, width: int = 16, model_dim: int = 32, groups: int = 4,
                      pos_kernel: int = 8, seed: int = 0) -> onnx.ModelProto:
    """wav2vec2's feature extractor and positional conv as torch exports them, scaled down: audio [N, L]
    -> Unsqueeze -> Conv1d 1 -> width k10 s5 (no bias) -> InstanceNormalization (GroupNorm, a group a
    channel) -> Gelu -> Conv1d k3 s2 -> Gelu -> Conv1d k2 s2 -> Gelu -> Transpose (0, 2, 1) ->
    LayerNormalization -> Linear to model_dim -> the positional conv (Transpose, grouped Conv1d
    `pos_kernel` wide, padding pos_kernel // 2, bias; the last step sliced off when the kernel is
    even; Gelu; Transpose back) added to it -> "features" [N, L'', model_dim]."""
    b = ModelBuilder(seed)
    x = b.node("Unsqueeze", ["audio", b.ints([1], "axes")])
    x = b.node("Conv", [x, b.init(b.rng.standard_normal((width, 1, 10)) / np.sqrt(10), "w")], kernel_shape=[10],
               strides=[5])
    x = b.node("InstanceNormalization", [x, b.init(b.rng.uniform(0.5, 1.5, width), "gn"),
                                         b.init(b.rng.standard_normal(width) * 0.1, "gn")], epsilon=1e-5)
    x = b.node("Gelu", [x])
    for k in (3, 2):
        w = b.rng.standard_normal((width, width, k)) / np.sqrt(k * width)
        x = b.node("Gelu", [b.node("Conv", [x, b.init(w, "w")], kernel_shape=[k], strides=[2])])
    x = b.node("Transpose", [x], perm=[0, 2, 1])
    x = b.node("LayerNormalization", [x, b.init(b.rng.uniform(0.5, 1.5, width), "ln"),
                                      b.init(b.rng.standard_normal(width) * 0.1, "ln")], axis=-1, epsilon=1e-5)
    x = b.node("Add", [b.node("MatMul", [x, b.init(b.rng.standard_normal((width, model_dim)) / np.sqrt(width), "fc")]),
                       b.init(b.rng.standard_normal(model_dim) * 0.1, "fcb")])
    cpg = model_dim // groups
    w = b.rng.standard_normal((model_dim, cpg, pos_kernel)) / np.sqrt(pos_kernel * cpg)
    pos = b.node("Conv", [b.node("Transpose", [x], perm=[0, 2, 1]), b.init(w, "w"),
                          b.init(b.rng.standard_normal(model_dim) * 0.1, "b")],
                 kernel_shape=[pos_kernel], pads=[pos_kernel // 2] * 2, group=groups)
    if pos_kernel % 2 == 0:
        pos = b.node("Slice", [pos, b.ints([0], "starts"), b.ints([-1], "ends"), b.ints([2], "axes")])
    pos = b.node("Transpose", [b.node("Gelu", [pos])], perm=[0, 2, 1])
    b.nodes.append(helper.make_node("Add", [x, pos], ["features"], name="residual"))
    return _audio_model(b, "wav2vec2_frontend", ("audio", [batch, length]), "features")


def video_net(batch: int = 2, frames: int = 6, size: int = 10, width: int = 16, seed: int = 0) -> onnx.ModelProto:
    """A small video network of 3-D convs as torch exports them (R(2+1)D / X3D shapes): clip [N, 3, T, S, S] ->
    Conv3d 3x3x3 p1 (bias) -> Relu -> Conv3d 1x3x3 s(1, 2, 2) p(0, 1, 1) -> Relu -> Conv3d 3x1x1 p(1, 0, 0) (the
    temporal conv) -> Relu -> depthwise Conv3d 3x3x3 s2 p1 -> Relu -> ReduceMean over (T, H, W) -> "features"
    [N, width, 1, 1, 1]."""
    b = ModelBuilder(seed)
    x = "clip"
    for cin, kernel, strides, pads, group in ((3, (3, 3, 3), (1, 1, 1), (1, 1, 1), 1),
                                              (width, (1, 3, 3), (1, 2, 2), (0, 1, 1), 1),
                                              (width, (3, 1, 1), (1, 1, 1), (1, 0, 0), 1),
                                              (width, (3, 3, 3), (2, 2, 2), (1, 1, 1), width)):
        fan = cin // group * int(np.prod(kernel))
        w = b.rng.standard_normal((width, cin // group) + kernel) * np.sqrt(2.0 / fan)
        x = b.node("Conv", [x, b.init(w, "w"), b.init(b.rng.standard_normal(width) * 0.1, "b")],
                   kernel_shape=list(kernel), strides=list(strides), pads=list(pads) * 2, group=group)
        x = b.node("Relu", [x])
    b.nodes.append(helper.make_node("ReduceMean", [x, b.ints([2, 3, 4], "axes")], ["features"], name="pool",
                                    keepdims=1))
    return _audio_model(b, "video_net", ("clip", [batch, 3, frames, size, size]), "features")

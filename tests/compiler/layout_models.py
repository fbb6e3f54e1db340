"""Small ONNX convnets (random weights, odd channel counts, H != W) whose layout-free ops sit between
convolutions: the cases plan_layouts (and fold_axis_permutations) run channels-last. Each takes "image" [2, 3, 13, 10] unless
told and has one output, "y"."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from tests.conv_models import ModelBuilder

IMAGE = (2, 3, 13, 10)


def _conv(b: ModelBuilder, x: str, cin: int, cout: int, k: int = 1, stride: int = 1, group: int = 1) -> str:
    w = b.rng.standard_normal((cout, cin // group, k, k)) * np.sqrt(2.0 / (cin // group * k * k))
    return b.node("Conv", [x, b.init(w, "w"), b.init(b.rng.standard_normal(cout) * 0.1, "b")], kernel_shape=[k, k],
                  strides=[stride, stride], pads=[k // 2] * 4, group=group)


def _ints(b: ModelBuilder, prefix: str, values: list[int]) -> str:
    name = b.name(prefix)
    b.inits.append(helper.make_tensor(name, TensorProto.INT64, [len(values)], values))
    return name


def _silu(b: ModelBuilder, x: str) -> str:
    return b.node("Mul", [x, b.node("Sigmoid", [x])])


def _batchnorm(b: ModelBuilder, x: str, c: int) -> str:
    params = [b.rng.uniform(0.5, 1.5, c), b.rng.standard_normal(c) * 0.1, b.rng.standard_normal(c) * 0.1,
              b.rng.uniform(0.5, 1.5, c)]
    return b.node("BatchNormalization", [x] + [b.init(p, "bn") for p in params], epsilon=1e-5)


def _model(b: ModelBuilder, out: str, shape: tuple, image: tuple = IMAGE) -> onnx.ModelProto:
    b.nodes.append(helper.make_node("Identity", [out], ["y"], name="y_out"))
    graph = helper.make_graph(b.nodes, "layout", [helper.make_tensor_value_info("image", TensorProto.FLOAT, image)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def _pooled_logits(b: ModelBuilder, x: str, c: int, classes: int = 7) -> onnx.ModelProto:
    x = b.node("Flatten", [b.node("GlobalAveragePool", [x])], axis=1)
    fc = b.init(b.rng.standard_normal((classes, c)) / np.sqrt(c), "fc")
    return _model(b, b.node("Gemm", [x, fc, b.init(b.rng.standard_normal(classes) * 0.1, "fcb")], transB=1),
                  (IMAGE[0], classes))


def squeeze_excitation(c: int = 17, squeeze: int = 5, gate: str = "Sigmoid") -> onnx.ModelProto:
    """EfficientNet's block: conv + SiLU, depthwise 3x3 + SiLU, squeeze-excitation (global pool, 1x1
    conv, SiLU, 1x1 conv, `gate`, the broadcast Mul), 1x1 projection; global pool, Flatten, Gemm."""
    b = ModelBuilder(11)
    x = _silu(b, _conv(b, "image", 3, c, 3))
    x = _silu(b, _conv(b, x, c, c, 3, 2, group=c))
    s = _silu(b, _conv(b, b.node("GlobalAveragePool", [x]), c, squeeze))
    s = _conv(b, s, squeeze, c)
    s = b.node(gate, [s], **({"alpha": 1.0 / 6, "beta": 0.5} if gate == "HardSigmoid" else {}))
    x = _conv(b, b.node("Mul", [x, s]), c, 9)
    return _pooled_logits(b, x, 9)


def dense_block(growth: int = 5, layers: int = 3) -> onnx.ModelProto:
    """DenseNet's pre-activation block: each layer reads the Concat of all before it through an
    unfolded BatchNormalization + Relu; a transition (BN, Relu, 1x1 conv, 2x2 AveragePool) after it."""
    b = ModelBuilder(12)
    x, c = _conv(b, "image", 3, 6, 3), 6
    for _ in range(layers):
        y = _conv(b, b.node("Relu", [_batchnorm(b, x, c)]), c, growth, 3)
        x, c = b.node("Concat", [x, y], axis=1), c + growth
    x = _conv(b, b.node("Relu", [_batchnorm(b, x, c)]), c, 8)
    x = b.node("AveragePool", [x], kernel_shape=[2, 2], strides=[2, 2])
    return _pooled_logits(b, b.node("Relu", [_batchnorm(b, x, 8)]), 8)


def inception(c: int = 6) -> onnx.ModelProto:
    """GoogLeNet's module: a 1x1 branch, a 1x1 -> 3x3 branch, a 3x3/1 MaxPool -> 1x1 branch,
    concatenated along channels, then a 3x3/2 MaxPool of the Concat (ceil mode) and a 1x1 conv."""
    b = ModelBuilder(13)
    x = b.node("Relu", [_conv(b, "image", 3, c, 3)])
    one = _conv(b, x, c, 3)
    three = _conv(b, _conv(b, x, c, 4), 4, 5, 3)
    pooled = _conv(b, b.node("MaxPool", [x], kernel_shape=[3, 3], pads=[1, 1, 1, 1]), c, 2)
    x = b.node("Concat", [one, three, pooled], axis=1)
    x = b.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)
    return _pooled_logits(b, _conv(b, x, 10, 7), 7)


def upsampling(mode: str = "nearest") -> onnx.ModelProto:
    """A UNet level on a [2, 3, 12, 10] image: conv, 2x2 MaxPool, conv, Resize x2 (`mode`; "linear"
    by output sizes, the others by scales), Concat with the skip, a Slice of rows 1.., reflect Pad
    of H and W, a 3x3 conv, a Slice of channels 1..4, the channels Split 2 + 2 and added, a 3x3
    conv; the output stays a rank-4 tensor."""
    b = ModelBuilder(14)
    skip = b.node("Relu", [_conv(b, "image", 3, 5, 3)])
    x = b.node("MaxPool", [skip], kernel_shape=[2, 2], strides=[2, 2])
    x = b.node("Relu", [_conv(b, x, 5, 6, 3)])
    if mode == "linear":
        x = b.node("Resize", [x, "", "", _ints(b, "sizes", [2, 6, 12, 10])], mode="linear")
    else:
        x = b.node("Resize", [x, b.init(np.zeros(0), "roi"), b.init(np.array([1, 1, 2.0, 2.0]), "scales")], mode=mode)
    x = b.node("Concat", [x, skip], axis=1)
    x = b.node("Slice", [x, _ints(b, "starts", [1]), _ints(b, "ends", [12]), _ints(b, "axes", [2])])
    x = _conv(b, b.node("Pad", [x, _ints(b, "pads", [0, 0, 1, 2, 0, 0, 1, 0])], mode="reflect"), 11, 6, 3)
    x = b.node("Slice", [x, _ints(b, "starts", [1]), _ints(b, "ends", [5]), _ints(b, "axes", [1])])
    b.nodes.append(helper.make_node("Split", [x, _ints(b, "split", [2, 2])], ["half0", "half1"], name="split", axis=1))
    x = _conv(b, b.node("Add", ["half0", "half1"]), 2, 3, 3)
    return _model(b, x, (2, 3, 13, 12), image=(2, 3, 12, 10))


def transposed_upsampling(kernel: int = 2) -> onnx.ModelProto:
    """A UNet level on a [2, 3, 12, 10] image with a learned up-convolution: conv, 2x2 MaxPool, conv,
    ConvTranspose (`kernel` x `kernel`, stride 2, bias; kernel 3 takes pads 1 and output_padding 1:
    no pixel-shuffle form), Concat with the skip, 3x3 conv; a rank-4 output."""
    b = ModelBuilder(17)
    skip = b.node("Relu", [_conv(b, "image", 3, 5, 3)])
    x = b.node("MaxPool", [skip], kernel_shape=[2, 2], strides=[2, 2])
    x = b.node("Relu", [_conv(b, x, 5, 9, 3)])
    w = b.init(b.rng.standard_normal((9, 7, kernel, kernel)) / 3, "up")
    pads = {"pads": [1, 1, 1, 1], "output_padding": [1, 1]} if kernel == 3 else {}
    x = b.node("ConvTranspose", [x, w, b.init(b.rng.standard_normal(7) * 0.1, "upb")], kernel_shape=[kernel, kernel],
               strides=[2, 2], **pads)
    x = _conv(b, b.node("Concat", [x, skip], axis=1), 12, 3, 3)
    return _model(b, x, (2, 3, 12, 10), image=(2, 3, 12, 10))


def spatial_mean_head(c: int = 5) -> onnx.ModelProto:
    """A conv whose ReduceMean over H and W without keepdims feeds a Gemm (no Flatten)."""
    b = ModelBuilder(15)
    x = b.node("Relu", [_conv(b, "image", 3, c, 3)])
    x = b.node("ReduceMean", [x, _ints(b, "hw", [2, 3])], keepdims=0)
    fc = b.init(b.rng.standard_normal((4, c)), "fc")
    return _model(b, b.node("Gemm", [x, fc], transB=1), (IMAGE[0], 4))


def channel_shuffle(c: int = 10) -> onnx.ModelProto:
    """ShuffleNet's unit: the channels split in halves, one half through 1x1 -> depthwise 3x3 -> 1x1,
    concatenated with the other, shuffled (Reshape to [N, 2, c / 2, H, W], Transpose 1 <-> 2, Reshape
    back); twice, then global pool, Flatten, Gemm."""
    b = ModelBuilder(16)
    x = b.node("Relu", [_conv(b, "image", 3, c, 3)])
    half = c // 2
    for _ in range(2):
        keep = b.node("Slice", [x, _ints(b, "starts", [0]), _ints(b, "ends", [half]), _ints(b, "axes", [1])])
        y = b.node("Slice", [x, _ints(b, "starts", [half]), _ints(b, "ends", [c]), _ints(b, "axes", [1])])
        y = b.node("Relu", [_conv(b, _conv(b, b.node("Relu", [_conv(b, y, half, half)]), half, half, 3, group=half),
                                  half, half)])
        x = b.node("Concat", [keep, y], axis=1)
        x = b.node("Reshape", [x, _ints(b, "grouped", [IMAGE[0], 2, half, *IMAGE[2:]])])
        x = b.node("Reshape", [b.node("Transpose", [x], perm=[0, 2, 1, 3, 4]), _ints(b, "flat", [IMAGE[0], c, *IMAGE[2:]])])
    return _pooled_logits(b, x, c)


MODELS = {"squeeze_excitation": squeeze_excitation,
          "hard_sigmoid_gate": lambda: squeeze_excitation(c=16, squeeze=8, gate="HardSigmoid"),
          "dense_block": dense_block, "inception": inception, "upsampling_nearest": upsampling,
          "upsampling_linear": lambda: upsampling("linear"), "spatial_mean_head": spatial_mean_head,
          "channel_shuffle": channel_shuffle, "up_convolution": transposed_upsampling,
          "up_convolution_padded": lambda: transposed_upsampling(3)}

#: Transposes a channels-last graph (and a cuda plan) of each model keeps: the entry (1 unless
#: listed), the exit of a rank-4 output, the two around a ConvTranspose with no NHWC form (an
#: up-convolution's pixel shuffle is stored by its conv: fold_depth_to_space)
TRANSPOSES_KEPT = {"upsampling_nearest": 2, "upsampling_linear": 2, "up_convolution": 2, "up_convolution_padded": 4}

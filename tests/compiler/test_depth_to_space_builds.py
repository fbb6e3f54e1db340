"""cpu plans (channels last) of up-convolutions and pixel shuffles whose convs store depth-to-space
(fold_depth_to_space): ConvTranspose with kernel == stride 2 and 3, ONNX DepthToSpace DCR and CRD
after a conv, each alone and before a channels-last Concat (the conv then writes its slice), against
onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from tests.compiler.test_concat_placement import _check_outputs

IMAGE = (2, 16, 7, 5)


def up_model(up: str, block: int = 2, concat: bool = False, k: int = 3) -> onnx.ModelProto:
    """x [2, 16, 7, 5] -> an upsampling by `block` ("ConvTranspose": kernel == stride == block; "DCR" /
    "CRD": a k x k conv to 8 * block^2 channels, then DepthToSpace) [-> Concat with a nearest
    Resize of x along the channels] -> a 3x3 conv."""
    rng = np.random.default_rng(block * 7 + len(up) + concat)
    inits = []

    def init(name, *shape):
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name))
        return name

    if up == "ConvTranspose":
        nodes = [helper.make_node("ConvTranspose", ["x", init("wt", 16, 8, block, block), init("bt", 8)], ["u"],
                                  kernel_shape=[block, block], strides=[block, block])]
    else:
        m = 8 * block * block
        nodes = [helper.make_node("Conv", ["x", init("wc", m, 16, k, k), init("bc", m)], ["c"], kernel_shape=[k, k],
                                  pads=[k // 2] * 4),
                 helper.make_node("DepthToSpace", ["c"], ["u"], blocksize=block, mode=up)]
    feature, channels = "u", 8
    if concat:
        scales = numpy_helper.from_array(np.array([1, 1, block, block], np.float32), "scales")
        inits.append(scales)
        nodes += [helper.make_node("Resize", ["x", "", "scales"], ["r"], mode="nearest"),
                  helper.make_node("Concat", ["r", "u"], ["cat"], axis=1)]
        feature, channels = "cat", 24
    nodes.append(helper.make_node("Conv", [feature, init("wy", 4, channels, 3, 3)], ["y"], kernel_shape=[3, 3],
                                  pads=[1] * 4))
    g = helper.make_graph(nodes, "up", [helper.make_tensor_value_info("x", TensorProto.FLOAT, IMAGE)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("concat", [False, True])
@pytest.mark.parametrize("up,block", [("ConvTranspose", 2), ("ConvTranspose", 3), ("DCR", 2), ("CRD", 2),
                                      ("CRD", 3)])
def test_cpu_plan_of_an_upsampling_conv_storing_depth_to_space_matches_onnxruntime(up, block, concat):
    model = up_model(up, block, concat)
    plan = build_plan(model, BuilderConfig(target="cpu", channels_last=True))
    (up_conv,) = [layer for layer in plan.layers if layer.attrs.get("depth_to_space")]
    assert up_conv.kind == "ConvNHWC" and up_conv.attrs["depth_to_space"] == [block, block]
    assert not [layer for layer in plan.layers if layer.kind in ("Reshape", "DepthToSpace")]
    if concat:  # the conv writes its slice of the Concat's output
        assert up_conv.outputs[0] in plan.memory.placements
    image = np.random.default_rng(5).standard_normal(IMAGE).astype(np.float32)
    _check_outputs(plan, model, {"x": image})


def test_an_up_convolution_of_5_channels_before_a_conv_keeps_its_channel_pad():
    """The next conv's input is padded to 8 channels: pad_into_producers cannot widen a conv storing
    depth-to-space (its rows are bH * bW blocks of C), so the Pad stays and the result is right."""
    rng = np.random.default_rng(8)
    w = numpy_helper.from_array((rng.standard_normal((16, 5, 2, 2)) * 0.3).astype(np.float32), "wt")
    wy = numpy_helper.from_array((rng.standard_normal((4, 5, 3, 3)) * 0.3).astype(np.float32), "wy")
    nodes = [helper.make_node("ConvTranspose", ["x", "wt"], ["u"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["u", "wy"], ["y"], kernel_shape=[3, 3], pads=[1] * 4)]
    g = helper.make_graph(nodes, "up5", [helper.make_tensor_value_info("x", TensorProto.FLOAT, IMAGE)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, wy])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    plan = build_plan(model, BuilderConfig(target="cpu", channels_last=True))
    (up_conv,) = [layer for layer in plan.layers if layer.attrs.get("depth_to_space")]
    assert plan.tensors[up_conv.outputs[0]].shape[-1] == 5 and [layer.kind for layer in plan.layers].count("Pad") == 1
    image = np.random.default_rng(5).standard_normal(IMAGE).astype(np.float32)
    _check_outputs(plan, model, {"x": image})

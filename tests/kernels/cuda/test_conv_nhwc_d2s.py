"""GPU: ConvNHWC storing depth-to-space (depth_to_space [bH, bW]) on the tactics that take it --
the mma.sync and SIMT implicit GEMMs (conv_nhwc.cu) and the sm90 tiles (conv_sm90.cu) -- against
the reference kernels, outputs poisoned first; odd pixel counts, unequal blocks, a 3x3 conv before
a pixel shuffle, unaligned tensors (the sm90 pair stores); then cuda fp16 plans of PixelShuffle
exports (DepthToSpace DCR / CRD after a conv) against the cpu plan."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.kernels.cuda.conv.conv_sm90 import CONV_TILES
from tests.kernels.cuda.test_conv_nhwc import MMA, SIMT, check, conv_inputs, conv_layer
from tests.kernels.cuda.test_conv_sm90 import rand, rel_err, require_sm90, run_case, run_conv

pytestmark = pytest.mark.gpu

ONE = {"kernel_shape": [1, 1], "strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "group": 1}
# (x NHWC, w KRSC, attrs): UNet's 2x2 up-convolution (C of 8 a block), 3x3 blocks of 16, 2x3 blocks,
# an odd pixel count, a 3x3 stride-2 conv before a 2x2 shuffle
CASES = [
    ((2, 5, 7, 16), (32, 1, 1, 16), dict(ONE, depth_to_space=[2, 2])),
    ((1, 4, 3, 8), (144, 1, 1, 8), dict(ONE, depth_to_space=[3, 3])),
    ((3, 3, 5, 24), (48, 1, 1, 24), dict(ONE, depth_to_space=[2, 3])),
    ((1, 13, 11, 32), (64, 1, 1, 32), dict(ONE, depth_to_space=[2, 2])),
    ((2, 9, 7, 8), (32, 3, 3, 8), dict(ONE, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                                       depth_to_space=[2, 2])),
]


@pytest.mark.parametrize("x,w,attrs", CASES)
def test_igemm_mma_stores_depth_to_space(x, w, attrs):
    check(conv_layer(attrs, precision="fp16"), conv_inputs(x, w, np.float16), MMA, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("x,w,attrs", CASES[::2])
def test_igemm_simt_stores_depth_to_space(x, w, attrs):
    check(conv_layer(attrs), conv_inputs(x, w), SIMT, rtol=1e-4, atol=2e-4)


@pytest.mark.parametrize("tile", [CONV_TILES[0], CONV_TILES[2], CONV_TILES[-1]], ids=lambda t: t.label)
@pytest.mark.parametrize("x,w,attrs", CASES)
def test_sm90_conv_stores_depth_to_space(tile, x, w, attrs):
    require_sm90()
    assert run_case(tile, x, w, {k: v for k, v in attrs.items() if k != "kernel_shape"}, np.float16) <= 2e-3


@pytest.mark.parametrize("misalign", [2, 4])
def test_sm90_depth_to_space_with_unaligned_tensors_takes_the_pair_path(misalign):
    require_sm90()
    x, w, attrs = CASES[0]
    inputs = {"X": rand(x, np.float16), "W": rand(w, np.float16), "B": rand((w[0],), np.float16)}
    attrs = {k: v for k, v in attrs.items() if k != "kernel_shape"}
    assert rel_err(*run_conv(CONV_TILES[0], inputs, attrs, np.float16, misalign={"Y": misalign})) <= 2e-3


def pixel_shuffle(mode: str, block: int = 2, k: int = 3):
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    m = 8 * block * block
    w = (rng.standard_normal((m, 16, k, k)) * 0.2).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[k, k], pads=[k // 2] * 4),
             helper.make_node("DepthToSpace", ["c"], ["y"], blocksize=block, mode=mode)]
    g = helper.make_graph(nodes, "ps", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 16, 7, 5))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
@pytest.mark.parametrize("level", [0, 3])
def test_cuda_fp16_pixel_shuffle_plan_matches_the_cpu(mode, level):
    from tests.compiler.test_concat_placement import _run

    model = pixel_shuffle(mode)
    x = np.random.default_rng(5).standard_normal((2, 16, 7, 5)).astype(np.float32)
    want = _run(build_plan(model, BuilderConfig(target="cpu")), {"x": x})["y"]
    plan = build_plan(model, BuilderConfig(target="cuda", fp16=True, builder_optimization_level=level))
    assert [layer.attrs.get("depth_to_space") for layer in plan.layers if layer.kind == "ConvNHWC"] == [[2, 2]]
    got = _run(plan, {"x": x})["y"]
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2

"""ai.polykit QuantizeNHWC's `block` / `pads` (a space-to-depth stem's image): the reference against onnxruntime's
Pad -> SpaceToDepth -> QuantizeLinear -> Transpose -> Pad of the channels, and against numpy (the pad and the
space-to-depth gathered element by element with ONNX's DCR channel order, QuantizeLinear's reference), int8, uint8
with a non-zero zero point and e4m3, on odd shapes; the shape rule's output and its errors."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.ops.references import run_reference
from polykit.errors import PolykitError
from tests.compiler.passes.passes_testkit import graph, node, scalar

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
ZEROS = {"int8": np.array(-7, np.int8), "uint8": np.array(140, np.uint8), "e4m3": np.zeros((), E4M3)}
ONNX_TYPE = {"int8": TensorProto.INT8, "uint8": TensorProto.UINT8, "e4m3": TensorProto.FLOAT8E4M3FN}
rng = np.random.default_rng(71)

# (x shape, block, pads [top, left, bottom, right], channels): H, W not multiples of s before the pads, whole
# blocks after; s 2 and 4; C 1, 3, 5; channels C * s * s exactly and past it
CASES = [((2, 3, 29, 27), 2, [3, 3, 4, 4], 16), ((1, 1, 13, 10), 4, [1, 2, 2, 0], 16), ((2, 5, 9, 7), 2, [0, 1, 1, 0], 20),
         ((1, 3, 11, 5), 4, [2, 3, 3, 0], 64), ((1, 5, 6, 3), 2, [1, 0, 1, 1], 32), ((1, 3, 8, 4), 2, [0, 0, 0, 0], 12)]


def quantize_nhwc(x, scale, zero, **attrs):
    (y,) = run_reference(Node("QuantizeNHWC", ["X", "S", "Z"], ["Y"], attrs, "q", POLYKIT_DOMAIN), [x, scale, zero])
    return y


def image(shape, scale):
    x = rng.uniform(-160, 160, shape).astype(np.float32) * scale
    edge = np.float32([0.5, 1.5, -2.5, 127.5, -128.5, 1e9, -1e9, 300.0, -460.0]) * scale
    x.reshape(-1)[: edge.size] = edge[: x.size]
    return x


def by_elements(x, scale, zero, block, pads, channels):
    """Pad and SpaceToDepth gathered one element at a time (channel (bh * s + bw) * C + c of block (i, j) is the
    padded X[c, i * s + bh, j * s + bw]), QuantizeLinear's reference, NHWC, the zero point past C * s * s."""
    n, c, h, w = x.shape
    top, left, bottom, right = pads
    s = block
    oh, ow = (h + top + bottom) // s, (w + left + right) // s
    gathered = np.zeros((n, c * s * s, oh, ow), np.float32)
    for bh in range(s):
        for bw in range(s):
            for ch in range(c):
                for i in range(oh):
                    for j in range(ow):
                        yy, xx = i * s + bh - top, j * s + bw - left
                        if 0 <= yy < h and 0 <= xx < w:
                            gathered[:, (bh * s + bw) * c + ch, i, j] = x[:, ch, yy, xx]
    (q,) = run_reference(Node("QuantizeLinear", ["X", "S", "Z"], ["Y"], {}), [gathered, scale, zero])
    y = np.full((n, oh, ow, channels), zero, zero.dtype)
    y[..., : c * s * s] = q.transpose(0, 2, 3, 1)
    return y


def by_onnxruntime(x, scale, zero, block, pads, kind):
    """onnxruntime's Pad -> SpaceToDepth -> QuantizeLinear -> Transpose to NHWC (its CPU provider has no float8 Pad:
    the channel padding is checked apart)."""
    top, left, bottom, right = pads
    inits = [numpy_helper.from_array(np.array([0, 0, top, left, 0, 0, bottom, right], np.int64), "pads"),
             numpy_helper.from_array(scale, "s"),
             helper.make_tensor("z", ONNX_TYPE[kind], [], zero.view(np.uint8).tobytes(), raw=True)]
    nodes = [helper.make_node("Pad", ["x", "pads"], ["p"]), helper.make_node("SpaceToDepth", ["p"], ["d"], blocksize=block),
             helper.make_node("QuantizeLinear", ["d", "s", "z"], ["q"]),
             helper.make_node("Transpose", ["q"], ["y"], perm=[0, 2, 3, 1])]
    g = helper.make_graph(nodes, "s2dq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                          [helper.make_tensor_value_info("y", ONNX_TYPE[kind], None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


@pytest.mark.parametrize("kind", ZEROS)
@pytest.mark.parametrize("shape,block,pads,channels", CASES)
def test_the_reference_is_pad_space_to_depth_quantize_linear_in_nhwc(kind, shape, block, pads, channels):
    scale, zero = np.array(0.027, np.float32), ZEROS[kind]
    x = image(shape, scale)
    got = quantize_nhwc(x, scale, zero, channels=channels, block=block, pads=pads)
    want = by_elements(x, scale, zero, block, pads, channels)
    assert got.dtype == zero.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("kind", ZEROS)
@pytest.mark.parametrize("shape,block,pads,channels", CASES[:3])
def test_the_reference_equals_onnxruntimes_chain(kind, shape, block, pads, channels):
    scale, zero = np.array(0.027, np.float32), ZEROS[kind]
    x = image(shape, scale)
    try:
        want = np.asarray(by_onnxruntime(x, scale, zero, block, pads, kind))
    except (ort.capi.onnxruntime_pybind11_state.NotImplemented, onnx.onnx_cpp2py_export.checker.ValidationError) as e:
        pytest.skip(f"onnxruntime has no kernel for this chain: {e}")
    got = quantize_nhwc(x, scale, zero, channels=channels, block=block, pads=pads)
    c = shape[1] * block * block
    assert got.shape == want.shape[:3] + (channels,)
    np.testing.assert_array_equal(got[..., :c].view(np.uint8), want.view(np.uint8))
    assert (got[..., c:].view(np.uint8) == zero.view(np.uint8)).all()


def test_default_attributes_keep_the_plain_form():
    scale, zero = np.array(0.05, np.float32), ZEROS["uint8"]
    x = image((2, 3, 5, 7), scale)
    plain = quantize_nhwc(x, scale, zero, channels=16)
    assert plain.shape == (2, 5, 7, 16)
    np.testing.assert_array_equal(quantize_nhwc(x, scale, zero, channels=16, block=1, pads=[0, 0, 0, 0]), plain)
    np.testing.assert_array_equal(plain, by_elements(x, scale, zero, 1, [0, 0, 0, 0], 16))


def qnode(**attrs):
    return node("QuantizeNHWC", ["x", "s", "z"], "y", domain=POLYKIT_DOMAIN, **attrs)


def infer(x_shape, **attrs):
    inits = {"s": scalar(0.02), "z": scalar(0, np.int8)}
    return graph([qnode(**attrs)], {"x": x_shape}, ["y"], inits).value("y").shape


def test_the_shape_rule_gives_the_blocks_and_channels():
    assert infer((2, 3, 29, 27), channels=16, block=2, pads=[3, 3, 4, 4]) == (2, 18, 17, 16)
    assert infer((1, 1, 13, 10), channels=16, block=4, pads=[1, 2, 2, 0]) == (1, 4, 3, 16)
    assert infer((2, 3, 9, 7), channels=3) == (2, 9, 7, 3)


@pytest.mark.parametrize("attrs,what", [
    (dict(channels=16, block=2, pads=[3, 3, 3, 4]), "height"),
    (dict(channels=16, block=2, pads=[3, 3, 4, 3]), "width"),
    (dict(channels=11, block=2, pads=[3, 3, 4, 4]), "channels"),
    (dict(channels=16, block=0), "block"),
    (dict(channels=16, block=True), "block"),
    (dict(channels=16, block=2, pads=[3, -1, 4, 4]), "pads"),
    (dict(channels=16, block=2, pads=[3, 3, 4]), "pads"),
], ids=["height", "width", "channels", "block0", "block_bool", "negative_pad", "three_pads"])
def test_bad_block_pads_or_channels_are_build_errors(attrs, what):
    with pytest.raises(PolykitError, match=what):
        infer((2, 3, 29, 27), **attrs)

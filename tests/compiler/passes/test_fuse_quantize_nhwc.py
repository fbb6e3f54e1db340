"""fuse_quantize_nhwc: QuantizeLinear -> Transpose(0, 2, 3, 1) [-> Pad of the last dim with the zero
point] becomes one ai.polykit QuantizeNHWC with the same bytes; other chains stay."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.compiler.passes import fuse_quantize_nhwc
from polykit.runtime.engine import Runtime

from ..int8_models import convnet, feeds_for
from .passes_testkit import graph, node, op_counts, run_and_compare, scalar

ZEROS = {"int8": np.int8(-5), "uint8": np.uint8(128), "e4m3": ml_dtypes.float8_e4m3fn(0)}


def chain(zero, *, pad_value=None, scale=np.float32(0.02), pads=(0, 0, 0, 0, 0, 0, 0, 13), pad=True):
    """x [2, 3, 9, 7] float32 -> Q -> NHWC [-> Pad], the last node writing y."""
    inits = {"s": np.asarray(scale), "z": scalar(zero, zero.dtype), "pads": np.array(pads, np.int64),
             "v": scalar(zero if pad_value is None else pad_value, zero.dtype)}
    nodes = [node("QuantizeLinear", ["x", "s", "z"], "q"), node("Transpose", ["q"], "t" if pad else "y", perm=[0, 2, 3, 1])]
    if pad:
        nodes.append(node("Pad", ["t", "pads", "v"], "y"))
    return graph(nodes, {"x": (2, 3, 9, 7)}, ["y"], inits)


@pytest.mark.parametrize("zero", ZEROS.values(), ids=ZEROS)
def test_a_quantize_transpose_pad_chain_becomes_one_quantize_nhwc_with_the_same_bytes(zero):
    after, changed = run_and_compare(chain(zero), fuse_quantize_nhwc, rtol=0, atol=0)
    assert changed and op_counts(after) == {"ai.polykit:QuantizeNHWC": 1}
    assert after.nodes[0].attrs == {"channels": 16} and after.value("y").shape == (2, 9, 7, 16)


def test_a_quantize_transpose_without_a_pad_keeps_its_channels():
    after, changed = run_and_compare(chain(ZEROS["int8"], pad=False), fuse_quantize_nhwc, rtol=0, atol=0)
    assert changed and after.nodes[0].attrs == {"channels": 3}


@pytest.mark.parametrize("change", [dict(pad_value=np.int8(0)), dict(pads=(0, 0, 0, 1, 0, 0, 0, 13))],
                         ids=["pad_value", "pads"])
def test_a_pad_of_another_value_or_dim_stays_after_the_fused_quantize(change):
    after, changed = run_and_compare(chain(ZEROS["int8"], **change), fuse_quantize_nhwc, rtol=0, atol=0)
    assert changed and op_counts(after) == {"ai.polykit:QuantizeNHWC": 1, "Pad": 1}
    assert after.nodes[0].attrs == {"channels": 3}


def test_an_e4m3_quantize_with_a_negative_zero_point_or_without_saturation_stays():
    # the kernel pads with 0 bytes (-0 is 0x80) and encodes with saturation
    minus = chain(ml_dtypes.float8_e4m3fn(-0.0))
    assert not fuse_quantize_nhwc(minus)
    g = chain(ZEROS["e4m3"])
    g.nodes[0].attrs["saturate"] = 0
    assert not fuse_quantize_nhwc(g)


def test_a_per_channel_quantize_stays():
    g = chain(ZEROS["int8"], scale=np.float32([0.02, 0.03, 0.04]))
    g.nodes[0].attrs["axis"] = 1
    before = op_counts(g)
    _, changed = run_and_compare(g, fuse_quantize_nhwc, rtol=0, atol=0)
    assert not changed and op_counts(g) == before


def test_an_int8_build_quantizes_its_image_input_in_one_layer_and_computes_the_same():
    graph_ = load_onnx(convnet())
    ranges = {"x": (-2.0, 2.0), "r1": (0.0, 3.0), "f": (0.0, 2.0)}
    nhwc = build_plan(graph_, BuilderConfig(target="cpu", int8=True, tensor_ranges=ranges, channels_last=True))
    nchw = build_plan(graph_, BuilderConfig(target="cpu", int8=True, tensor_ranges=ranges, channels_last=False))
    kinds = [layer.kind for layer in nhwc.layers]  # (the fc's input is quantized by a QuantizeLinear)
    assert kinds[0] == "QuantizeNHWC" and nhwc.layers[0].inputs[0] == "x" and "Pad" not in kinds, kinds
    assert nhwc.layers[0].attrs["channels"] == 16 and kinds[1] == "QConvNHWC"
    feeds = feeds_for(convnet(), 3)
    outs = []
    for plan in (nhwc, nchw):
        with Runtime(plan.target).deserialize_engine(plan) as engine:
            outs.append(next(iter(engine.create_execution_context().execute(feeds).values())))
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("channels", [0, 2, "16", 2.5])
def test_a_quantize_nhwc_node_with_a_bad_channel_count_is_a_build_error(channels):
    # a plan or model file may carry the node: channels must be an integer >= X's channels
    from polykit.errors import PolykitError

    inits = {"s": np.asarray(np.float32(0.02)), "z": scalar(np.int8(0), np.int8)}
    bad = node("QuantizeNHWC", ["x", "s", "z"], "y", domain="ai.polykit", channels=channels)
    with pytest.raises(PolykitError, match="channels"):
        graph([bad], {"x": (2, 3, 9, 7)}, ["y"], inits)

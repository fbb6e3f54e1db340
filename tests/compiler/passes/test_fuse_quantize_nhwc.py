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


# a space-to-depth stem's image (space_to_depth_stems): x -> Pad (height, width) -> SpaceToDepth -> Q -> NHWC -> Pad
STEM_PADS = (0, 0, 3, 3, 0, 0, 4, 4)


def stem_chain(zero, *, xpads=STEM_PADS, value=None, mode=None, stem_pad=True, channel_pad=4, also=None,
               x=(2, 3, 9, 7), block=2):
    """x float32 -> [Pad by `value` (absent: none)] -> SpaceToDepth(block [, mode]) -> Q -> Transpose(0, 2, 3, 1)
    [-> Pad of `channel_pad` channels with the zero point], the last node writing y; `also`: a tensor that
    becomes a second graph output (read outside the chain)."""
    inits = {"s": np.asarray(np.float32(0.02)), "z": scalar(zero, zero.dtype),
             "xpads": np.array(xpads, np.int64), "pads": np.array((0,) * 7 + (channel_pad,), np.int64)}
    nodes = []
    src = "x"
    if stem_pad:
        ins = ["x", "xpads"]
        if value is not None:
            inits["v"] = np.asarray(value, np.float32)
            ins.append("v")
        nodes.append(node("Pad", ins, "xp", mode="constant"))
        src = "xp"
    nodes.append(node("SpaceToDepth", [src], "d", blocksize=block, **({"mode": mode} if mode else {})))
    nodes.append(node("QuantizeLinear", ["d", "s", "z"], "q"))
    nodes.append(node("Transpose", ["q"], "t" if channel_pad else "y", perm=[0, 2, 3, 1]))
    if channel_pad:
        nodes.append(node("Pad", ["t", "pads", "zv"], "y"))
        inits["zv"] = scalar(zero, zero.dtype)
    return graph(nodes, {"x": x}, ["y"] + ([also] if also else []), inits)


@pytest.mark.parametrize("zero", ZEROS.values(), ids=ZEROS)
def test_a_stems_pad_and_space_to_depth_fold_into_the_quantize_nhwc(zero):
    after, changed = run_and_compare(stem_chain(zero), fuse_quantize_nhwc, rtol=0, atol=0)
    assert changed and op_counts(after) == {"ai.polykit:QuantizeNHWC": 1}
    q = after.nodes[0]
    assert q.inputs[0] == "x" and q.attrs == {"channels": 16, "block": 2, "pads": [3, 3, 4, 4]}
    assert after.value("y").shape == (2, 8, 7, 16)


def test_a_space_to_depth_without_a_pad_folds_as_a_block_alone():
    g = stem_chain(ZEROS["uint8"], stem_pad=False, channel_pad=0, x=(1, 5, 8, 12), block=4)
    after, changed = run_and_compare(g, fuse_quantize_nhwc, rtol=0, atol=0)
    assert changed and op_counts(after) == {"ai.polykit:QuantizeNHWC": 1}
    assert after.nodes[0].attrs == {"channels": 80, "block": 4} and after.value("y").shape == (1, 2, 3, 80)


def test_a_value_or_zero_padding_pad_folds_with_its_value_absent_or_plus_zero():
    after, changed = run_and_compare(stem_chain(ZEROS["e4m3"], value=0.0), fuse_quantize_nhwc, rtol=0, atol=0)
    assert changed and op_counts(after) == {"ai.polykit:QuantizeNHWC": 1}


@pytest.mark.parametrize("change", [dict(value=1.0), dict(value=-0.0), dict(xpads=(0, 1, 3, 3, 0, 0, 4, 4)),
                                    dict(xpads=(0, 0, 3, 3, 0, 0, 4, 4), also="xp")],
                         ids=["value_1", "minus_zero", "channel_pad", "read_elsewhere"])
def test_a_pad_it_cannot_fold_stays_and_the_space_to_depth_still_folds(change):
    """A pad by 1.0, by -0.0 (e4m3 would encode it 0x80, not the zero point), of the channels, or whose output
    another node reads: the Pad stays, the QuantizeNHWC reads it with block 2 and no pads."""
    zero = ZEROS["e4m3"] if change.get("value") == -0.0 else ZEROS["int8"]
    if change.get("xpads", STEM_PADS)[1]:
        change = dict(change, channel_pad=0)  # 4 channels of 3 + 1 padded: 16 after the block, none added
    after, changed = run_and_compare(stem_chain(zero, **change), fuse_quantize_nhwc, rtol=0, atol=0)
    assert changed and op_counts(after) == {"Pad": 1, "ai.polykit:QuantizeNHWC": 1}
    q = next(n for n in after.nodes if n.op_type == "QuantizeNHWC")
    assert q.inputs[0] == "xp" and q.attrs["block"] == 2 and "pads" not in q.attrs


def test_a_crd_space_to_depth_or_one_read_elsewhere_stays():
    for g in (stem_chain(ZEROS["int8"], mode="CRD"), stem_chain(ZEROS["int8"], also="d")):
        after, changed = run_and_compare(g, fuse_quantize_nhwc, rtol=0, atol=0)
        assert changed and op_counts(after) == {"Pad": 1, "SpaceToDepth": 1, "ai.polykit:QuantizeNHWC": 1}
        q = next(n for n in after.nodes if n.op_type == "QuantizeNHWC")
        assert q.inputs[0] == "d" and q.attrs == {"channels": 16}

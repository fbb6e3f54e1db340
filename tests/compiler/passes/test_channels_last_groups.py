"""to_channels_last on depthwise and grouped convolutions: ConvNHWC keeps their group, their channels
are never padded, and chains of them stay channels-last (on the cpu target's reference kernels)."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.graph.evaluator import evaluate_graph
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.passes import optimize, to_channels_last
from polykit.compiler.passes.channels_last import conv_class

from tests.conv_models import convnext, mobilenet

from .passes_testkit import feeds_for, graph, node, op_counts, run_and_compare

RNG = np.random.default_rng(5)
CONV_NHWC = f"{POLYKIT_DOMAIN}:ConvNHWC"


def _w(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _depthwise(x, m, k, **attrs):
    """Conv (group = C) of an input of shape `x` into m = multiplier * C channels, then Relu."""
    c = x[1]
    return graph([node("Conv", ["x", "w", "b"], "c", name="dw", group=c, **attrs), node("Relu", ["c"], "y")],
                 {"x": x}, ["y"], {"w": _w(m, 1, *k), "b": _w(m)})


@pytest.mark.parametrize("group,channels,expected", [(1, 8, "dense"), (8, 8, "depthwise"), (13, 13, "depthwise"),
                                                     (2, 8, "grouped"), (4, 16, "grouped")])
def test_conv_class_names_dense_depthwise_and_grouped(group, channels, expected):
    assert conv_class(group, channels) == expected


# (x NCHW, out channels, kernel, attrs): odd sizes, tail channel counts, strides, dilations,
# asymmetric and automatic pads, a channel multiplier, 1 x k and k x 1 kernels
DEPTHWISE = [
    ((2, 8, 9, 7), 8, (3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 13, 11, 10), 13, (5, 5), {"strides": [2, 2], "pads": [2, 1, 2, 3]}),
    ((3, 24, 12, 13), 24, (3, 3), {"dilations": [2, 2], "pads": [2, 2, 2, 2]}),
    ((1, 8, 7, 7), 16, (3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 16, 9, 9), 16, (7, 7), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((1, 24, 1, 17), 24, (1, 7), {"pads": [0, 3, 0, 3]}),
    ((1, 12, 10, 9), 12, (7, 1), {"pads": [3, 0, 3, 0], "strides": [1, 2]}),
]


@pytest.mark.parametrize("x,m,k,attrs", DEPTHWISE)
def test_depthwise_conv_becomes_conv_nhwc_with_its_group_and_unpadded_channels(x, m, k, attrs):
    out, changed = run_and_compare(_depthwise(x, m, k, **attrs), to_channels_last)
    assert changed and op_counts(out) == {"Transpose": 2, CONV_NHWC: 1, "Relu": 1}  # no channel Pad
    conv = next(n for n in out.nodes if n.op_type == "ConvNHWC")
    assert conv.name == "dw" and conv.attrs["group"] == x[1] and "auto_pad" not in conv.attrs
    assert out.initializers[conv.inputs[1]].shape == (m, *k, 1)  # KRSC with one channel a group


def test_grouped_conv_stays_nchw_unless_its_class_is_asked_for():
    g = graph([node("Conv", ["x", "w"], "y", group=4, pads=[1, 1, 1, 1])], {"x": (2, 16, 7, 9)}, ["y"],
              {"w": _w(8, 4, 3, 3)})
    assert not to_channels_last(g.copy())
    out, changed = run_and_compare(g, lambda h: to_channels_last(h, conv_classes=("dense", "grouped")))
    conv = next(n for n in out.nodes if n.op_type == "ConvNHWC")
    assert changed and conv.attrs["group"] == 4 and out.initializers[conv.inputs[1]].shape == (8, 3, 3, 4)
    assert "Pad" not in op_counts(out)


def test_depthwise_conv_stays_nchw_when_its_class_is_not_asked_for():
    assert not to_channels_last(_depthwise((1, 8, 6, 6), 8, (3, 3), pads=[1, 1, 1, 1]), conv_classes=("dense",))


def test_unknown_conv_class_is_refused():
    with pytest.raises(ValueError, match="separable"):
        to_channels_last(_depthwise((1, 8, 6, 6), 8, (3, 3)), conv_classes=("dense", "separable"))


def _transposes_outside_the_chain(out) -> list[str]:
    """Transposes (and Reformats) that are not at the chain's entry (reading the image or its Cast)."""
    producers = out.producers()
    inner = []
    for n in out.nodes:
        if n.op_type not in ("Transpose", "Reformat"):
            continue
        src = producers.get(n.inputs[0])
        if not (n.inputs[0] == "image" or (src is not None and src.op_type == "Cast" and src.inputs[0] == "image")):
            inner.append(f"{src.op_type if src else n.inputs[0]} -> {n.name}")
    return inner


@pytest.mark.parametrize("fp16", [False, True])
def test_mobilenet_keeps_one_transpose_at_the_entry(fp16):
    g = load_onnx(mobilenet())
    out = optimize(g, keep=g.outputs, channels_last=True, fp16=fp16)
    counts = op_counts(out)
    # the two squeeze-excitation blocks' 1x1 convs are in their SqueezeExcite nodes (fuse_squeeze_excite)
    assert "Conv" not in counts and counts[CONV_NHWC] == 16 and counts[f"{POLYKIT_DOMAIN}:SqueezeExcite"] == 2
    assert counts["Transpose"] + counts[f"{POLYKIT_DOMAIN}:Reformat"] == 1 and not _transposes_outside_the_chain(out)
    feeds = feeds_for(g)
    nchw = evaluate_graph(optimize(g, keep=g.outputs, fp16=fp16), feeds)["logits"]
    tol = {"rtol": 1e-2, "atol": 1e-2} if fp16 else {"rtol": 1e-5, "atol": 1e-5}
    np.testing.assert_allclose(evaluate_graph(out, feeds)["logits"], nchw, **tol)


def test_convnext_blocks_run_channels_last_from_the_entry_to_the_pool():
    """The model's own Transposes around LayerNormalization cancel against the depthwise conv's, and
    the residual Adds and the final GlobalAveragePool run NHWC (plan_layouts): one Transpose stays,
    at the entry."""
    g = load_onnx(convnext())
    out = optimize(g, keep=g.outputs, channels_last=True)
    counts = op_counts(out)
    assert "Conv" not in counts and counts[CONV_NHWC] == 5 and counts[f"{POLYKIT_DOMAIN}:Reformat"] == 1
    assert "GlobalAveragePool" not in counts and "Transpose" not in counts
    assert [n.inputs for n in out.nodes if n.op_type == "Reformat"] == [["image"]]  # with the channel Pad
    feeds = feeds_for(g)
    np.testing.assert_allclose(evaluate_graph(out, feeds)["logits"], evaluate_graph(g, feeds)["logits"], rtol=1e-5,
                               atol=1e-5)


# 1-D convolutions (x [N, C, L], W [M, C / group, k]): grouped and depthwise ones run as 2-D ConvNHWC
# (dense ones: test_channels_last_conv1d.py)
CONV1D = [
    ((2, 12, 17), 12, 3, 12, {"pads": [1, 1]}),  # depthwise
    ((1, 16, 23), 16, 5, 4, {"strides": [2], "pads": [2, 1]}),  # grouped, asymmetric pads, stride 2
    ((3, 24, 19), 24, 3, 3, {"dilations": [2], "pads": [2, 2]}),  # grouped, dilation
    ((1, 8, 40), 16, 16, 2, {"pads": [8, 8]}),  # wav2vec2's positional conv in small: wide kernel, L' = L + 1
    ((2, 6, 11), 6, 3, 6, {"auto_pad": "SAME_UPPER"}),
]


def _conv1d(x, m, k, group, **attrs):
    return graph([node("Conv", ["x", "w", "b"], "c", name="conv1d", group=group, **attrs), node("Relu", ["c"], "y")],
                 {"x": x}, ["y"], {"w": _w(m, x[1] // group, k), "b": _w(m)})


@pytest.mark.parametrize("x,m,k,group,attrs", CONV1D)
def test_grouped_and_depthwise_1d_convs_run_as_2d_conv_nhwc(x, m, k, group, attrs):
    every = lambda h: to_channels_last(h, conv_classes=("dense", "depthwise", "grouped"))  # noqa: E731
    out, changed = run_and_compare(_conv1d(x, m, k, group, **attrs), every)
    assert changed and op_counts(out) == {"Transpose": 2, "Reshape": 2, CONV_NHWC: 1, "Relu": 1}
    conv = next(n for n in out.nodes if n.op_type == "ConvNHWC")
    assert conv.name == "conv1d" and conv.attrs["group"] == group and conv.attrs["kernel_shape"] == [1, k]
    assert out.initializers[conv.inputs[1]].shape == (m, 1, k, x[1] // group)  # KRSC, H = 1


def test_a_dense_1d_conv_stays_ncl_when_dense_convs_are_not_asked_for():
    assert not to_channels_last(_conv1d((1, 8, 12), 16, 3, 1, pads=[1, 1]), conv_classes=("depthwise", "grouped"))


def test_a_sequence_models_own_transposes_cancel_around_a_1d_conv():
    """[N, L, C] -> Transpose -> grouped Conv -> Transpose -> [N, L, M] (wav2vec2's positional conv):
    in the channels-last build nothing is left but the conv and views."""
    g = graph([node("Transpose", ["x"], "xt", perm=[0, 2, 1]),
               node("Conv", ["xt", "w", "b"], "c", name="pos_conv", group=4, pads=[2, 2]),
               node("Transpose", ["c"], "y", perm=[0, 2, 1])],
              {"x": (2, 13, 16)}, ["y"], {"w": _w(16, 4, 5), "b": _w(16)})
    feeds = feeds_for(g)
    want = evaluate_graph(g, feeds)["y"]
    out = optimize(g, channels_last=True, channels_last_convs=("dense", "depthwise", "grouped"))
    assert "Transpose" not in op_counts(out)
    np.testing.assert_allclose(evaluate_graph(out, feeds)["y"], want, rtol=1e-5, atol=1e-5)

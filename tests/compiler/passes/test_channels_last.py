"""to_channels_last: 2-D convs and pools become NHWC ops between Transposes that cancel_transposes cancels."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.graph.evaluator import evaluate_graph
from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.compiler.passes import optimize, to_channels_last

from tests.conv_models import resnet

from .passes_testkit import feeds_for, graph, node, op_counts, run_and_compare
from .test_pass_manager import DATA

RNG = np.random.default_rng(3)
CONV_NHWC, MAXPOOL_NHWC = f"{POLYKIT_DOMAIN}:ConvNHWC", f"{POLYKIT_DOMAIN}:MaxPoolNHWC"
REFORMAT = f"{POLYKIT_DOMAIN}:Reformat"


def _w(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def _conv_relu(c=8, m=6, **attrs):
    return graph([node("Conv", ["x", "w", "b"], "c", name="conv0", **attrs), node("Relu", ["c"], "y")],
                 {"x": (2, c, 9, 7)}, ["y"], {"w": _w(m, c, 3, 3), "b": _w(m)})


def test_conv_becomes_conv_nhwc_between_transposes_under_its_own_name():
    out, changed = run_and_compare(_conv_relu(pads=[1, 1, 1, 1]), to_channels_last)
    assert changed and op_counts(out) == {"Transpose": 2, CONV_NHWC: 1, "Relu": 1}
    conv = next(n for n in out.nodes if n.op_type == "ConvNHWC")
    assert conv.name == "conv0" and conv.attrs["kernel_shape"] == [3, 3] and conv.attrs["group"] == 1
    assert out.initializers[conv.inputs[1]].shape == (6, 3, 3, 8)  # KRSC
    assert out.value(conv.outputs[0]).shape == (2, 9, 7, 6)
    assert out.producers()["c"].op_type == "Transpose"  # readers still see the NCHW name


def test_three_channel_stem_pads_channels_to_eight_with_zeros():
    out, _ = run_and_compare(_conv_relu(c=3, strides=[2, 2]), to_channels_last)
    pad = next(n for n in out.nodes if n.op_type == "Pad")
    assert out.initializers[pad.inputs[1]].tolist() == [0, 0, 0, 0, 0, 0, 0, 5]
    w = out.initializers[next(n for n in out.nodes if n.op_type == "ConvNHWC").inputs[1]]
    assert w.shape == (6, 3, 3, 8) and not w[..., 3:].any() and w[..., :3].any()


def test_auto_pad_becomes_explicit_pads():
    out, _ = run_and_compare(_conv_relu(auto_pad="SAME_UPPER", strides=[2, 2]), to_channels_last)
    conv = next(n for n in out.nodes if n.op_type == "ConvNHWC")
    assert "auto_pad" not in conv.attrs and conv.attrs["pads"] == [1, 1, 1, 1]


def test_a_weight_shared_by_two_convs_is_repacked_once():
    g = graph([node("Conv", ["x", "w"], "a", pads=[1, 1, 1, 1]), node("Conv", ["a", "w"], "y", pads=[1, 1, 1, 1])],
              {"x": (1, 8, 5, 5)}, ["y"], {"w": _w(8, 8, 3, 3)})
    out, _ = run_and_compare(g, to_channels_last)
    assert len({n.inputs[1] for n in out.nodes if n.op_type == "ConvNHWC"}) == 1


@pytest.mark.parametrize("case", ["grouped", "1-d, weight is an input", "3-d, weight is an input", "weight is an input",
                                  "int8"])
def test_ineligible_convs_stay_nchw(case):
    x, w, attrs, extra = (1, 8, 6, 6), (8, 4, 3, 3), {"group": 2}, {}
    if case == "1-d, weight is an input":  # (dense 1-D convs with a constant weight convert: test_channels_last_conv1d)
        x, w, attrs, extra = (1, 8, 6), (8, 8, 3), {}, {"w": ((8, 8, 3), np.float32)}
    elif case == "3-d, weight is an input":  # (3-D convs with a constant weight convert: test_channels_last_conv3d)
        x, w, attrs, extra = (1, 8, 4, 4, 4), (8, 8, 1, 1, 1), {}, {"w": ((8, 8, 1, 1, 1), np.float32)}
    elif case == "weight is an input":
        w, attrs, extra = (8, 8, 3, 3), {}, {"w": ((8, 8, 3, 3), np.float32)}
    inits = {} if extra else {"w": _w(*w)}
    dtype = np.int8 if case == "int8" else np.float32
    if case == "int8":
        inits = {"w": np.ones((8, 4, 3, 3), np.int8)}
    g = graph([node("Conv", ["x", "w"], "y", **attrs)], {"x": (x, dtype), **extra}, ["y"], inits, strict=False)
    assert not to_channels_last(g) and op_counts(g) == {"Conv": 1}


def _conv_then(op, **attrs):
    outputs = ["y", "idx"] if op == "MaxPool+indices" else "y"
    op = op.split("+")[0]
    return [node("Conv", ["x", "w"], "c", pads=[1, 1, 1, 1]), node("Relu", ["c"], "r"),
            node(op, ["r"], outputs, **attrs)]


def test_pool_after_a_conv_runs_nhwc_with_explicit_pads():
    g = graph(_conv_then("MaxPool", kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER"),
              {"x": (2, 8, 9, 9)}, ["y"], {"w": _w(8, 8, 3, 3)})
    out, _ = run_and_compare(g, to_channels_last)
    pool = next(n for n in out.nodes if n.op_type == "MaxPoolNHWC")
    assert pool.domain == POLYKIT_DOMAIN and pool.attrs["pads"] == [1, 1, 1, 1] and "auto_pad" not in pool.attrs


def test_average_pool_keeps_count_include_pad_and_ceil_mode():
    g = graph(_conv_then("AveragePool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1,
                         count_include_pad=1), {"x": (1, 8, 8, 8)}, ["y"], {"w": _w(8, 8, 3, 3)})
    out, _ = run_and_compare(g, to_channels_last)
    pool = next(n for n in out.nodes if n.op_type == "AveragePoolNHWC")
    assert pool.attrs["ceil_mode"] == 1 and pool.attrs["count_include_pad"] == 1


def test_max_pool_whose_indices_are_read_stays_nchw():
    g = graph(_conv_then("MaxPool+indices", kernel_shape=[2, 2], strides=[2, 2]), {"x": (1, 8, 6, 6)}, ["y", "idx"],
              {"w": _w(8, 8, 3, 3)})
    out, _ = run_and_compare(g, to_channels_last)
    assert op_counts(out)["MaxPool"] == 1 and MAXPOOL_NHWC not in op_counts(out)


def test_pool_of_a_graph_input_stays_nchw():
    g = graph([node("MaxPool", ["x"], "y", kernel_shape=[2, 2])], {"x": (1, 8, 6, 6)}, ["y"])
    assert not to_channels_last(g)


def test_global_average_pool_after_a_conv_becomes_reduce_mean_over_h_and_w():
    g = graph(_conv_then("GlobalAveragePool"), {"x": (2, 8, 5, 5)}, ["y"], {"w": _w(8, 8, 3, 3)})
    out, _ = run_and_compare(g, to_channels_last)
    mean = next(n for n in out.nodes if n.op_type == "ReduceMean")
    assert out.initializers[mean.inputs[1]].tolist() == [1, 2] and mean.attrs["keepdims"] == 1


def _optimized(model, **kw):
    g = load_onnx(model)
    return g, optimize(g, keep=g.outputs, **kw)


@pytest.mark.parametrize("fp16", [False, True])
def test_resnet50_like_graph_keeps_one_transpose_at_the_entry(fp16):
    g, out = _optimized(resnet(), channels_last=True, fp16=fp16)
    counts = op_counts(out)
    # the entry (Cast ->) Transpose -> channel Pad is one Reformat (compose_reformats)
    assert "Transpose" not in counts and "Pad" not in counts and counts[REFORMAT] == 1
    assert counts[CONV_NHWC] == 53 and counts[MAXPOOL_NHWC] == 1 and "Conv" not in counts
    (t,) = [n for n in out.nodes if n.op_type == "Reformat"]
    assert t.inputs == ["image"] and t.attrs["perm"] == [0, 2, 3, 1] and t.attrs["pad"] == 5
    assert out.value(t.outputs[0]).dtype == (np.float16 if fp16 else np.float32) and counts["Cast"] == int(fp16)  # the exit
    # every residual Add and Relu went into a conv epilogue
    assert "Add" not in counts and "Relu" not in counts and "ai.polykit:Pointwise" not in counts
    feeds = feeds_for(g)
    rtol, atol = (1e-2, 1e-2) if fp16 else (1e-5, 1e-5)
    nchw = evaluate_graph(optimize(g, keep=g.outputs, fp16=fp16), feeds)["logits"]
    np.testing.assert_allclose(evaluate_graph(out, feeds)["logits"], nchw, rtol=rtol, atol=atol)


def test_fp32_layers_naming_conv_keep_the_nhwc_convs_in_float32():
    _, out = _optimized(resnet(depths=(1,)), channels_last=True, fp16=True, fp32_layers=("Conv",))
    convs = [n for n in out.nodes if n.op_type == "ConvNHWC"]
    assert convs and all(out.initializers[n.inputs[1]].dtype == np.float32 for n in convs)
    assert out.value(next(n for n in out.nodes if n.op_type == "MaxPoolNHWC").outputs[0]).dtype == np.float16

def test_a_resnet152_deep_chain_also_keeps_one_transpose():
    _, out = _optimized(resnet(depths=(3, 8, 36, 3)), channels_last=True)
    assert op_counts(out)[REFORMAT] == 1 and op_counts(out)[CONV_NHWC] == 155 and "Transpose" not in op_counts(out)

@pytest.mark.parametrize("model", ["convnet_ts.onnx", "convnet_dynamo.onnx"])
def test_torch_exported_convnets_keep_one_transpose(model):
    g, out = _optimized(DATA / model, channels_last=True)
    assert op_counts(out)["Transpose"] + op_counts(out)[REFORMAT] == 1 and op_counts(out)[CONV_NHWC] == 6
    feeds = feeds_for(g)
    np.testing.assert_allclose(evaluate_graph(out, feeds)["logits"], evaluate_graph(g, feeds)["logits"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kernel,bias", [(2, True), (3, False)])
def test_up_convolution_with_kernel_equal_to_stride_becomes_a_1x1_conv_nhwc_and_a_pixel_shuffle(kernel, bias):
    w = _w(5, 3, kernel, kernel + 1)  # ConvTranspose weight [C, M, kH, kW]
    g = graph([node("ConvTranspose", ["x", "w"] + (["b"] if bias else []), "u", name="up0",
                    kernel_shape=[kernel, kernel + 1], strides=[kernel, kernel + 1]), node("Relu", ["u"], "y")],
              {"x": (2, 5, 4, 3)}, ["y"], {"w": w, **({"b": _w(3)} if bias else {})})
    out, changed = run_and_compare(g, to_channels_last)
    conv = next(n for n in out.nodes if n.op_type == "ConvNHWC")
    assert changed and conv.name == "up0" and conv.attrs["kernel_shape"] == [1, 1]
    assert out.initializers[conv.inputs[1]].shape == (kernel * (kernel + 1) * 3, 1, 1, 8)  # taps x M, C padded
    assert [n.op_type for n in out.nodes if n.op_type in ("Reshape", "Transpose")] == \
        ["Transpose", "Reshape", "Transpose", "Reshape", "Transpose"]
    assert out.value("u").shape == (2, 3, 4 * kernel, 3 * (kernel + 1))


@pytest.mark.parametrize("attrs", [{"strides": [1, 1]}, {"strides": [2, 2], "pads": [1, 1, 0, 0]},
                                   {"strides": [2, 2], "output_padding": [1, 1]}, {"strides": [2, 2], "group": 5}])
def test_up_convolutions_whose_outputs_mix_input_pixels_stay(attrs):
    w = _w(5, 1 if attrs.get("group") else 3, 2, 2)
    g = graph([node("ConvTranspose", ["x", "w"], "y", kernel_shape=[2, 2], **attrs)], {"x": (2, 5, 4, 3)}, ["y"],
              {"w": w})
    assert not to_channels_last(g)

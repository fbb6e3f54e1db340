"""space_to_depth_stems: a strided conv over few channels as a stride-1 conv over its input's space-to-depth blocks
(graphs against the original on random data; which convs it takes; a cpu channels-last plan of a ResNet-like stem
against onnxruntime; an --int8 plan quantizes the rewritten stem with the image's scale; the cuda FP8 and fp16
plans built off the GPU)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.passes.space_to_depth_stems import space_to_depth_stems
from polykit.runtime.engine import Runtime

from .passes_testkit import graph, node, op_counts, run_and_compare

RNG = np.random.default_rng(11)


def _stem(x, m, kernel, strides, pads=None, bias=True, group=1, **attrs):
    """Conv of an input of shape `x` into m channels [+ bias], then Relu."""
    w = (RNG.standard_normal((m, x[1] // group) + kernel) / np.sqrt(x[1] * np.prod(kernel))).astype(np.float32)
    if group != 1:
        attrs["group"] = group
    inits = {"w": w} | ({"b": RNG.standard_normal(m).astype(np.float32)} if bias else {})
    if pads is not None:
        attrs["pads"] = pads
    return graph([node("Conv", ["x", "w"] + (["b"] if bias else []), "c", name="stem", strides=list(strides),
                       **attrs), node("Relu", ["c"], "y")], {"x": x}, ["y"], inits)


# (x, M, kernel, strides, pads, attrs, kernel after): ResNet's 7x7 / 2 stem (odd sizes: the bottom / right pads
# grow to whole blocks), a patchify conv (kernel = stride: a 1x1 conv after), ViT's 16 x 16 / 16 on a 32 x 48
# image, a 3x3 / 2 stem of 64 outputs, SAME_UPPER, a 5x5 / 3 of 2 channels, no bias
CASES = [
    ((2, 3, 33, 31), 64, (7, 7), (2, 2), [3, 3, 3, 3], {}, [4, 4]),
    ((1, 3, 16, 20), 96, (4, 4), (4, 4), [0, 0, 0, 0], {}, [1, 1]),
    ((1, 3, 32, 48), 64, (16, 16), (16, 16), None, {}, [1, 1]),
    ((2, 3, 15, 17), 64, (3, 3), (2, 2), [1, 1, 1, 1], {}, [2, 2]),
    ((1, 3, 14, 13), 64, (7, 7), (2, 2), None, {"auto_pad": "SAME_UPPER"}, [4, 4]),
    ((1, 2, 19, 20), 64, (5, 5), (3, 3), [2, 1, 2, 1], {}, [2, 2]),
]


@pytest.mark.parametrize("x,m,kernel,strides,pads,attrs,after", CASES)
def test_a_strided_stem_is_a_stride_1_conv_over_space_to_depth_blocks(x, m, kernel, strides, pads, attrs, after):
    g = _stem(x, m, kernel, strides, pads, bias=x[1] != 2, **attrs)
    out, changed = run_and_compare(g, lambda g_: space_to_depth_stems(g_, align=16), rtol=1e-4, atol=1e-5)
    counts = op_counts(out)
    assert changed and counts["SpaceToDepth"] == 1 and counts["Conv"] == 1
    conv = next(n for n in out.nodes if n.op_type == "Conv")
    s = strides[0]
    assert conv.name == "stem" and conv.attrs["kernel_shape"] == after and conv.attrs["strides"] == [1, 1]
    assert conv.attrs["pads"] == [0, 0, 0, 0] and "auto_pad" not in conv.attrs
    assert out.initializers[conv.inputs[1]].shape == (m, x[1] * s * s) + tuple(after)
    assert out.values["c"].shape == g.values["c"].shape


def test_the_convs_it_leaves():
    """Stride 1, too few outputs, a kernel whose padded K would not shrink by 2 (64 channels; fp16's alignment of 8
    on the 7x7 / 2 over 3: 392 -> 256), grouped, dilated, unequal strides: unchanged."""
    assert not space_to_depth_stems(_stem((1, 3, 16, 16), 64, (3, 3), (1, 1), [1, 1, 1, 1]), align=16)
    assert not space_to_depth_stems(_stem((1, 3, 16, 16), 32, (7, 7), (2, 2), [3, 3, 3, 3]), align=16)
    assert not space_to_depth_stems(_stem((1, 64, 16, 16), 64, (3, 3), (2, 2), [1, 1, 1, 1]), align=16)
    assert not space_to_depth_stems(_stem((1, 3, 32, 32), 64, (7, 7), (2, 2), [3, 3, 3, 3]), align=8)
    assert space_to_depth_stems(_stem((1, 3, 32, 32), 64, (7, 7), (2, 2), [3, 3, 3, 3]), align=16)
    assert not space_to_depth_stems(_stem((1, 4, 16, 16), 64, (4, 4), (2, 2), [1, 1, 1, 1], group=2), align=16)
    assert not space_to_depth_stems(_stem((1, 3, 32, 32), 64, (3, 3), (2, 2), [2, 2, 2, 2], dilations=[2, 2]),
                                    align=16)
    assert not space_to_depth_stems(_stem((1, 3, 32, 32), 64, (4, 4), (2, 4), [0, 0, 0, 0]), align=16)
    # a window that skips the last rows (H 10, 3x3 / 4, no pads: rows 0..2 and 4..6 read, 7..9 never): a crop
    assert not space_to_depth_stems(_stem((1, 3, 10, 10), 64, (3, 3), (4, 4), [0, 0, 0, 0]), align=16)


def test_it_carries_the_input_scale_to_the_new_tensors():
    g = _stem((1, 3, 33, 31), 64, (7, 7), (2, 2), [3, 3, 3, 3])
    scales = {"x": 0.05, "c": 0.2}
    assert space_to_depth_stems(g, align=16, scales=scales)
    pad = next(n for n in g.nodes if n.op_type == "Pad")
    s2d = next(n for n in g.nodes if n.op_type == "SpaceToDepth")
    assert scales[pad.outputs[0]] == scales[s2d.outputs[0]] == 0.05 and scales["c"] == 0.2


def _resnet_stem_model() -> onnx.ModelProto:
    """x [N, 3, 29, 27] -> 7x7 / 2 conv (64) + BatchNormalization + Relu -> 3x3 / 2 max pool -> 1x1 conv (16)."""
    w = (RNG.standard_normal((64, 3, 7, 7)) / 12).astype(np.float32)
    w2 = (RNG.standard_normal((16, 64, 1, 1)) / 8).astype(np.float32)
    bn = [RNG.uniform(0.5, 1.5, 64), RNG.standard_normal(64) * 0.1, RNG.standard_normal(64) * 0.1,
          RNG.uniform(0.5, 1.5, 64)]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(w2, "w2")] + [
        numpy_helper.from_array(a.astype(np.float32), n) for a, n in zip(bn, ("g", "beta", "mean", "var"))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv1", strides=[2, 2], pads=[3, 3, 3, 3]),
             helper.make_node("BatchNormalization", ["c", "g", "beta", "mean", "var"], ["n"], name="bn1"),
             helper.make_node("Relu", ["n"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["p", "w2"], ["y"], name="conv2")]
    g = helper.make_graph(nodes, "stem", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 29, 27])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _run(plan, feeds):
    (out,) = Runtime().deserialize_engine(plan.serialize()).create_execution_context().execute(feeds).values()
    return out


def _stem_layer(plan):
    return next(layer for layer in plan.layers if layer.name == "conv1")


def assert_one_quantize_before_the_stem(plan):
    """The image's Pad and SpaceToDepth fold into its QuantizeNHWC (fuse_quantize_nhwc: block 2, the stem's pads
    of 3 grown to whole blocks at the bottom / right, 29 + 3 + 4 = 36 rows, 27 + 3 + 4 = 34 columns): one layer
    from x to the stem's 16-channel input, no Cast, Pad or SpaceToDepth layer in the plan."""
    layers = list(plan.layers)
    stem = layers.index(_stem_layer(plan))
    (quantize,) = layers[:stem]
    assert quantize.kind == "QuantizeNHWC" and quantize.inputs[0] == "x", [(lay.kind, lay.name) for lay in layers]
    assert quantize.attrs == {"channels": 16, "block": 2, "pads": [3, 3, 4, 4]}, quantize.attrs
    assert quantize.outputs[0] == layers[stem].inputs[0] and quantize.out_shapes[0] == (2, 18, 17, 16)
    kinds = Counter(layer.kind for layer in layers)
    assert not kinds["Cast"] and not kinds["Pad"] and not kinds["SpaceToDepth"], kinds


def test_cpu_channels_last_int8_plan_quantizes_the_rewritten_stem_and_matches_onnxruntime():
    """--int8 channels-last on the cpu target (its alignment of 16): the stem a 4x4 stride-1 QConvNHWC over 16
    channels (12 real) with the image's scale; outputs near onnxruntime's float ones (a cosine: INT8 numerics);
    the float channels-last plan (not quantized: the pass does not run, the 7x7 / 2 stays) equal to onnxruntime."""
    model = _resnet_stem_model()
    x = RNG.standard_normal((2, 3, 29, 27)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    shapes = {"input_shapes": {"x": (2, 3, 29, 27)}}
    plain = build_plan(model, BuilderConfig(target="cpu", channels_last=True, **shapes))
    assert _stem_layer(plain).attrs["kernel_shape"] == [7, 7]
    np.testing.assert_allclose(_run(plain, {"x": x}), want, rtol=1e-4, atol=1e-4)
    feeds = [{"x": RNG.standard_normal((2, 3, 29, 27)).astype(np.float32)} for _ in range(3)]
    quantized = build_plan(model, BuilderConfig(target="cpu", channels_last=True, int8=True,
                                                calibration_data=feeds, **shapes))
    stem = _stem_layer(quantized)
    assert stem.kind == "QConvNHWC" and stem.attrs["kernel_shape"] == [4, 4] and stem.in_shapes[0][3] == 16
    kinds = Counter(layer.kind for layer in quantized.layers)
    assert kinds["QConvNHWC"] == 2 and not kinds["Conv"] and not kinds["ConvNHWC"]
    assert_one_quantize_before_the_stem(quantized)
    got = _run(quantized, {"x": x}).astype(np.float64).ravel()
    cosine = float(got @ want.ravel() / (np.linalg.norm(got) * np.linalg.norm(want)))
    assert cosine > 0.995, cosine


@pytest.mark.parametrize("precision", ["fp8", "int8"])
def test_cuda_quantized_plan_runs_the_stem_as_a_4x4_conv_over_16_channels(precision, tmp_path, monkeypatch):
    """The cuda --fp8 / --int8 (--fp16) plan of the ResNet-like stem, built off the GPU at level 0 from a cpu
    calibration cache: the stem a stride-1 4x4 QConvNHWC over 16 channels (K 256, where the 7x7 / 2 over 3 channels
    padded to 16 had 784) on an sm_90 tactic, its input one QuantizeNHWC (block 2, pads) from x: no Cast, Pad or
    SpaceToDepth layer; the --fp16 plan keeps the 7x7 / 2 (16-bit builds do not take the
    pass yet: 392 -> 256 products at their alignment of 8, untimed)."""
    from tests.compiler.test_fp8_gemm_plan import stand_in_sm90

    model = _resnet_stem_model()
    shapes = {"input_shapes": {"x": (2, 3, 29, 27)}}
    cache = tmp_path / "stem.cache"
    feeds = [{"x": RNG.standard_normal((2, 3, 29, 27)).astype(np.float32)} for _ in range(2)]
    build_plan(model, BuilderConfig(target="cpu", calibration_cache=cache, calibration_data=feeds,
                                    builder_optimization_level=0, **{precision: True}, **shapes))
    stand_in_sm90(monkeypatch)
    plan = build_plan(model, BuilderConfig(target="cuda", fp16=True, calibration_cache=cache,
                                           builder_optimization_level=0, **{precision: True}, **shapes))
    stem = _stem_layer(plan)
    assert stem.kind == "QConvNHWC" and stem.precision == precision and stem.attrs["kernel_shape"] == [4, 4]
    assert stem.in_shapes[0][3] == 16 and stem.in_shapes[2][1:] == (4, 4, 16), stem.in_shapes
    assert stem.tactic.startswith(f"cuda.{precision}."), stem.tactic
    assert_one_quantize_before_the_stem(plan)
    assert plan.layers[0].tactic == "cuda.quantize", plan.layers[0].tactic
    half = build_plan(model, BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0, **shapes))
    assert _stem_layer(half).attrs["kernel_shape"] == [7, 7]


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp8", "int8"])
def test_cuda_quantized_stem_plan_matches_the_cpu_plan_on_a_gpu(precision, tmp_path):
    """On a GPU: the cuda --fp16 --fp8 / --int8 plan (the image's QuantizeNHWC with the stem's Pad and SpaceToDepth
    folded in, the 4x4 QConvNHWC stem on its sm_90 or mma tactic) against the cpu plan from the same calibration cache, on a batch the calibration did not see."""
    pytest.importorskip("cuda.bindings")
    model = _resnet_stem_model()
    shapes = {"input_shapes": {"x": (2, 3, 29, 27)}}
    cache = tmp_path / "stem.cache"
    feeds = [{"x": RNG.standard_normal((2, 3, 29, 27)).astype(np.float32)} for _ in range(2)]
    cpu = build_plan(model, BuilderConfig(target="cpu", calibration_cache=cache, calibration_data=feeds,
                                          channels_last=True, **{precision: True}, **shapes))
    cuda = build_plan(model, BuilderConfig(target="cuda", fp16=True, calibration_cache=cache,
                                           **{precision: True}, **shapes))
    assert _stem_layer(cuda).attrs["kernel_shape"] == [4, 4] == _stem_layer(cpu).attrs["kernel_shape"]
    x = {"x": RNG.standard_normal((2, 3, 29, 27)).astype(np.float32)}
    got, want = _run(cuda, x).astype(np.float64).ravel(), _run(cpu, x).astype(np.float64).ravel()
    cosine = float(got @ want / (np.linalg.norm(got) * np.linalg.norm(want)))
    assert cosine > 0.995, cosine

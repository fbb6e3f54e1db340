"""to_channels_last on 3-D convolutions (video networks): the 2-D ConvNHWC of the depth taps stacked into
channels (a strided Slice of D per tap, one Concat, [N * OD, H, W, C * kd]), so the NHWC tensor-core tactics and
their epilogues serve dense, grouped and depthwise 3-D convs; a (1, kh, kw) conv stacks nothing (cpu graphs and
plans against the original graph and onnxruntime, the cuda fp16 plan built off the GPU, and on a GPU the cuda plan
against the cpu one)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnxruntime as ort
import pytest

from polykit.compiler.builder.builder import build_plan, conv_pixels
from polykit.compiler.builder.config import FP32_NHWC_PIXELS, BuilderConfig
from polykit.compiler.graph.infer import infer_shapes
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.ops.nn.channels_last import CHANNEL_ALIGN
from polykit.compiler.passes import to_channels_last
from polykit.compiler.passes.channels_last import CONV_CLASSES
from polykit.kernels.tactics import candidates
from polykit.runtime.engine import Runtime

from tests.conv_models import video_net

from .passes_testkit import graph, node, op_counts, run_and_compare

RNG = np.random.default_rng(5)
CONV_NHWC = f"{POLYKIT_DOMAIN}:ConvNHWC"


def _conv3d(x, m, kernel, group=1, bias=True, **attrs):
    """Conv3d of an input of shape `x` into m channels [+ bias], then Relu."""
    w = (RNG.standard_normal((m, x[1] // group) + kernel) / np.sqrt(x[1] // group * np.prod(kernel))).astype(np.float32)
    inits = {"w": w} | ({"b": RNG.standard_normal(m).astype(np.float32)} if bias else {})
    return graph([node("Conv", ["x", "w"] + (["b"] if bias else []), "c", name="conv3d", group=group, **attrs),
                  node("Relu", ["c"], "y")], {"x": x}, ["y"], inits)


# (x [N, C, D, H, W], M, kernel, group, attrs): a dense 3x3x3 of 5 channels (15 stacked, padded to 16), the
# spatial (1, 3, 3) and temporal (3, 1, 1) halves of a (2+1)-D block (a temporal stride; a depthwise one), depth
# dilation on a depthwise 3x3x3, SAME_UPPER with strides 2 on a grouped conv, a 5-tap temporal kernel of 4
# channels (padded to 8), odd sizes
CASES = [
    ((2, 5, 7, 9, 8), 12, (3, 3, 3), 1, {"pads": [1, 1, 1, 1, 1, 1]}),
    ((1, 8, 6, 7, 5), 16, (1, 3, 3), 1, {"pads": [0, 1, 1, 0, 1, 1]}),
    ((2, 16, 9, 5, 5), 16, (3, 1, 1), 1, {"strides": [2, 1, 1], "pads": [1, 0, 0, 1, 0, 0]}),
    ((1, 8, 9, 4, 3), 8, (3, 1, 1), 8, {"pads": [1, 0, 0, 1, 0, 0]}),
    ((1, 6, 8, 6, 6), 6, (3, 3, 3), 6, {"pads": [2, 1, 1, 2, 1, 1], "dilations": [2, 1, 1]}),
    ((1, 8, 7, 6, 6), 16, (2, 3, 3), 2, {"auto_pad": "SAME_UPPER", "strides": [2, 2, 2]}),
    ((1, 4, 5, 4, 4), 8, (5, 1, 1), 1, {}),
]


def _form(kernel, attrs) -> str:
    """How conv3d runs a case: "temporal" ((kd, 1, 1), spatial stride 1, no spatial pads: kernel [kd, 1] over
    [N, D, H * W, C]), "images" ((1, kh, kw), depth stride 1, no depth pads: over N * D images), else "stacked"."""
    kd, kh, kw = kernel
    strides, pads = attrs.get("strides", [1, 1, 1]), attrs.get("pads", [0] * 6)
    if kh == kw == 1 and strides[1:] == [1, 1] and not any(pads[i] for i in (1, 2, 4, 5)):
        return "temporal"
    return "images" if kd == 1 and strides[0] == 1 and not (pads[0] or pads[3]) else "stacked"


@pytest.mark.parametrize("x,m,kernel,group,attrs", CASES)
def test_3d_conv_runs_as_a_2d_conv_nhwc_of_its_stacked_depth_taps_or_a_view(x, m, kernel, group, attrs):
    g = _conv3d(x, m, kernel, group, **attrs)
    out, changed = run_and_compare(g, lambda graph_: to_channels_last(graph_, conv_classes=CONV_CLASSES), atol=1e-5)
    counts = op_counts(out)
    assert changed and "Conv" not in counts and counts[CONV_NHWC] == 1 and counts["Transpose"] == 2
    kd, kh, kw = kernel
    form = _form(kernel, attrs)
    assert counts["Slice"] == (kd if form == "stacked" else 0)
    assert counts["Concat"] == (1 if form == "stacked" and kd > 1 else 0)
    conv = next(n for n in out.nodes if n.op_type == "ConvNHWC")
    taps = 1 if form == "temporal" else kd  # input channels a 2-D group holds per 3-D input channel
    assert conv.name == "conv3d" and conv.attrs["group"] == group
    assert conv.attrs["kernel_shape"] == ([kd, 1] if form == "temporal" else [kh, kw])
    real = x[1] // group * taps  # a group's channels before the dense conv's alignment
    channels = real * group if group > 1 or real % CHANNEL_ALIGN == 0 else -(-real // CHANNEL_ALIGN) * CHANNEL_ALIGN
    packed = out.initializers[conv.inputs[1]]
    rows, cols = (kd, 1) if form == "temporal" else (kh, kw)
    assert packed.shape == (m, rows, cols, channels // group) and not packed[..., real:].any()
    # stacked: channel c * kd + dz of the stack is tap dz of input channel c, so W [m, c, dz] lands there;
    # temporal: W [m, c, dz] is the 2-D kernel's row dz
    w = g.initializers["w"]
    want = w.reshape(m, real, kh, kw) if form != "temporal" else w.reshape(m, real, kd, 1)
    np.testing.assert_array_equal(packed[..., :real], np.transpose(want, (0, 2, 3, 1)))


def test_a_3d_conv_class_not_asked_for_and_an_unknown_depth_stay():
    g = _conv3d((1, 6, 8, 6, 6), 6, (3, 3, 3), 6, pads=[1] * 6)  # depthwise 3-D: a grouped 2-D conv of 3 a group
    assert not to_channels_last(g, conv_classes=("dense", "depthwise"))
    g = _conv3d((1, 8, 6, 6, 6), 8, (3, 3, 3), pads=[1] * 6)
    g.values["x"] = g.values["x"].with_(shape=(1, 8, "d", 6, 6))
    assert not to_channels_last(g)


def _run(plan, feeds):
    (out,) = Runtime().deserialize_engine(plan.serialize()).create_execution_context().execute(feeds).values()
    return out


def _clip(seed: int) -> dict[str, np.ndarray]:
    return {"clip": np.random.default_rng(seed).standard_normal((2, 3, 6, 10, 10)).astype(np.float32)}


def test_cpu_channels_last_plan_of_a_video_net_matches_onnxruntime():
    model = video_net()
    plan = build_plan(model, BuilderConfig(target="cpu", channels_last=True))
    kinds = Counter(layer.kind for layer in plan.layers)
    assert kinds["ConvNHWC"] == 4 and not kinds["Conv"]  # the depthwise one too, as a grouped 2-D conv
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for seed in (0, 1):
        feeds = _clip(seed)
        np.testing.assert_allclose(_run(plan, feeds), session.run(None, feeds)[0], rtol=1e-4, atol=1e-4)


def _cuda_fp16(model):
    """The cuda fp16 plan at builder level 0 (first-priority tactics, nothing timed: no GPU needed)."""
    return build_plan(model, BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0))


def test_cuda_fp16_video_net_runs_every_3d_conv_on_the_nhwc_tactics():
    """Every 3-D conv a ConvNHWC layer (the depthwise one as a grouped conv of 3 channels a group, a class the
    cuda build converts), its Relu in the epilogue, and the dense ones among the sm_90 tensor-core tactics."""
    plan = _cuda_fp16(video_net())
    convs = [layer for layer in plan.layers if layer.kind == "ConvNHWC"]
    assert len(convs) == 4 and not any(layer.kind == "Conv" for layer in plan.layers)
    assert all([op["op"] for op in c.attrs["epilogue"]["body"]] == ["Relu"] for c in convs)
    for layer in convs:
        names = [t.name for t in candidates("cuda", "ConvNHWC", layer, arch="sm_90")]
        if layer.attrs["group"] == 1:
            assert any(n.startswith("cuda.conv_nhwc.sm90_") for n in names), (layer.name, names)
        else:
            assert layer.attrs["group"] == 16 and layer.in_shapes[1][3] == 3 and names, (layer.name, names)


@pytest.mark.gpu
def test_cuda_fp16_video_net_matches_the_cpu_plan():
    model = video_net()
    cuda, cpu = _cuda_fp16(model), build_plan(model, BuilderConfig(target="cpu"))
    for seed in (0, 1):
        feeds = _clip(seed)
        got, want = _run(cuda, feeds), _run(cpu, feeds)
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2 * float(np.max(np.abs(want))))


def test_channels_last_decision_counts_the_pixels_of_3d_convs():
    """A 3-D conv's pixels are its 2-D ConvNHWC's (N * OD * OH * OW), so an fp32 cuda build of a large clip goes
    channels-last and a small one does not."""
    g = load_onnx(video_net(batch=4, frames=16, size=56))
    infer_shapes(g)
    assert conv_pixels(g) == [4 * 16 * 56 * 56, 4 * 16 * 28 * 28, 4 * 16 * 28 * 28, 4 * 8 * 14 * 14]
    assert BuilderConfig().channels_last_for("cuda", conv_pixels(g))
    small = load_onnx(video_net(batch=1, frames=2, size=4))
    infer_shapes(small)
    assert conv_pixels(small) == [32, 8, 8, 1] and FP32_NHWC_PIXELS > 32
    assert not BuilderConfig().channels_last_for("cuda", conv_pixels(small))

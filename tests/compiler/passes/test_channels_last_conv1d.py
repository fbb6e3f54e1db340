"""to_channels_last on dense 1-D convolutions (Whisper's and wav2vec2's front-ends): the 2-D ConvNHWC of
x viewed [N, 1, L, C] with kernel [1, k], its channels padded to CHANNEL_ALIGN with zeros as a dense 2-D
conv's are, so the NHWC tensor-core tactics serve it; the activations land in its epilogue and the
model's own Transposes cancel (cpu plans against onnxruntime, the cuda fp16 plan built off the GPU)."""

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
from polykit.compiler.passes import optimize, to_channels_last
from polykit.compiler.plan.file import Plan
from polykit.compiler.plan.profiles import Profile
from polykit.kernels.tactics import candidates
from polykit.runtime.engine import Runtime

from tests.conv_models import wav2vec2_frontend, whisper_frontend

from .passes_testkit import graph, node, op_counts, run_and_compare

RNG = np.random.default_rng(11)
CONV_NHWC = f"{POLYKIT_DOMAIN}:ConvNHWC"


def _w(*shape):
    return (RNG.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)


def _dense(x, m, k, act="Relu", bias=True, **attrs):
    """Conv1d (group 1) of an input of shape `x` into m channels [+ bias], then `act`."""
    inits = {"w": _w(m, x[1], k)} | ({"b": _w(m)} if bias else {})
    return graph([node("Conv", ["x", "w"] + (["b"] if bias else []), "c", name="conv1d", **attrs),
                  node(act, ["c"], "y")], {"x": x}, ["y"], inits)


# (x [N, C, L], out channels, kernel, attrs, bias): Whisper's k3 s1 / s2, wav2vec2's first conv (one
# input channel, k10 s5, no bias), dilation, odd lengths, channel counts off the alignment, auto pads
DENSE = [
    ((2, 80, 31), 48, 3, {"pads": [1, 1]}, True),
    ((2, 48, 31), 48, 3, {"pads": [1, 1], "strides": [2]}, True),
    ((2, 1, 203), 16, 10, {"strides": [5]}, False),
    ((1, 12, 29), 20, 3, {"pads": [2, 2], "dilations": [2]}, True),
    ((3, 20, 17), 8, 5, {"auto_pad": "SAME_UPPER", "strides": [3]}, True),
    ((1, 16, 9), 24, 2, {"strides": [2]}, False),
]


@pytest.mark.parametrize("x,m,k,attrs,bias", DENSE)
def test_dense_1d_conv_runs_as_2d_conv_nhwc_with_padded_channels(x, m, k, attrs, bias):
    out, changed = run_and_compare(_dense(x, m, k, bias=bias, **attrs), to_channels_last, atol=1e-5)
    c = x[1]
    padded = -(-c // CHANNEL_ALIGN) * CHANNEL_ALIGN
    want = {"Transpose": 2, "Reshape": 2, CONV_NHWC: 1, "Relu": 1} | ({"Pad": 1} if padded != c else {})
    assert changed and op_counts(out) == want
    conv = next(n for n in out.nodes if n.op_type == "ConvNHWC")
    assert conv.name == "conv1d" and conv.attrs["group"] == 1 and conv.attrs["kernel_shape"] == [1, k]
    assert conv.attrs["strides"][0] == 1 and conv.attrs["dilations"][0] == 1 and conv.attrs["pads"][::2] == [0, 0]
    packed = out.initializers[conv.inputs[1]]
    assert packed.shape == (m, 1, k, padded) and not packed[..., c:].any()  # KRSC, zero channels past C
    assert (len(conv.inputs) == 3) == bias


def test_dense_1d_conv_stays_ncl_when_its_shape_is_unknown():
    g = _dense((2, 8, 12), 8, 3, pads=[1, 1])
    g.values["x"] = g.values["x"].with_(shape=None)
    assert not to_channels_last(g)


def test_whisper_frontend_fuses_gelu_into_each_conv_and_cancels_the_models_transpose():
    """Conv -> Gelu -> Conv -> Gelu -> Transpose (0, 2, 1): one Transpose stays (the mel input's), the
    two Gelus are the convs' epilogues and the NLC output of conv2 feeds LayerNormalization directly."""
    g = load_onnx(whisper_frontend())
    out = optimize(g, keep=g.outputs, channels_last=True)
    counts = op_counts(out)
    assert counts[CONV_NHWC] == 2 and counts["Transpose"] == 1 and "Conv" not in counts and "Gelu" not in counts
    assert [n.inputs for n in out.nodes if n.op_type == "Transpose"] == [["mel"]]
    for conv in (n for n in out.nodes if n.op_type == "ConvNHWC"):
        assert [op["op"] for op in conv.attrs["epilogue"]["body"]] == ["Gelu"]


def _run(plan: Plan, feeds: dict[str, np.ndarray]) -> np.ndarray:
    (out,) = Runtime().deserialize_engine(plan.serialize()).create_execution_context().execute(feeds).values()
    return out


def _onnxruntime(model, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


# (model, input name, input shape): odd lengths
FRONTENDS = {"whisper": (lambda: whisper_frontend(length=37), "mel", (2, 80, 37)),
             "wav2vec2": (lambda: wav2vec2_frontend(length=213), "audio", (2, 213)),
             "wav2vec2_odd_pos_kernel": (lambda: wav2vec2_frontend(batch=3, length=157, pos_kernel=7), "audio", (3, 157))}


@pytest.mark.parametrize("name", sorted(FRONTENDS))
def test_cpu_channels_last_plan_of_audio_frontend_matches_onnxruntime(name):
    make, inp, shape = FRONTENDS[name]
    model = make()
    plan = build_plan(model, BuilderConfig(target="cpu", channels_last=True))
    kinds = Counter(layer.kind for layer in plan.layers)
    assert kinds["ConvNHWC"] >= 2 and not kinds["Conv"]
    feeds = {inp: RNG.standard_normal(shape).astype(np.float32)}
    np.testing.assert_allclose(_run(plan, feeds), _onnxruntime(model, feeds), rtol=1e-4, atol=1e-4)


def test_profile_build_with_dynamic_length_runs_dense_1d_convs_nhwc_at_every_length():
    """The length axis dynamic (a profile from 17 to 61 frames): the convs are ConvNHWC, and the plan
    matches onnxruntime at the profile's ends and at an odd length between them."""
    model = whisper_frontend(batch="n", length="frames")
    profile = Profile({"mel": ((1, 80, 17), (2, 80, 40), (3, 80, 61))})
    plan = build_plan(model, BuilderConfig(target="cpu", channels_last=True, profiles=[profile]))
    assert Counter(layer.kind for layer in plan.layers)["ConvNHWC"] == 2
    with Runtime().deserialize_engine(plan.serialize()) as engine, engine.create_execution_context() as ctx:
        for shape in ((1, 80, 17), (2, 80, 33), (3, 80, 61)):
            feeds = {"mel": RNG.standard_normal(shape).astype(np.float32)}
            want = _onnxruntime(model, feeds)
            got = ctx.execute(feeds)["hidden"]
            assert got.shape == want.shape == (shape[0], -(-shape[2] // 2), 48)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=str(shape))


def _cuda_fp16(model, profiles=()) -> Plan:
    """The cuda fp16 plan at builder level 0 (first-priority tactics, nothing timed: no GPU needed)."""
    return build_plan(model, BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0,
                                           profiles=list(profiles)))


def test_cuda_fp16_profile_build_with_dynamic_length_runs_the_convs_nhwc():
    model = whisper_frontend(batch="n", length="frames")
    plan = _cuda_fp16(model, [Profile({"mel": ((1, 80, 17), (2, 80, 40), (3, 80, 61))})])
    kinds = Counter(layer.kind for layer in plan.layers)
    assert kinds["ConvNHWC"] == 2 and not kinds["Conv"] and kinds["Transpose"] == 1


def test_cuda_fp16_whisper_frontend_plan_has_no_transpose_after_the_convs():
    """Cast, the entry Transpose, the views and the two ConvNHWC layers with Gelu in their epilogues,
    then LayerNormalization reads conv2's output through a view (no Transpose layer in between)."""
    plan = _cuda_fp16(whisper_frontend())
    kinds = [layer.kind for layer in plan.layers]
    assert Counter(kinds) == Counter({"Cast": 2, "Transpose": 1, "Reshape": 4, "ConvNHWC": 2, "LayerNormalization": 1})
    assert kinds.index("Transpose") < kinds.index("ConvNHWC")
    convs = [layer for layer in plan.layers if layer.kind == "ConvNHWC"]
    assert all([op["op"] for op in c.attrs["epilogue"]["body"]] == ["Gelu"] for c in convs)
    after = kinds[kinds.index("ConvNHWC", kinds.index("ConvNHWC") + 1) + 1:]
    assert after == ["Reshape", "LayerNormalization", "Cast"]
    assert all(layer.outputs[0] in plan.memory.aliases for layer in plan.layers if layer.kind == "Reshape")


#: what the sm_90 tensor-core convolution tactics are called
SM90 = "cuda.conv_nhwc.sm90_"


@pytest.mark.parametrize("model", [whisper_frontend, wav2vec2_frontend])
def test_sm90_and_mma_conv_tactics_take_every_dense_1d_conv(model):
    """H = 1, kernel 1 x k (k 10, 3, 2), strides 1 x 2 and 1 x 5, one input channel padded to 8:
    the wgmma (sm_90) and mma.sync implicit GEMMs both run each dense conv of the front-ends."""
    plan = _cuda_fp16(model())
    dense = [layer for layer in plan.layers if layer.kind == "ConvNHWC" and layer.attrs["group"] == 1]
    assert len(dense) == (2 if model is whisper_frontend else 3)
    for layer in dense:
        names = [t.name for t in candidates("cuda", "ConvNHWC", layer, arch="sm_90")]
        assert any(n.startswith(SM90) for n in names) and "cuda.conv_nhwc.igemm_mma" in names, (layer.name, names)
        assert layer.in_shapes[0][1] == 1 and layer.in_shapes[0][3] % CHANNEL_ALIGN == 0


def test_wide_grouped_positional_conv_runs_on_the_nhwc_implicit_gemm():
    """wav2vec2's positional conv (16 groups of 48 channels, k = 128) as the zoo has it: its window of
    weights outgrows the shared memory of the grouped kernels (conv_grouped, grouped_mma), so the
    grouped Hopper tiles (sm90g, conv_sm90_grouped.py) and the grouped NHWC implicit GEMMs run it."""
    plan = _cuda_fp16(wav2vec2_frontend(length=1203, width=16, model_dim=768, groups=16, pos_kernel=128))
    (pos,) = [layer for layer in plan.layers if layer.kind == "ConvNHWC" and layer.attrs["group"] == 16]
    assert pos.attrs["kernel_shape"] == [1, 128] and pos.in_shapes[1] == (768, 1, 128, 48)
    names = [t.name for t in candidates("cuda", "ConvNHWC", pos, arch="sm_90")]
    assert names == [f"cuda.conv_nhwc.sm90g_{t}" for t in ("128x64", "64x64", "64x64x2")] + [
        "cuda.conv_nhwc.igemm_simt", "cuda.conv_nhwc.igemm_simt_wide"]


def test_sm90_conv_kernels_of_the_frontends_compile_with_nvrtc(shared_kernel_cache):
    """The kernels the sm_90 tactics would launch for these layers (Gelu epilogues, no bias) compile."""
    nvrtc = pytest.importorskip("polykit.runtime.cuda.nvrtc")
    sources = {}
    for model in (whisper_frontend(), wav2vec2_frontend()):
        for layer in _cuda_fp16(model).layers:
            if layer.kind == "ConvNHWC" and layer.attrs["group"] == 1:
                for tactic in candidates("cuda", "ConvNHWC", layer, arch="sm_90"):
                    if tactic.name in (f"{SM90}128x128", f"{SM90}64x64"):
                        sources.update({s.key(): s for s in tactic.kernels(layer)})
    assert len(sources) >= 2
    try:
        cubins = [nvrtc.compile_cached(source, "sm_90") for source in sources.values()]
    except Exception as exc:  # no NVRTC library on this machine
        if "nvrtc" not in str(exc).lower():
            raise
        pytest.skip(f"NVRTC unavailable: {exc}")
    assert all(blob[:4] == b"\x7fELF" for blob in cubins)


def test_channels_last_decision_counts_the_pixels_of_1d_convs():
    """A model with only 1-D convs has conv pixels (N * L'), so an fp32 cuda build of a long input
    goes channels-last."""
    g = load_onnx(whisper_frontend(batch=4, length=3000))
    infer_shapes(g)
    assert conv_pixels(g) == [4 * 3000, 4 * 1500]
    assert BuilderConfig().channels_last_for("cuda", conv_pixels(g))
    small = load_onnx(whisper_frontend(batch=1, length=31))
    infer_shapes(small)
    assert conv_pixels(small) == [31, 16] and FP32_NHWC_PIXELS > 31
    assert not BuilderConfig().channels_last_for("cuda", conv_pixels(small))

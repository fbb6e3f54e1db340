"""Builds with BuilderConfig.channels_last: the cpu target runs NHWC plans with the outputs of NCHW ones."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.plan.file import Plan
from polykit.runtime.engine import Runtime

from tests.conv_models import convnext, mobilenet, resnet

DATA = Path(__file__).resolve().parents[1] / "data" / "torch"
MODELS = {"resnet50_like": lambda: resnet(), "convnet_ts": lambda: str(DATA / "convnet_ts.onnx"),
          "convnet_dynamo": lambda: str(DATA / "convnet_dynamo.onnx")}


def _kinds(plan: Plan) -> Counter:
    return Counter(layer.kind for layer in plan.layers)


def _reformats(plan: Plan) -> int:
    """Layers that change the layout: Transposes, and Reformats (an entry's Transpose with its Cast and Pad)."""
    kinds = _kinds(plan)
    return kinds["Transpose"] + kinds["Reformat"]


def _run(plan: Plan, image: np.ndarray) -> np.ndarray:
    return Runtime().deserialize_engine(plan).create_execution_context().execute({"image": image})["logits"]


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("fp16", [False, True])
def test_cpu_plans_with_and_without_channels_last_compute_the_same(model, fp16):
    image = np.random.default_rng(7).standard_normal((2, 3, 32, 32)).astype(np.float32)
    nhwc = build_plan(MODELS[model](), BuilderConfig(target="cpu", fp16=fp16, channels_last=True))
    nchw = build_plan(MODELS[model](), BuilderConfig(target="cpu", fp16=fp16, channels_last=False))
    assert _kinds(nhwc)["ConvNHWC"] and not _kinds(nhwc)["Conv"] and not _kinds(nchw)["ConvNHWC"]
    assert _reformats(nhwc) == 1
    tol = {"rtol": 2e-3, "atol": 2e-3} if fp16 else {"rtol": 1e-5, "atol": 1e-6}
    np.testing.assert_allclose(_run(nhwc, image), _run(nchw, image), **tol)


def test_nhwc_plan_round_trips_through_bytes_and_runs_the_same():
    plan = build_plan(resnet(depths=(1, 1)), BuilderConfig(target="cpu", channels_last=True))
    image = np.random.default_rng(1).standard_normal((2, 3, 32, 32)).astype(np.float32)
    np.testing.assert_array_equal(_run(Plan.deserialize(plan.serialize()), image), _run(plan, image))
    assert plan.metadata["builder_config"]["channels_last"] is True


@pytest.mark.parametrize("target,fp16,setting,expected", [
    ("cuda", True, None, True), ("cuda", False, None, False), ("cpu", True, None, False),
    ("cuda", True, False, False), ("cpu", False, True, True)])
def test_channels_last_auto_is_on_for_fp16_cuda_builds_only(target, fp16, setting, expected):
    assert BuilderConfig(fp16=fp16, channels_last=setting).channels_last_for(target) is expected


def test_channels_last_auto_for_fp32_cuda_builds_follows_the_convolution_sizes():
    """fp32 cuda builds go channels-last (the 3xTF32 tensor-core convolutions) when the median
    convolution output is large; small ones keep the NCHW kernels."""
    from polykit.compiler.builder.builder import conv_pixels
    from polykit.compiler.builder.config import FP32_NHWC_PIXELS
    from polykit.compiler.graph.infer import infer_shapes
    from polykit.compiler.graph.onnx_import import load_onnx

    cfg = BuilderConfig()
    assert cfg.channels_last_for("cuda", [FP32_NHWC_PIXELS] * 3 + [1])
    assert not cfg.channels_last_for("cuda", [FP32_NHWC_PIXELS - 1] * 3 + [10**6])
    assert not cfg.channels_last_for("cuda", []) and not cfg.channels_last_for("cpu", [10**6])
    assert not BuilderConfig(channels_last=False).channels_last_for("cuda", [10**6])
    g = load_onnx(resnet(depths=(1, 1)))
    infer_shapes(g)
    pixels = conv_pixels(g)
    assert pixels and all(p > 0 for p in pixels)


def test_channels_last_auto_is_on_for_tf32_cuda_builds():
    assert BuilderConfig(tf32=True).channels_last_for("cuda") and not BuilderConfig(tf32=True).channels_last_for("cpu")


@pytest.mark.gpu
def test_tf32_cuda_plan_runs_convs_on_the_sm90_tensor_cores_close_to_fp32():
    from tests.kernels.cuda import on_sm90

    if not on_sm90():
        pytest.skip("needs a compute capability 9.0 GPU")
    image = np.random.default_rng(3).standard_normal((2, 3, 32, 32)).astype(np.float32)
    model = resnet()
    tf32 = build_plan(model, BuilderConfig(target="cuda", tf32=True))
    exact = build_plan(model, BuilderConfig(target="cpu"))
    tactics = Counter(layer.tactic for layer in tf32.layers if layer.kind == "ConvNHWC")
    assert sum(n for t, n in tactics.items() if t.startswith("cuda.conv_nhwc.sm90_")) >= sum(tactics.values()) // 2
    got, want = _run(tf32, image), _run(exact, image)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 5e-3


def test_config_json_keeps_the_channels_last_setting():
    for setting in (None, True, False):
        cfg = BuilderConfig(channels_last=setting)
        assert BuilderConfig.from_json(cfg.to_json()) == cfg


def test_fp16_cuda_plan_runs_convs_and_pools_on_the_nhwc_tactics_without_a_gpu():
    plan = build_plan(resnet(), BuilderConfig(target="cuda", fp16=True))
    tactics = Counter((layer.kind, layer.tactic) for layer in plan.layers)
    assert tactics[("ConvNHWC", "cuda.conv_nhwc.igemm_mma")] == 53
    assert tactics[("MaxPoolNHWC", "cuda.pool_nhwc.window")] == 1
    assert _reformats(plan) == 1


def test_fp32_cuda_plan_with_channels_last_uses_the_simt_tactic():
    plan = build_plan(resnet(depths=(1,)), BuilderConfig(target="cuda", channels_last=True))
    assert {layer.tactic for layer in plan.layers if layer.kind == "ConvNHWC"} == {"cuda.conv_nhwc.igemm_simt"}


def test_channels_last_auto_is_on_for_cuda_builds_with_int8_layers():
    assert BuilderConfig(int8=True).channels_last_for("cuda") and not BuilderConfig(int8=True).channels_last_for("cpu")
    assert BuilderConfig().channels_last_for("cuda", int8_layers=True)  # a model's own Q/DQ fold
    assert not BuilderConfig(channels_last=False).channels_last_for("cuda", int8_layers=True)


#: models with depthwise convs, and a ResNeXt-shaped one (2, 4, 8 and 16 channels a group)
GROUPED_MODELS = {"mobilenet": mobilenet, "convnext": convnext,
                  "resnext": lambda: resnet(depths=(1, 1, 1, 1), groups=4)}


def _grouped_model():
    """image [2, 8, 9, 9] -> Conv 3x3 group 4 (2 channels a group) -> Relu -> depthwise 3x3 -> logits."""
    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in (("w1", (8, 2, 3, 3)), ("w2", (8, 1, 3, 3)))]
    nodes = [helper.make_node("Conv", ["image", "w1"], ["c1"], group=4, pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["logits"], group=8, pads=[1, 1, 1, 1], strides=[2, 2])]
    g = helper.make_graph(nodes, "grouped", [helper.make_tensor_value_info("image", TensorProto.FLOAT, [2, 8, 9, 9])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [2, 8, 5, 5])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("model", sorted(GROUPED_MODELS))
@pytest.mark.parametrize("fp16", [False, True])
def test_cpu_plans_of_grouped_models_with_and_without_channels_last_compute_the_same(model, fp16):
    image = np.random.default_rng(7).standard_normal((2, 3, 32, 32)).astype(np.float32)
    nhwc = build_plan(GROUPED_MODELS[model](), BuilderConfig(target="cpu", fp16=fp16, channels_last=True))
    nchw = build_plan(GROUPED_MODELS[model](), BuilderConfig(target="cpu", fp16=fp16, channels_last=False))
    assert not _kinds(nhwc)["Conv"] and any(int(layer.attrs.get("group", 1)) > 1 for layer in nhwc.layers
                                            if layer.kind == "ConvNHWC")
    tol = {"rtol": 2e-3, "atol": 2e-3} if fp16 else {"rtol": 1e-5, "atol": 1e-6}
    np.testing.assert_allclose(_run(nhwc, image), _run(nchw, image), **tol)


def test_cpu_and_cuda_plans_run_grouped_convs_channels_last():
    """The grouped conv (2 channels a group) goes NHWC on the cpu and on cuda, where the grouped
    tactic runs it next to the depthwise one, between the entry and exit Transposes only."""
    image = np.random.default_rng(4).standard_normal((2, 8, 9, 9)).astype(np.float32)
    nhwc = build_plan(_grouped_model(), BuilderConfig(target="cpu", channels_last=True))
    assert sorted(int(layer.attrs["group"]) for layer in nhwc.layers if layer.kind == "ConvNHWC") == [4, 8]
    nchw = build_plan(_grouped_model(), BuilderConfig(target="cpu", channels_last=False))
    np.testing.assert_allclose(_run(nhwc, image), _run(nchw, image), rtol=1e-5, atol=1e-5)
    for config in (BuilderConfig(target="cuda", fp16=True), BuilderConfig(target="cuda", bf16=True),
                   BuilderConfig(target="cuda", channels_last=True)):
        cuda = build_plan(_grouped_model(), config)
        assert [(layer.kind, int(layer.attrs["group"]), layer.tactic.rsplit("_", 1)[0]) for layer in cuda.layers
                if "Conv" in layer.kind] == [("ConvNHWC", 4, "cuda.conv_nhwc.grouped"),
                                             ("ConvNHWC", 8, "cuda.conv_nhwc.depthwise")]
        assert _reformats(cuda) == 2


@pytest.mark.parametrize("model,depthwise", [("mobilenet", 5), ("convnext", 3)])
def test_fp16_cuda_plan_runs_depthwise_convs_on_the_depthwise_tactics_without_a_gpu(model, depthwise):
    plan = build_plan(GROUPED_MODELS[model](), BuilderConfig(target="cuda", fp16=True))
    tactics = [layer.tactic for layer in plan.layers if layer.kind == "ConvNHWC" and int(layer.attrs["group"]) > 1]
    assert len(tactics) == depthwise and all(t.startswith("cuda.conv_nhwc.depthwise_p") for t in tactics)
    assert not _kinds(plan)["Conv"] and _reformats(plan) == 1


def test_fp16_cuda_plan_runs_grouped_convs_on_the_grouped_tactics_without_a_gpu():
    plan = build_plan(GROUPED_MODELS["resnext"](), BuilderConfig(target="cuda", fp16=True))
    grouped = [layer for layer in plan.layers if layer.kind == "ConvNHWC" and int(layer.attrs["group"]) > 1]
    assert len(grouped) == 4 and all(layer.tactic.startswith("cuda.conv_nhwc.grouped_") for layer in grouped)
    assert not _kinds(plan)["Conv"] and _reformats(plan) == 1


@pytest.mark.gpu
@pytest.mark.parametrize("model", sorted(GROUPED_MODELS))
def test_fp16_cuda_plans_of_grouped_models_match_the_cpu(model):
    image = np.random.default_rng(3).standard_normal((2, 3, 32, 32)).astype(np.float32)
    cuda = build_plan(GROUPED_MODELS[model](), BuilderConfig(target="cuda", fp16=True))
    exact = build_plan(GROUPED_MODELS[model](), BuilderConfig(target="cpu"))
    got, want = _run(cuda, image), _run(exact, image)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2

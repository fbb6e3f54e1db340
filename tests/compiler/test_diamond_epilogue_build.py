"""Builds of a small convnet whose activations are exported as diamonds (SiLU as Mul(x, Sigmoid(x)),
HardSwish as x * Clip(x + 3, 0, 6) / 6): each one lands in its convolution's epilogue, in the
cuda fp16 plan (builder level 0, off-GPU) and the cpu plan, and the cpu plan computes what
onnxruntime does."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.runtime.engine import Runtime

from tests.compiler.layout_models import _model
from tests.conv_models import ModelBuilder

IMAGE = (2, 3, 11, 9)


def _hardswish(b: ModelBuilder, x: str) -> str:
    three, zero, six = (b.init(np.array(v), "c") for v in (3.0, 0.0, 6.0))
    return b.node("Div", [b.node("Mul", [x, b.node("Clip", [b.node("Add", [x, three]), zero, six])]), six])


def diamond_convnet() -> onnx.ModelProto:
    """conv 3x3 + BN + SiLU -> depthwise 3x3 + BN + SiLU -> 1x1 + BN + HardSwish (diamond) + residual."""
    b = ModelBuilder(11)
    x = b.conv_bn("image", 3, 12, 3, relu=False)
    x = b.node("Mul", [x, b.node("Sigmoid", [x])])
    y = b.conv_bn(x, 12, 12, 3, relu=False, group=12)
    y = b.node("Mul", [b.node("Sigmoid", [y]), y])
    y = _hardswish(b, b.conv_bn(y, 12, 12, 1, relu=False))
    return _model(b, b.node("Add", [y, x]), (IMAGE[0], 12) + IMAGE[2:], image=IMAGE)


def _epilogues(plan) -> list[list[str]]:
    return [[s["op"] for s in layer.attrs["epilogue"]["body"]] for layer in plan.layers if layer.attrs.get("epilogue")]


def test_cuda_fp16_plan_takes_the_diamond_activations_into_conv_epilogues():
    plan = build_plan(diamond_convnet(), BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0))
    assert sorted(_epilogues(plan)) == [["Add", "Clip", "Mul", "Div", "Add"], ["Sigmoid", "Mul"], ["Sigmoid", "Mul"]]
    assert not {"Pointwise", "Sigmoid", "Mul", "Clip"} & {layer.kind for layer in plan.layers}
    convs = [layer for layer in plan.layers if layer.attrs.get("epilogue")]
    assert all(layer.kind == "ConvNHWC" for layer in convs)


@pytest.mark.parametrize("fp16", [False, True])
def test_cpu_plan_with_diamond_epilogues_matches_onnxruntime(fp16):
    model = diamond_convnet()
    image = np.random.default_rng(2).standard_normal(IMAGE).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"image": image})[0]
    plan = build_plan(model, BuilderConfig(target="cpu", fp16=fp16))
    assert len(_epilogues(plan)) == 3 and "Pointwise" not in {layer.kind for layer in plan.layers}
    got = Runtime().deserialize_engine(plan).create_execution_context().execute({"image": image})["y"]
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < (5e-3 if fp16 else 1e-5)


@pytest.mark.gpu
def test_cuda_fp16_plan_with_diamond_epilogues_matches_the_cpu():
    model = diamond_convnet()
    image = np.random.default_rng(3).standard_normal(IMAGE).astype(np.float32)

    def run(plan):
        return Runtime().deserialize_engine(plan).create_execution_context().execute({"image": image})["y"]

    got = run(build_plan(model, BuilderConfig(target="cuda", fp16=True)))
    want = run(build_plan(model, BuilderConfig(target="cpu")))
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2

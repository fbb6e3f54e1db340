"""Channels-last builds of convnets whose squeeze-excitation, unfolded BatchNormalization, Concat,
pools, Resize, Pad, Slice and Split sit between convolutions (tests/compiler/layout_models.py):
the cpu plan computes what onnxruntime does, the cuda fp16 plan has reformats only at entry and exit."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnxruntime as ort
import pytest

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.runtime.engine import Runtime

from tests.compiler.layout_models import MODELS, TRANSPOSES_KEPT


def _image(model) -> np.ndarray:
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return np.random.default_rng(4).standard_normal(shape).astype(np.float32)


def _run(plan, image: np.ndarray) -> np.ndarray:
    return Runtime().deserialize_engine(plan).create_execution_context().execute({"image": image})["y"]


@pytest.mark.parametrize("fp16", [False, True])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_cpu_channels_last_plan_matches_onnxruntime(name, fp16):
    model = MODELS[name]()
    image = _image(model)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"image": image})[0]
    plan = build_plan(model, BuilderConfig(target="cpu", fp16=fp16, channels_last=True))
    kinds = Counter(layer.kind for layer in plan.layers)
    assert kinds["Transpose"] + kinds["Reformat"] == TRANSPOSES_KEPT.get(name, 1)  # the entry: one Reformat
    got = _run(plan, image)
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < (5e-3 if fp16 else 1e-5)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_cuda_fp16_plan_reformats_only_at_entry_and_exit(name):
    plan = build_plan(MODELS[name](), BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0))
    kinds = Counter(layer.kind for layer in plan.layers)
    assert kinds["Transpose"] + kinds["Reformat"] == TRANSPOSES_KEPT.get(name, 1)
    assert not {"Conv", "BatchNormalization", "MaxPool", "AveragePool", "GlobalAveragePool"} & set(kinds)
    assert kinds["Cast"] <= 1  # the image's Cast, Transpose and channel Pad are one Reformat (the exit's Cast stays)
    entry = next(layer for layer in plan.layers if layer.kind in ("Transpose", "Reformat"))
    assert entry.kind == "Reformat" and entry.in_dtypes[0] == "float32" and entry.out_dtypes[0] == "float16"
    assert entry.attrs["perm"] == [0, 2, 3, 1]


def test_cuda_plan_runs_the_layout_free_layers_on_the_last_axis_with_existing_tactics():
    """The layers plan_layouts moves to NHWC keep tactics the cuda target already has: Concat on
    the last axis (cuda.movement.strided; the dense block's, read only by BatchNorm + ReLU, are
    absorbed into those Pointwise layers on the last axis), the squeeze's ReduceMean over axes 1, 2
    (cuda.reduce.span), the scale broadcast over H and W (a Pointwise or the conv epilogue)."""
    dense = build_plan(MODELS["dense_block"](), BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0))
    assert not [layer for layer in dense.layers if layer.kind == "Concat"]
    absorbed = [e for layer in dense.layers for e in layer.attrs.get("concat", ())]
    assert absorbed and all(e["axis"] == 3 for e in absorbed)
    inception = build_plan(MODELS["inception"](), BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0))
    concats = [layer for layer in inception.layers if layer.kind == "Concat"]
    assert concats and all(layer.attrs["axis"] == 3 and layer.tactic == "cuda.movement.strided" for layer in concats)
    se = build_plan(MODELS["squeeze_excitation"](), BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0))
    means = [layer for layer in se.layers if layer.kind == "ReduceMean"]
    assert means and all(layer.tactic == "cuda.reduce.span" for layer in means)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(MODELS))
def test_cuda_fp16_channels_last_plan_matches_the_cpu(name):
    """On the device: the NHWC layers plan_layouts makes (Concat / Split / Slice / Gather on the last axis,
    Resize and Pad of axes 1 and 2, the squeeze's ReduceMean over axes 1 and 2, the gate broadcast
    over H and W, BatchNormalization as a last-axis scale and shift, the NHWC pools after a Concat)
    compute what the cpu's NCHW plan does."""
    model = MODELS[name]()
    image = _image(model)
    got = _run(build_plan(model, BuilderConfig(target="cuda", fp16=True)), image)
    want = _run(build_plan(model, BuilderConfig(target="cpu", channels_last=False)), image)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2

"""fp16 builds of the torch exports on cpu: float16 weights, half-size plans, onnxruntime fp32 agreement.

Recorded errors (relative L2 / max abs vs onnxruntime fp32, seed 11, batch 2): convnet 3.5e-4 / 1.3e-4,
BERT 6.9e-4 / 4.2e-3, GPT-2 6.4e-4 / 2.8e-3, ViT 6.1e-4 / 3.4e-3 (outputs of magnitude ~3.5).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.runtime.engine import Runtime

DATA = Path(__file__).resolve().parents[2] / "data" / "torch"
MODELS = ["convnet_ts", "bert_tiny_dynamo", "gpt2_tiny_ts", "vit_tiny_ts"]


def _setup(model):
    ort = pytest.importorskip("onnxruntime")
    path = DATA / f"{model}.onnx"
    if not path.is_file():
        pytest.skip(f"{path} is missing")
    session = ort.InferenceSession(str(path))
    shapes = {i.name: tuple(d if isinstance(d, int) else 2 for d in i.shape) for i in session.get_inputs()}
    rng = np.random.default_rng(11)
    feeds = {i.name: rng.standard_normal(shapes[i.name]).astype(np.float32) if i.type == "tensor(float)"
             else rng.integers(0, 50, shapes[i.name]).astype(np.int64) for i in session.get_inputs()}
    return path, session, shapes, feeds


@pytest.mark.parametrize("model", MODELS)
def test_fp16_build_on_cpu_matches_onnxruntime_fp32_within_half_tolerance(model):
    path, session, shapes, feeds = _setup(model)
    plan = build_plan(str(path), BuilderConfig(target="cpu", input_shapes=shapes, fp16=True))
    out = Runtime().deserialize_engine(plan.serialize()).create_execution_context().execute(feeds)
    for name, want in zip([o.name for o in session.get_outputs()], session.run(None, feeds)):
        got = out[name]
        assert got.dtype == np.float32
        rel = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert rel < 2e-3, (name, rel)
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=1.5e-2, err_msg=name)


@pytest.mark.parametrize("model", MODELS)
def test_fp16_plan_stores_half_weights_and_is_about_half_the_size(model):
    path, _, shapes, _ = _setup(model)
    p32 = build_plan(str(path), BuilderConfig(target="cpu", input_shapes=shapes))
    p16 = build_plan(str(path), BuilderConfig(target="cpu", input_shapes=shapes, fp16=True))
    assert {p16.tensors[n].dtype for n in p16.weights} - {"int64", "bool"} == {"float16"}
    assert len(p16.serialize()) < 0.6 * len(p32.serialize())
    assert any(layer.precision == "fp16" for layer in p16.layers)
    assert all(p16.tensors[n].dtype == "float32" for n in p16.inputs + p16.outputs if p32.tensors[n].dtype == "float32")


def test_fp32_layers_stay_float32_in_a_plan():
    path, _, shapes, _ = _setup("convnet_ts")
    plan = build_plan(str(path), BuilderConfig(target="cpu", input_shapes=shapes, fp16=True, fp32_layers=("Conv",)))
    convs = [layer for layer in plan.layers if layer.kind == "Conv"]
    assert convs and all(layer.precision == "fp32" for layer in convs)
    assert all(plan.tensors[layer.inputs[1]].dtype == "float32" for layer in convs)
    assert BuilderConfig.from_json(plan.metadata["builder_config"]).fp32_layers == ("Conv",)

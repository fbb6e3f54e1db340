"""Models prepared by onnxruntime's transformer optimizer (com.microsoft Attention, SkipLayerNormalization,
BiasGelu, FastGelu: ops/models/attention_ms.py, ops/nn/contrib_ms.py): a tiny BERT and a tiny GPT-2 in
the form HF's TorchScript exports take, optimized in the test; polykit's cpu plan of the optimized file
matches onnxruntime on it (and on the unoptimized file), and the cuda fp16 plan (level 0, no GPU
needed) runs every attention layer on the flash kernels, with no more layers than the unoptimized
file's plan but the optimizer's mask_index reduction."""

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.runtime.engine import Runtime

from .ms_optimized_models import optimize, tiny_bert, tiny_gpt2
from .ops.ms_contrib_kit import ort, polykit_cpu

pytest.importorskip("onnxruntime.transformers.optimizer")

B, S, HIDDEN, HEADS = 2, 16, 128, 2
MASKS = {"none": np.ones((B, S), np.int64),
         "padding": np.array([[1] * S, [1] * 9 + [0] * (S - 9)], np.int64)}


def _optimized(kind: str):
    build = tiny_bert if kind == "bert" else tiny_gpt2
    model = build(batch=B, seq=S, hidden=HIDDEN, heads=HEADS)
    optimized = optimize(model, kind, HEADS, HIDDEN)
    ops = Counter(n.op_type for n in optimized.graph.node if n.domain == "com.microsoft")
    if not ops.get("Attention"):
        pytest.skip(f"this onnxruntime's optimizer fuses no Attention in the {kind} block ({dict(ops)})")
    return model, optimized, ops


def _feeds(kind: str, mask: str = "padding", seed: int = 0) -> dict:
    feeds = {"embeddings": np.random.default_rng(seed).standard_normal((B, S, HIDDEN)).astype(np.float32)}
    if kind == "bert":
        feeds["attention_mask"] = MASKS[mask]
    return feeds


@pytest.mark.parametrize("mask", sorted(MASKS))
def test_optimized_tiny_bert_runs_on_the_cpu_target_as_onnxruntime_does(mask):
    model, optimized, ops = _optimized("bert")
    assert ops == {"Attention": 2, "SkipLayerNormalization": 4, "BiasGelu": 2}
    feeds = _feeds("bert", mask)
    got = polykit_cpu(optimized, feeds)["last_hidden_state"]
    np.testing.assert_allclose(got, ort(optimized, feeds)["last_hidden_state"], atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(got, ort(model, feeds)["last_hidden_state"], atol=2e-5, rtol=1e-4)


def test_optimized_tiny_gpt2_runs_on_the_cpu_target_as_onnxruntime_does():
    model, optimized, ops = _optimized("gpt2")
    assert ops == {"Attention": 2, "SkipLayerNormalization": 4, "FastGelu": 2}
    assert all(any(a.name == "unidirectional" and a.i == 1 for a in n.attribute)
               for n in optimized.graph.node if n.op_type == "Attention")
    feeds = _feeds("gpt2")
    got = polykit_cpu(optimized, feeds)["last_hidden_state"]
    np.testing.assert_allclose(got, ort(optimized, feeds)["last_hidden_state"], atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(got, ort(model, feeds)["last_hidden_state"], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", ["bert", "gpt2"])
def test_cuda_fp16_plan_of_the_optimized_model_runs_attention_on_the_flash_kernels(kind):
    model, optimized, _ = _optimized(kind)
    config = BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0)
    fused, plain = build_plan(optimized, config), build_plan(model, config)
    tactics = Counter((layer.kind, layer.tactic) for layer in fused.layers)
    attention = {t: n for (k, t), n in tactics.items() if k == "Attention"}
    assert attention == {"cuda.attention.flash": 2}, tactics
    assert not {k for k, _ in tactics} & {"Softmax", "Split", "Transpose", "Gelu", "Add"}, tactics
    assert tactics[("LayerNormalization", "cuda.norm.warp")] == 5
    assert sum(n for (k, t), n in tactics.items() if k in ("MatMul", "Gemm")) == 8  # QKV, out, 2 FFN per layer
    extra = 1 if kind == "bert" else 0  # the optimizer's ReduceSum(attention_mask) that makes mask_index
    assert len(fused.layers) <= len(plain.layers) + extra, (Counter(layer.kind for layer in fused.layers),
                                                           Counter(layer.kind for layer in plain.layers))


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["bert", "gpt2"])
def test_optimized_model_on_cuda_fp16_matches_the_cpu_plan(kind):
    _, optimized, _ = _optimized(kind)
    feeds = _feeds(kind, seed=1)
    cuda = Runtime("cuda").deserialize_engine(build_plan(optimized, BuilderConfig(target="cuda", fp16=True)))
    got = cuda.create_execution_context().execute(feeds)["last_hidden_state"]
    want = polykit_cpu(optimized, feeds)["last_hidden_state"]
    assert np.abs(got.astype(np.float32) - want).max() < 3e-2 * max(1.0, np.abs(want).max())


TORCH_EXPORTS = Path(__file__).resolve().parent.parent / "data" / "torch"


@pytest.mark.parametrize("name,kind", [("bert_tiny_ts", "bert"), ("gpt2_tiny_ts", "gpt2"), ("vit_tiny_ts", "vit")])
def test_optimized_torchscript_exports_run_on_the_cpu_target_as_onnxruntime_does(name, kind):
    """HF's TorchScript exports (tests/data/make_torch_models.py: SDPA attention, 2 layers, hidden 64,
    2 heads) come out of the optimizer with SkipLayerNormalization and BiasGelu / FastGelu, their
    attention unfused and no EmbedLayerNormalization (the optimizer leaves the embeddings' Gathers alone)."""
    optimized = optimize(onnx.load(str(TORCH_EXPORTS / f"{name}.onnx")), kind, 2, 64)
    ops = Counter(n.op_type for n in optimized.graph.node if n.domain == "com.microsoft")
    assert ops["SkipLayerNormalization"] == 4 and "EmbedLayerNormalization" not in ops, ops
    rng = np.random.default_rng(4)
    if kind == "vit":
        feeds = {"pixel_values": rng.standard_normal((2, 3, 32, 32)).astype(np.float32)}
    else:
        feeds = {"input_ids": rng.integers(0, 100, (2, 16)).astype(np.int64),
                 "attention_mask": np.array([[1] * 16, [1] * 11 + [0] * 5], np.int64)}
    want = ort(optimized, feeds)
    got = polykit_cpu(optimized, feeds)
    for out in want:
        np.testing.assert_allclose(got[out], want[out], atol=2e-5, rtol=1e-4, err_msg=out)


def test_optimized_tiny_bert_with_dynamic_batch_and_length_runs_every_shape_of_its_profile():
    """The lowering reads the sequence length at run time (Shape -> Range for the [B] lengths mask):
    one plan serves every (batch, length) of the profile."""
    from polykit.compiler.plan.profiles import Profile

    model = tiny_bert(batch=B, seq=S, hidden=HIDDEN, heads=HEADS)
    for value in list(model.graph.input) + list(model.graph.output):
        dims = value.type.tensor_type.shape.dim
        dims[0].dim_param, dims[1].dim_param = "batch", "length"
    optimized = optimize(model, "bert", HEADS, HIDDEN)
    if not any(n.op_type == "Attention" for n in optimized.graph.node):
        pytest.skip("this onnxruntime's optimizer fuses no Attention in the dynamic bert block")
    profile = Profile({"embeddings": ((1, 1, HIDDEN), (2, 16, HIDDEN), (3, 32, HIDDEN)),
                       "attention_mask": ((1, 1), (2, 16), (3, 32))})
    ctx = Runtime("cpu").deserialize_engine(build_plan(optimized, BuilderConfig(target="cpu", profiles=[profile]))) \
        .create_execution_context()
    for batch, length in ((1, 5), (3, 11), (2, 32)):
        rng = np.random.default_rng(batch * length)
        feeds = {"embeddings": rng.standard_normal((batch, length, HIDDEN)).astype(np.float32),
                 "attention_mask": (np.arange(length)[None] < rng.integers(1, length + 1, (batch, 1))).astype(np.int64)}
        np.testing.assert_allclose(ctx.execute(feeds)["last_hidden_state"], ort(optimized, feeds)["last_hidden_state"],
                                   atol=5e-5, rtol=1e-4)

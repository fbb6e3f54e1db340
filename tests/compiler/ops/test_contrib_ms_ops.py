"""onnxruntime's com.microsoft norm, activation and embedding ops (ops/nn/contrib_ms.py): polykit's cpu plan
of the lowered graph matches onnxruntime's own contrib kernels on random data and odd shapes."""

import numpy as np
import pytest

from polykit.errors import NodeAttributeError

from .ms_contrib_kit import F32, MS, assert_matches_onnxruntime, helper, model, polykit_cpu, rand

SHAPES = [(1, 1, 7), (2, 5, 12), (3, 13, 33)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("beta,bias", [(True, True), (True, False), (False, True), (False, False)])
def test_skip_layer_normalization_matches_onnxruntime(shape, beta, bias):
    rng = np.random.default_rng(sum(shape))
    c = shape[-1]
    inits = [("gamma", rand(rng, c)), ("beta", rand(rng, c)), ("bias", rand(rng, c))]
    names = ["x", "skip", "gamma", "beta" if beta else "", "bias" if bias else ""]
    node = helper.make_node("SkipLayerNormalization", names, ["y"], domain=MS, epsilon=1e-5)
    m = model([node], [("x", F32, shape), ("skip", F32, shape)], [("y", F32, shape)], inits)
    assert_matches_onnxruntime(m, {"x": rand(rng, *shape, scale=3.0), "skip": rand(rng, *shape)})


def test_skip_layer_normalization_statistics_and_sum_outputs_match_onnxruntime():
    rng = np.random.default_rng(1)
    shape = (2, 3, 10)
    node = helper.make_node("SkipLayerNormalization", ["x", "skip", "gamma", "beta", "bias"],
                            ["y", "mean", "inv_std", "sum"], domain=MS, epsilon=1e-6)
    stats = [2, 3, 1]
    m = model([node], [("x", F32, shape), ("skip", F32, shape)],
              [("y", F32, shape), ("mean", F32, stats), ("inv_std", F32, stats), ("sum", F32, shape)],
              [("gamma", rand(rng, 10)), ("beta", rand(rng, 10)), ("bias", rand(rng, 10))])
    assert_matches_onnxruntime(m, {"x": rand(rng, *shape), "skip": rand(rng, *shape)})


def test_skip_of_one_row_broadcasts_over_the_batch_as_in_onnxruntime():
    rng = np.random.default_rng(2)
    node = helper.make_node("SkipLayerNormalization", ["x", "skip", "gamma"], ["y"], domain=MS)
    m = model([node], [("x", F32, [3, 4, 8]), ("skip", F32, [4, 8])], [("y", F32, [3, 4, 8])],
              [("gamma", rand(rng, 8))])
    assert_matches_onnxruntime(m, {"x": rand(rng, 3, 4, 8), "skip": rand(rng, 4, 8)})


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("bias", [True, False])
def test_skip_simplified_layer_normalization_matches_onnxruntime(shape, bias):
    rng = np.random.default_rng(len(shape) + shape[-1])
    c = shape[-1]
    node = helper.make_node("SkipSimplifiedLayerNormalization", ["x", "skip", "gamma"] + (["bias"] if bias else []),
                            ["y", "", "", "sum"], domain=MS, epsilon=1e-6)
    m = model([node], [("x", F32, shape), ("skip", F32, shape)], [("y", F32, shape), ("sum", F32, shape)],
              [("gamma", rand(rng, c)), ("bias", rand(rng, c))][: 2 if bias else 1])
    assert_matches_onnxruntime(m, {"x": rand(rng, *shape, scale=2.0), "skip": rand(rng, *shape)})


def test_skip_simplified_layer_normalization_statistics_are_refused_by_name():
    node = helper.make_node("SkipSimplifiedLayerNormalization", ["x", "skip", "gamma"], ["y", "", "inv"], domain=MS)
    m = model([node], [("x", F32, [1, 2, 4]), ("skip", F32, [1, 2, 4])], [("y", F32, [1, 2, 4]), ("inv", F32, [1, 2, 1])],
              [("gamma", np.ones(4, np.float32))])
    with pytest.raises(NodeAttributeError, match="SkipSimplifiedLayerNormalization: output 2 \\(inv_std_var\\)"):
        polykit_cpu(m, {"x": np.ones((1, 2, 4), np.float32), "skip": np.ones((1, 2, 4), np.float32)})


@pytest.mark.parametrize("op,with_bias", [("Gelu", False), ("BiasGelu", True), ("FastGelu", True), ("FastGelu", False)])
@pytest.mark.parametrize("shape", SHAPES)
def test_gelu_forms_match_onnxruntime(op, with_bias, shape):
    rng = np.random.default_rng(shape[-1])
    node = helper.make_node(op, ["x"] + (["b"] if with_bias else []), ["y"], domain=MS)
    m = model([node], [("x", F32, shape)], [("y", F32, shape)], [("b", rand(rng, shape[-1]))] if with_bias else [])
    assert_matches_onnxruntime(m, {"x": rand(rng, *shape, scale=3.0)}, atol=1e-5)


@pytest.mark.parametrize("alpha", [None, 1.0, -0.5])
def test_quick_gelu_matches_onnxruntime(alpha):
    rng = np.random.default_rng(5)
    node = helper.make_node("QuickGelu", ["x"], ["y"], domain=MS, **({} if alpha is None else {"alpha": alpha}))
    m = model([node], [("x", F32, [2, 9, 11])], [("y", F32, [2, 9, 11])])
    assert_matches_onnxruntime(m, {"x": rand(rng, 2, 9, 11, scale=4.0)})


def test_bias_add_is_the_sum_of_its_three_inputs():
    """onnxruntime has BiasAdd on its CUDA EP only (the optimizer emits it for UNets, not for BERT or
    GPT-2); its definition, Y = X + bias + skip, is the check."""
    rng = np.random.default_rng(6)
    node = helper.make_node("BiasAdd", ["x", "bias", "skip"], ["y"], domain=MS)
    shape = [2, 7, 320]
    bias = rand(rng, 320)
    m = model([node], [("x", F32, shape), ("skip", F32, shape)], [("y", F32, shape)], [("bias", bias)])
    x, skip = rand(rng, *shape), rand(rng, *shape)
    np.testing.assert_allclose(polykit_cpu(m, {"x": x, "skip": skip})["y"], x + bias + skip, rtol=1e-6, atol=1e-6)


def _embed(B, S, H, *, segments=True, mask=True, position_ids=None, outputs=("y", "mask_index"), seed=0):
    rng = np.random.default_rng(seed)
    vocab, positions, types = 23, S + 3, 2
    names = ["ids", "seg" if segments else "", "word", "pos", "segemb" if segments else "", "gamma", "beta",
             "mask" if mask else ""]
    ins = [("ids", np.int32, [B, S])] + ([("seg", np.int32, [B, S])] if segments else []) + \
          ([("mask", np.int32, [B, S])] if mask else [])
    feeds = {"ids": rng.integers(0, vocab, (B, S)).astype(np.int32)}
    if segments:
        feeds["seg"] = rng.integers(0, types, (B, S)).astype(np.int32)
    if mask:
        feeds["mask"] = (np.arange(S)[None] < rng.integers(0, S + 1, (B, 1))).astype(np.int32)
    if position_ids is not None:
        names.append("posids")
        ins.append(("posids", np.int32, list(position_ids.shape)))
        feeds["posids"] = position_ids
    inits = [("word", rand(rng, vocab, H)), ("pos", rand(rng, positions, H)), ("segemb", rand(rng, types, H)),
             ("gamma", rand(rng, H)), ("beta", rand(rng, H))]
    out_info = {"y": (F32, [B, S, H]), "mask_index": (np.int32, [B]), "sum": (F32, [B, S, H])}
    node = helper.make_node("EmbedLayerNormalization", names, list(outputs), domain=MS, epsilon=1e-5)
    return model([node], ins, [(o,) + out_info[o] for o in node.output], inits), feeds


@pytest.mark.parametrize("B,S,H", [(1, 1, 4), (2, 7, 16), (3, 13, 33)])
@pytest.mark.parametrize("segments,mask", [(True, True), (False, True), (True, False)])
def test_embed_layer_normalization_matches_onnxruntime(B, S, H, segments, mask):
    assert_matches_onnxruntime(*_embed(B, S, H, segments=segments, mask=mask, seed=S))


def test_embed_layer_normalization_with_position_ids_and_the_embedding_sum_matches_onnxruntime():
    positions = np.array([[3, 1, 0, 2, 5]], np.int32)
    assert_matches_onnxruntime(*_embed(2, 5, 8, position_ids=positions, outputs=("y", "mask_index", "sum")))

"""onnxruntime's com.microsoft Attention and MultiHeadAttention (ops/models/attention_ms.py): lowered
at import to ai.polykit Attention; polykit's cpu plan matches onnxruntime's contrib kernels (CPU EP)
on random data, odd sizes and every mask form the lowering takes; the forms it does not take are
NodeAttributeErrors naming the op and the input or attribute."""

import numpy as np
import pytest

from polykit.errors import NodeAttributeError

from .ms_contrib_kit import F32, I32, MS, assert_matches_onnxruntime, helper, model, ort, polykit_cpu, rand


def _mask_and_bias(names, ins, feeds, mask, attention_bias, rng) -> None:
    """Wire the optional int mask (input 3 when given) and attention_bias (input 5) into a node's inputs."""
    if mask is not None:
        names.append("m")
        ins.append(("m", I32, list(mask.shape)))
        feeds["m"] = mask
    if attention_bias is not None:
        names += [""] * (5 - len(names)) + ["ab"]
        ins.append(("ab", F32, list(attention_bias)))
        feeds["ab"] = rand(rng, *attention_bias)


def _attention(B, S, C, N, *, mask=None, bias=True, attention_bias=None, sizes=None, seed=0, **attrs):
    """A com.microsoft Attention model and its feeds; `mask` an int array (its shape the form)."""
    rng = np.random.default_rng(seed)
    sizes = sizes or [C, C, C]
    inits = [("w", rand(rng, C, sum(sizes), scale=0.4))] + ([("b", rand(rng, sum(sizes), scale=0.4))] if bias else [])
    names, ins, feeds = ["x", "w", "b" if bias else ""], [("x", F32, [B, S, C])], {"x": rand(rng, B, S, C)}
    _mask_and_bias(names, ins, feeds, mask, attention_bias, rng)
    if sizes != [C, C, C]:
        attrs["qkv_hidden_sizes"] = sizes
    node = helper.make_node("Attention", names, ["y"], domain=MS, num_heads=N, **attrs)
    return model([node], ins, [("y", F32, [B, S, sizes[2]])], inits), feeds


@pytest.mark.parametrize("B,S,C,N", [(1, 1, 4, 1), (2, 5, 12, 3), (3, 7, 15, 5), (1, 17, 64, 4)])
def test_attention_without_a_mask_matches_onnxruntime(B, S, C, N):
    assert_matches_onnxruntime(*_attention(B, S, C, N, seed=S))


def test_attention_without_a_bias_input_matches_onnxruntime():
    assert_matches_onnxruntime(*_attention(2, 6, 8, 2, bias=False))


@pytest.mark.parametrize("lengths", [[3, 5], [5, 1], [0, 5]])
def test_mask_index_of_lengths_masks_the_keys_past_each_length(lengths):
    assert_matches_onnxruntime(*_attention(2, 5, 12, 3, mask=np.array(lengths, np.int32)))


def test_raw_key_padding_mask_matches_onnxruntime_including_a_fully_masked_row():
    mask = np.array([[1, 1, 0, 1, 0, 1, 1], [0, 0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0, 1]], np.int32)
    assert_matches_onnxruntime(*_attention(3, 7, 15, 5, mask=mask))


def test_raw_per_query_mask_matches_onnxruntime():
    mask = (np.random.default_rng(3).random((2, 6, 6)) > 0.4).astype(np.int32)
    assert_matches_onnxruntime(*_attention(2, 6, 12, 3, mask=mask))


@pytest.mark.parametrize("mask", [None, np.array([[1, 1, 0, 1, 0], [0, 0, 1, 1, 1]], np.int32), np.array([2, 4], np.int32)])
def test_unidirectional_attention_matches_onnxruntime_with_and_without_padding(mask):
    """GPT-2's form; left padding leaves the first rows with every key masked (padding adds -10000,
    the causal mask the lowest float: onnxruntime's numbers)."""
    assert_matches_onnxruntime(*_attention(2, 5, 12, 3, mask=mask, unidirectional=1))


@pytest.mark.parametrize("shape", [(1, 3, 5, 5), (2, 1, 5, 5), (2, 3, 5, 5)])
def test_attention_bias_adds_to_the_scores(shape):
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.int32)
    assert_matches_onnxruntime(*_attention(2, 5, 12, 3, mask=mask, attention_bias=shape))


def test_scale_mask_filter_value_and_qkv_hidden_sizes_match_onnxruntime():
    mask = np.array([[1, 0, 1, 1], [1, 1, 1, 0]], np.int32)
    assert_matches_onnxruntime(*_attention(2, 4, 10, 2, mask=mask, sizes=[8, 8, 6], scale=0.3, mask_filter_value=-50.0))


def test_attention_lowers_to_one_polykit_attention_over_one_projection():
    from polykit.compiler.graph.onnx_import import load_onnx

    m, _ = _attention(2, 5, 12, 3, mask=np.array([3, 5], np.int32), unidirectional=1)
    graph = load_onnx(m)
    ops = [(n.domain, n.op_type) for n in graph.nodes]
    assert ops.count(("ai.polykit", "Attention")) == 1 and ops.count(("", "MatMul")) == 1
    assert ops.count(("", "Split")) == 1 and not any(d == MS for d, _ in ops)


@pytest.mark.parametrize("edit,match", [
    (lambda n: n.input.extend(["x"]), "input 4 \\(past\\)"),
    (lambda n: n.output.append("present"), "output\\(s\\) \\['present'\\]"),
    (lambda n: n.attribute.append(helper.make_attribute("do_rotary", 1)), "attribute do_rotary"),
])
def test_past_state_and_rotary_are_refused_by_name(edit, match):
    m, feeds = _attention(1, 3, 4, 2, mask=np.array([3], np.int32))
    edit(m.graph.node[0])
    with pytest.raises(NodeAttributeError, match=f"com.microsoft Attention: {match}"):
        polykit_cpu(m, feeds)


@pytest.mark.parametrize("shape,match", [((1, 1, 3, 3), "4-D \\(Megatron\\) mask_index"),
                                         ((2,), "\\[2B\\] \\(end and start positions\\) mask_index")])
def test_mask_index_forms_it_does_not_take_are_refused_by_name(shape, match):
    m, feeds = _attention(1, 3, 4, 2, mask=np.ones(shape, np.int32))
    with pytest.raises(NodeAttributeError, match=match) as info:
        polykit_cpu(m, feeds)
    assert info.value.hint


def _mha(B, S, L, D, N, *, form="separate", bias=False, padding=None, attention_bias=None, seed=0, **attrs):
    rng = np.random.default_rng(seed)
    h = D // N
    feeds = {}
    if form == "packed_qkv":
        names, ins = ["q"], [("q", F32, [B, S, N, 3, h])]
    elif form == "packed_kv":
        names, ins = ["q", "k"], [("q", F32, [B, S, D]), ("k", F32, [B, L, N, 2, h])]
    elif form == "bnsh":
        names, ins = ["q", "k", "v"], [("q", F32, [B, S, D]), ("k", F32, [B, N, L, h]), ("v", F32, [B, N, L, h])]
    else:
        names, ins = ["q", "k", "v"], [("q", F32, [B, S, D]), ("k", F32, [B, L, D]), ("v", F32, [B, L, D])]
    for name, _, shape in ins:
        feeds[name] = rand(rng, *shape)
    inits = [("b", rand(rng, 3 * D))] if bias else []
    names += [""] * (3 - len(names)) + ["b" if bias else ""]
    _mask_and_bias(names, ins, feeds, padding, attention_bias, rng)
    node = helper.make_node("MultiHeadAttention", names, ["y"], domain=MS, num_heads=N, **attrs)
    return model([node], ins, [("y", F32, [B, S, D])], inits), feeds


@pytest.mark.parametrize("B,S,L,D,N", [(1, 1, 1, 4, 1), (2, 5, 5, 12, 3), (2, 3, 7, 15, 5), (3, 9, 4, 16, 2)])
@pytest.mark.parametrize("bias", [False, True])
def test_multi_head_attention_of_separate_q_k_v_matches_onnxruntime(B, S, L, D, N, bias):
    assert_matches_onnxruntime(*_mha(B, S, L, D, N, bias=bias, seed=S + L))


@pytest.mark.parametrize("padding", [np.array([2, 7], np.int32), np.array([[1, 1, 0, 1, 1, 0, 1], [0] * 7], np.int32)])
def test_multi_head_attention_key_padding_mask_matches_onnxruntime(padding):
    assert_matches_onnxruntime(*_mha(2, 3, 7, 12, 3, bias=True, padding=padding))


@pytest.mark.parametrize("shape", [(1, 1, 4, 6), (2, 3, 4, 6)])
def test_multi_head_attention_bias_and_scale_match_onnxruntime(shape):
    assert_matches_onnxruntime(*_mha(2, 4, 6, 12, 3, attention_bias=shape, scale=0.2))


def test_multi_head_attention_with_bnsh_key_and_value_matches_onnxruntime():
    assert_matches_onnxruntime(*_mha(2, 4, 6, 12, 3, form="bnsh"))


@pytest.mark.parametrize("form", ["packed_qkv", "packed_kv"])
def test_packed_multi_head_attention_matches_the_unpacked_form_on_onnxruntime(form):
    """onnxruntime's CPU EP runs packed Q/K/V on its CUDA EP only: the same tensors unpacked are the check."""
    B, S, D, N = 2, 5, 12, 3
    m, feeds = _mha(B, S, S, D, N, form=form, padding=np.array([4, 5], np.int32))
    unpacked = {"m": feeds["m"]}
    if form == "packed_qkv":
        unpacked.update({n: feeds["q"][:, :, :, i].reshape(B, S, D) for i, n in enumerate("qkv")})
    else:
        unpacked.update(q=feeds["q"], **{n: feeds["k"][:, :, :, i].reshape(B, S, D) for i, n in enumerate("kv")})
    plain, _ = _mha(B, S, S, D, N, padding=feeds["m"])
    np.testing.assert_allclose(polykit_cpu(m, feeds)["y"], ort(plain, unpacked)["y"], atol=2e-5, rtol=1e-4)


def test_multi_head_attention_behind_another_contrib_op_takes_its_form_from_the_inputs_given():
    """The query's rank is unknown at import when a SkipLayerNormalization (no shape rule: it is lowered
    too) produces it: key and value given means a [B, S, D] query."""
    rng = np.random.default_rng(8)
    B, S, L, D, N = 2, 5, 6, 12, 3
    nodes = [helper.make_node("SkipLayerNormalization", ["x", "skip", "gamma"], ["normed"], domain=MS),
             helper.make_node("MatMul", ["normed", "wq"], ["query"]),
             helper.make_node("MultiHeadAttention", ["query", "k", "v", "b", "m"], ["y"], domain=MS, num_heads=N)]
    m = model(nodes, [("x", F32, [B, S, D]), ("skip", F32, [B, S, D]), ("k", F32, [B, L, D]), ("v", F32, [B, L, D]),
                      ("m", I32, [B, L])], [("y", F32, [B, S, D])],
              [("gamma", rand(rng, D)), ("wq", rand(rng, D, D, scale=0.4)), ("b", rand(rng, 3 * D))])
    feeds = {"x": rand(rng, B, S, D), "skip": rand(rng, B, S, D), "k": rand(rng, B, L, D), "v": rand(rng, B, L, D),
             "m": np.array([[1, 1, 1, 0, 1, 0], [1, 0, 0, 0, 0, 0]], np.int32)}
    assert_matches_onnxruntime(m, feeds)


def test_multi_head_attention_inputs_of_the_wrong_rank_are_refused_by_name():
    m, feeds = _mha(1, 3, 3, 4, 2, form="packed_kv")
    m.graph.node[0].input[1] = "q"  # a [B, S, D] tensor where the packed KV [B, L, N, 2, h] belongs
    with pytest.raises(NodeAttributeError, match="MultiHeadAttention: input 1 of rank 3") as info:
        polykit_cpu(m, feeds)
    assert "packed KV" in info.value.hint


def test_attention_reading_the_mask_index_of_an_embed_layer_normalization_matches_onnxruntime():
    """The optimizer's form for files with EmbedLayerNormalization: its mask_index ([B] counts, no
    value info: the rank comes from the op) is every Attention's mask."""
    rng = np.random.default_rng(9)
    B, S, C, N, vocab = 2, 6, 12, 3, 20
    embed = helper.make_node("EmbedLayerNormalization", ["ids", "", "word", "pos", "", "gamma", "beta", "mask"],
                             ["hidden", "mask_index"], domain=MS)
    att = helper.make_node("Attention", ["hidden", "w", "b", "mask_index"], ["y"], domain=MS, num_heads=N)
    m = model([embed, att], [("ids", I32, [B, S]), ("mask", I32, [B, S])], [("y", F32, [B, S, C])],
              [("word", rand(rng, vocab, C)), ("pos", rand(rng, S, C)), ("gamma", rand(rng, C)), ("beta", rand(rng, C)),
               ("w", rand(rng, C, 3 * C, scale=0.4)), ("b", rand(rng, 3 * C))])
    feeds = {"ids": rng.integers(0, vocab, (B, S)).astype(np.int32),
             "mask": np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], np.int32)}
    assert_matches_onnxruntime(m, feeds)


@pytest.mark.parametrize("case", ["lengths_causal", "raw_attention_bias", "mha_bias_padding", "mha_packed_qkv",
                                  "mha_packed_kv", "mha_bnsh"])
def test_cuda_fp16_plan_runs_each_form_on_the_flash_kernels(case):
    """Level 0, no GPU needed: one Attention layer on cuda.attention.flash, no Softmax, no head
    Transpose, Split or Gather copy left (static shapes: the Q/K/V selections are views), Attention's
    projection one GEMM."""
    from collections import Counter

    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig

    m = {"lengths_causal": lambda: _attention(2, 16, 128, 2, mask=np.array([9, 16], np.int32), unidirectional=1),
         "raw_attention_bias": lambda: _attention(2, 16, 128, 2, mask=np.ones((2, 16), np.int32),
                                                  attention_bias=(1, 2, 16, 16)),
         "mha_bias_padding": lambda: _mha(2, 16, 24, 128, 2, bias=True, padding=np.ones((2, 24), np.int32)),
         "mha_packed_qkv": lambda: _mha(2, 16, 16, 128, 2, form="packed_qkv"),
         "mha_packed_kv": lambda: _mha(2, 16, 16, 128, 2, form="packed_kv"),
         "mha_bnsh": lambda: _mha(2, 16, 24, 128, 2, form="bnsh")}[case]()[0]
    plan = build_plan(m, BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0))
    tactics = Counter((layer.kind, layer.tactic) for layer in plan.layers)
    assert [t for (k, t) in tactics.elements() if k == "Attention"] == ["cuda.attention.flash"], tactics
    assert not {k for k, _ in tactics} & {"Softmax", "Transpose", "Split", "Gather"}, tactics
    projections = 1 if case in ("lengths_causal", "raw_attention_bias") else 0  # the packed QKV GEMM
    assert sum(n for (k, _), n in tactics.items() if k in ("MatMul", "Gemm")) == projections, tactics


@pytest.mark.parametrize("attrs,hinted", [({"unidirectional": 1}, True), ({}, False),
                                          ({"unidirectional": 1, "mask_filter_value": -3.0e38}, False)])
def test_unidirectional_attention_gets_the_causal_hint_where_skipping_keys_is_exact(attrs, hinted):
    """mask_causal 0 (the flash kernels skip the key tiles past the diagonal) for the causal term, unless
    a filter near the float range's end could tie visible and causal-masked scores."""
    from polykit.compiler.graph.onnx_import import load_onnx

    m, _ = _attention(2, 5, 12, 3, mask=np.array([3, 5], np.int32), **attrs)
    (att,) = [n for n in load_onnx(m).nodes if n.op_type == "Attention"]
    assert att.attrs.get("mask_causal") == (0 if hinted else None)


def test_unidirectional_attention_with_attention_bias_gets_no_causal_hint():
    from polykit.compiler.graph.onnx_import import load_onnx

    m, _ = _attention(2, 5, 12, 3, attention_bias=(1, 3, 5, 5), unidirectional=1)
    (att,) = [n for n in load_onnx(m).nodes if n.op_type == "Attention"]
    assert "mask_causal" not in att.attrs


def test_cuda_fp16_plan_of_unidirectional_attention_carries_the_hint_to_the_flash_layer():
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig

    m, _ = _attention(2, 16, 128, 2, mask=np.array([9, 16], np.int32), unidirectional=1)
    plan = build_plan(m, BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0))
    (att,) = [lay for lay in plan.layers if lay.kind == "Attention"]
    assert att.tactic == "cuda.attention.flash" and att.attrs["mask_causal"] == 0

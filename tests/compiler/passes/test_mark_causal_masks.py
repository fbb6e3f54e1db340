"""mark_causal_masks: the `mask_causal` hint of Attention masks that are causal (alone, or and-ed with a
run-time padding mask as GPT-2's and LLaMA's exports compute them), and none where it is not certain."""

import numpy as np
import pytest

from .passes_testkit import graph, node, run_and_compare, scalar

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.passes import mark_causal_masks, optimize
from polykit.compiler.ops.nn.fused import MASK_CAUSAL as HINT
from polykit.compiler.passes.mark_causal_masks import causal_offset_of

S, D = 6, 8


def tril(sq, sk, offset=0):
    return np.arange(sk)[None, :] <= np.arange(sq)[:, None] + offset


@pytest.mark.parametrize("kept,want", [
    (tril(6, 6), 0), (tril(6, 9, 3), 3), (tril(6, 6, -2), -2),
    (tril(6, 6)[None, None], 0),                              # leading broadcast dims
    (np.stack([tril(6, 6), tril(6, 6, 1)])[:, None], 1),      # the loosest of the slices
    (tril(1, 6, 2), 2),                                       # a broadcast query axis counts rows from 0
    (np.ones((6, 1), bool), None),                            # a broadcast key axis: nothing known per key
    (np.ones((6, 6), bool), None), (tril(6, 6, 5), None),     # every key kept somewhere: nothing to skip
    (np.zeros((6, 6), bool), None),                           # nothing kept: left to the mask
])
def test_the_offset_of_a_keep_mask(kept, want):
    assert causal_offset_of(kept) == want


def decoder_attention(fill=-np.inf, combine="And", causal=None, keep_dtype=np.bool_, d=D):
    """GPT-2's exported form: keep = And(causal constant, padding from the input), mask = Where(keep, 0, fill),
    eager attention softmax(Q K^T / sqrt(D) + mask) V."""
    causal = tril(S, S) if causal is None else causal
    nodes = [node("Cast", ["padding"], "pad_b", to=9), node("Unsqueeze", ["pad_b", "axes12"], "pad4"),
             node(combine, ["causal", "pad4"], "keep"), node("Where", ["keep", "zero", "fill"], "mask"),
             node("Transpose", ["k"], "kt", perm=[0, 1, 3, 2]), node("MatMul", ["q", "kt"], "s"),
             node("Div", ["s", "sqrt_d"], "ss"), node("Add", ["ss", "mask"], "sm"),
             node("Softmax", ["sm"], "p", axis=-1), node("MatMul", ["p", "v"], "y")]
    inits = {"causal": causal[None, None].astype(keep_dtype), "axes12": np.array([1, 2], np.int64),
             "zero": scalar(0.0), "fill": scalar(fill), "sqrt_d": scalar(np.sqrt(d))}
    shapes = {"q": (2, 2, S, d), "k": (2, 2, S, d), "v": (2, 2, S, d), "padding": ((2, S), np.int64)}
    return graph(nodes, shapes, ["y"], inits)


def attention_of(g):
    (att,) = [n for n in g.nodes if n.op_type == "Attention" and n.domain == POLYKIT_DOMAIN]
    return att


@pytest.mark.parametrize("fp16", [False, True])
def test_gpt2s_causal_and_padding_mask_gets_the_hint_through_the_whole_pipeline(fp16):
    out = optimize(decoder_attention(), fp16=fp16)
    assert attention_of(out).attrs[HINT] == 0


@pytest.mark.parametrize("fp16", [False, True])
def test_float32s_lowest_is_no_minus_infinity_and_gets_no_hint(fp16):
    """HF's other mask value, float32's lowest, stays finite (float16 conversion saturates it to -65504): a
    row whose keys are all masked then softmaxes over its scores, and skipping keys would change it."""
    lowest = float(np.finfo(np.float32).min)
    assert HINT not in attention_of(optimize(decoder_attention(fill=lowest), fp16=fp16)).attrs


@pytest.mark.parametrize("case", ["finite fill", "or", "not causal", "shifted"])
def test_masks_not_certainly_causal_get_no_hint_or_their_own_offset(case):
    g = {"finite fill": lambda: decoder_attention(fill=-1e4), "or": lambda: decoder_attention(combine="Or"),
         "not causal": lambda: decoder_attention(causal=np.ones((S, S), bool)),
         "shifted": lambda: decoder_attention(causal=tril(S, S, -1))}[case]()
    attrs = attention_of(optimize(g)).attrs
    assert attrs.get(HINT) == (-1 if case == "shifted" else None)


def test_the_hint_changes_no_value_and_is_set_once():
    """The pass only annotates: the graph computes the same (the reference ignores the hint), and a second
    run changes nothing."""
    g = optimize(decoder_attention(), fuse=False)  # Attention recognized, the mask's ops still there
    out, changed = run_and_compare(g, mark_causal_masks)
    assert changed and attention_of(out).attrs[HINT] == 0
    assert not mark_causal_masks(out)


def test_a_cpu_plan_with_the_hint_matches_onnxruntime():
    """End to end on the cpu target (its kernels ignore the hint): built from the exported form, same values
    as onnxruntime's run of the unfused graph."""
    ort = pytest.importorskip("onnxruntime")
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.compiler.graph.onnx_export import to_onnx
    from polykit.runtime.engine import Engine

    g = decoder_attention()
    rng = np.random.default_rng(5)
    feeds = {n: rng.standard_normal((2, 2, S, D)).astype(np.float32) for n in ("q", "k", "v")}
    feeds["padding"] = np.array([[1] * S, [1] * (S - 2) + [0, 0]], np.int64)
    want = ort.InferenceSession(to_onnx(g).SerializeToString()).run(None, feeds)[0]
    plan = build_plan(g, BuilderConfig(target="cpu"))
    assert any(layer.attrs.get(HINT) == 0 for layer in plan.layers)
    with Engine(plan) as engine, engine.create_execution_context() as ctx:
        got = ctx.execute(feeds)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_the_hint_reaches_a_cuda_plans_flash_layer():
    """What the kernels read is the plan's layer: an fp16 cuda build (untimed without a GPU) keeps the hint on
    the Attention layer its flash tactic runs, and the launch passes it (flash_launch's causal offset)."""
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.kernels.cuda.attention.flash_attention import causal_offset

    plan = build_plan(decoder_attention(d=64), BuilderConfig(target="cuda", fp16=True))  # flash: heads 32..256
    (layer,) = [layer for layer in plan.layers if layer.kind == "Attention"]
    assert layer.attrs[HINT] == 0 and layer.tactic.startswith("cuda.attention.flash")
    assert causal_offset(layer, masked=True) == 0

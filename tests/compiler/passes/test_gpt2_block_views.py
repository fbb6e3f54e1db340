"""A GPT-2 attention block as HF's export writes it leaves no movement copy in a cuda plan.

The Conv1D projections are Gemms over a [B*S, E] Reshape of the hidden states, the heads split
by Split + Reshape + Transpose (the key to [B, H, D, S]), the causal + padding mask a Where of
the model's attention_mask, the heads merged by Transpose + Reshape, then the out-projection's
Gemm over [B*S, E] again and the residual Add. What makes it copy-free: recognize_attention,
fold_attention_layouts (q / k / v as strided views of the packed projection, "bshd" output),
hoist_activations (the residual Add into the Gemm's epilogue, the Reshape to [B, S, E] after it,
writing the engine output) and the memory plan's views (every Reshape shares its input's bytes,
the last one its input the output's)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.runtime.engine import Engine
from polykit.runtime.io_binding import root_of

RNG = np.random.default_rng(11)
DIMS = (2, 7, 3, 8)  # B, S, H, D: small and odd
#: layer kinds that move bytes without computing (a Reshape-family layer is checked to be a view)
COPIES = {"Transpose", "Split", "Slice", "Concat", "Gather", "Expand", "Tile", "Pad", "PermutedCopy", "Reformat",
          "Copy", "ConcatGather", "DepthToSpace", "SpaceToDepth", "Identity"}
VIEWS = {"Reshape", "Flatten", "Squeeze", "Unsqueeze"}


def _w(*shape, scale=0.3):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _i64(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


def gpt2_block(dims=DIMS):
    """x [B, S, E] float, attention_mask [B, S] int64 (1: a token, 0: padding) -> y [B, S, E]."""
    b, s, h, d = dims
    e = h * d
    node = helper.make_node
    nodes = [  # the mask: a key is visible when it is a token at or before the query
        node("Reshape", ["attention_mask", "s_mask"], ["m4"]),
        node("Cast", ["m4"], ["mb"], to=TensorProto.BOOL),
        node("And", ["causal", "mb"], ["keep"]),
        node("Where", ["keep", "zero", "lowest"], ["bias"]),
        node("LayerNormalization", ["x", "ln_s", "ln_b"], ["ln"], axis=-1),
        node("Reshape", ["ln", "s_rows"], ["ln2"]),
        node("Gemm", ["ln2", "w_attn", "b_attn"], ["qkv2"]),
        node("Reshape", ["qkv2", "s_bs3e"], ["qkv"]),
        node("Split", ["qkv", "split"], ["q0", "k0", "v0"], axis=2),
        node("Reshape", ["q0", "s_bshd"], ["q1"]),
        node("Transpose", ["q1"], ["q2"], perm=[0, 2, 1, 3]),
        node("Mul", ["q2", "root_scale"], ["q"]),
        node("Reshape", ["k0", "s_bshd"], ["k1"]),
        node("Transpose", ["k1"], ["k2"], perm=[0, 2, 3, 1]),
        node("Mul", ["k2", "root_scale"], ["k"]),
        node("Reshape", ["v0", "s_bshd"], ["v1"]),
        node("Transpose", ["v1"], ["v"], perm=[0, 2, 1, 3]),
        node("MatMul", ["q", "k"], ["scores"]),
        node("Add", ["scores", "bias"], ["masked"]),
        node("Softmax", ["masked"], ["p0"], axis=-1),
        node("IsNaN", ["p0"], ["nan"]),
        node("Where", ["nan", "zero", "p0"], ["p"]),
        node("MatMul", ["p", "v"], ["a"]),
        node("Transpose", ["a"], ["at"], perm=[0, 2, 1, 3]),  # merge heads: [B, S, H, D] -> [B, S, E]
        node("Reshape", ["at", "s_bse"], ["merged"]),
        node("Reshape", ["merged", "s_rows"], ["merged2"]),
        node("Gemm", ["merged2", "w_proj", "b_proj"], ["o2"]),
        node("Reshape", ["o2", "s_bse"], ["o"]),
        node("Add", ["o", "x"], ["y"]),
    ]
    inits = [numpy_helper.from_array(a, n) for n, a in (
        ("ln_s", _w(e) + 1.0), ("ln_b", _w(e)), ("w_attn", _w(e, 3 * e, scale=e ** -0.5)), ("b_attn", _w(3 * e)),
        ("w_proj", _w(e, e, scale=e ** -0.5)), ("b_proj", _w(e)),
        ("root_scale", np.array(d ** -0.25, np.float32)), ("zero", np.array(0.0, np.float32)),
        ("lowest", np.array(np.finfo(np.float32).min, np.float32)),
        ("causal", np.tril(np.ones((s, s), bool))[None, None]))]
    inits += [_i64("s_mask", [b, 1, 1, s]), _i64("s_rows", [b * s, e]), _i64("s_bs3e", [b, s, 3 * e]),
              _i64("split", [e, e, e]), _i64("s_bshd", [b, s, h, d]), _i64("s_bse", [b, s, e])]
    g = helper.make_graph(nodes, "gpt2_block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [b, s, e]),
                                                helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [b, s])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [b, s, e])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _feeds(dims=DIMS):
    b, s, h, d = dims
    mask = np.ones((b, s), np.int64)
    mask[-1, s - 2:] = 0  # the last sequence padded by two tokens
    return {"x": RNG.standard_normal((b, s, h * d)).astype(np.float32), "attention_mask": mask}


def _is_view(plan, layer) -> bool:
    """Whether the layer's input and output share their bytes (memory.aliases: one is a view of
    the other, or both of one root), so it launches nothing."""
    aliases = plan.memory.aliases
    return root_of(layer.inputs[0], aliases) == root_of(layer.outputs[0], aliases)


def _onnxruntime(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


def _run(plan, feeds):
    with Engine(plan) as engine, engine.create_execution_context() as ctx:
        return ctx.execute(feeds)["y"].astype(np.float32)


@pytest.mark.parametrize("fp16", [False, True])
def test_cuda_plan_of_the_gpt2_block_has_no_movement_copy(fp16):
    """Level 0, no GPU needed: every Reshape is a view of its input's bytes, the Attention reads
    q / k / v as views of the packed projection and writes the merged heads in the layout the
    out-projection reads; the engine output's Reshape shares the output's bytes (the Gemm writes
    the output), and the only Casts are the fp16 plan's I/O conversions."""
    plan = build_plan(gpt2_block(), BuilderConfig(target="cuda", fp16=fp16, builder_optimization_level=0))
    assert [layer.name for layer in plan.layers if layer.kind in COPIES] == []
    views = [layer for layer in plan.layers if layer.kind in VIEWS]
    assert views and [layer.name for layer in views if not _is_view(plan, layer)] == []
    (att,) = [layer for layer in plan.layers if layer.kind == "Attention"]
    producers = {out: layer for layer in plan.layers for out in layer.outputs}
    assert producers[att.inputs[0]].kind == "Gemm" and att.inputs[:3] == (att.inputs[0],) * 3
    assert att.attrs["out_layout"] == "bshd" and all(att.attrs.get(a) for a in ("q_view", "k_view", "v_view"))
    casts = [(layer.inputs[0], layer.outputs[0]) for layer in plan.layers if layer.kind == "Cast"]
    assert [i == "x" or o == "y" for i, o in casts] == ([True, True] if fp16 else [])


def test_cpu_plan_of_the_gpt2_block_matches_onnxruntime():
    model, feeds = gpt2_block(), _feeds()
    plan = build_plan(model, BuilderConfig(target="cpu"))
    assert not [layer for layer in plan.layers if layer.kind in COPIES]
    np.testing.assert_allclose(_run(plan, feeds), _onnxruntime(model, feeds), rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("fp16", [False, True])
@pytest.mark.parametrize("dims", [DIMS, (2, 37, 2, 64)])
def test_cuda_plan_of_the_gpt2_block_matches_onnxruntime(fp16, dims):
    model, feeds = gpt2_block(dims), _feeds(dims)
    plan = build_plan(model, BuilderConfig(target="cuda", fp16=fp16, builder_optimization_level=0))
    assert not [layer for layer in plan.layers if layer.kind in COPIES]
    tol = 2e-2 if fp16 else 1e-4
    np.testing.assert_allclose(_run(plan, feeds), _onnxruntime(model, feeds), rtol=tol, atol=tol)

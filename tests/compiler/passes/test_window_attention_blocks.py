"""Swin-style window attention blocks (torchvision's shifted_window_attention as the TorchScript
exporter writes it: roll as Slice + Concat, the window partition as Reshape + Transpose, q, k, v
gathered from the packed projection, the shifted blocks' per-window mask added between reshapes)
built with onnx.helper at odd sizes, compiled for the cpu target and compared with onnxruntime.
The shifted block's attention runs over batch dims (B, W) of rank-5 views, reading q, k, v from
the projection and writing its output in the out-projection's row order: no Transpose is left."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.runtime.engine import Engine

RNG = np.random.default_rng(5)


def _i64(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _roll(x: str, out: str, shift: int, dims: tuple[int, int], sizes: tuple[int, int], p: str):
    """torch.roll(x, (shift, shift), dims) as the exporter writes it: per axis two Slices + Concat."""
    nodes, inits, cur = [], [], x
    for axis, n in zip(dims, sizes):
        k = shift % n
        a, b = f"{p}roll{axis}a", f"{p}roll{axis}b"
        nxt = out if axis == dims[-1] else f"{p}roll{axis}"
        inits += [_i64(f"{a}_s", [n - k]), _i64(f"{a}_e", [n]), _i64(f"{b}_s", [0]), _i64(f"{b}_e", [n - k]),
                  _i64(f"{p}ax{axis}", [axis])]
        nodes += [helper.make_node("Slice", [cur, f"{a}_s", f"{a}_e", f"{p}ax{axis}"], [a]),
                  helper.make_node("Slice", [cur, f"{b}_s", f"{b}_e", f"{p}ax{axis}"], [b]),
                  helper.make_node("Concat", [a, b], [nxt], axis=axis)]
        cur = nxt
    return nodes, inits


def window_block(B, Hs, Ws, C, heads, win, shift):
    """x [B, Hs, Ws, C] -> LayerNorm -> (roll) -> windows -> attention with a relative-position
    bias (and, shifted, a per-window mask) -> projection -> merge -> (roll back) -> + x."""
    nh, nw = Hs // win, Ws // win
    W, N, D = nh * nw, win * win, C // heads
    f32 = lambda *s, scale=0.3: (RNG.standard_normal(s) * scale).astype(np.float32)  # noqa: E731
    inits = [numpy_helper.from_array(f32(C) + 1, "ln_s"), numpy_helper.from_array(f32(C), "ln_b"),
             numpy_helper.from_array(f32(C, 3 * C), "w_qkv"), numpy_helper.from_array(f32(3 * C), "b_qkv"),
             numpy_helper.from_array(f32(C, C), "w_proj"), numpy_helper.from_array(f32(C), "b_proj"),
             numpy_helper.from_array(f32(heads, N, N, scale=1.0), "bias"),
             numpy_helper.from_array(np.array(D ** -0.5, np.float32), "scale"),
             _i64("s_part", [B, nh, win, nw, win, C]), _i64("s_rows", [B * W, N, C]),
             _i64("s_qkv", [B * W, N, 3, heads, D]), _i64("i0", 0), _i64("i1", 1), _i64("i2", 2),
             _i64("s_back", [B, nh, nw, win, win, C]), _i64("s_img", [B, Hs, Ws, C])]
    nodes = [helper.make_node("LayerNormalization", ["x", "ln_s", "ln_b"], ["ln"], axis=-1)]
    src = "ln"
    if shift:
        more, extra = _roll("ln", "rolled", -shift, (1, 2), (Hs, Ws), "f")
        nodes, inits, src = nodes + more, inits + extra, "rolled"
    nodes += [helper.make_node("Reshape", [src, "s_part"], ["part"]),
              helper.make_node("Transpose", ["part"], ["partt"], perm=[0, 1, 3, 2, 4, 5]),
              helper.make_node("Reshape", ["partt", "s_rows"], ["rows"]),
              helper.make_node("MatMul", ["rows", "w_qkv"], ["qkv0"]),
              helper.make_node("Add", ["qkv0", "b_qkv"], ["qkv1"]),
              helper.make_node("Reshape", ["qkv1", "s_qkv"], ["qkv2"]),
              helper.make_node("Transpose", ["qkv2"], ["qkv"], perm=[2, 0, 3, 1, 4])]
    nodes += [helper.make_node("Gather", ["qkv", f"i{i}"], [t], axis=0) for i, t in enumerate("qkv")]
    nodes += [helper.make_node("Mul", ["q", "scale"], ["qs"]),
              helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", ["qs", "kt"], ["sc0"]),
              helper.make_node("Add", ["sc0", "bias"], ["sc1"])]
    scores = "sc1"
    if shift:
        mask = np.where(RNG.random((W, N, N)) > 0.3, 0.0, -100.0).astype(np.float32)
        inits += [numpy_helper.from_array(mask.reshape(1, W, 1, N, N), "wmask"), _i64("s_win", [B, W, heads, N, N]),
                  _i64("s_merge", [-1, heads, N, N])]
        nodes += [helper.make_node("Reshape", ["sc1", "s_win"], ["sc5"]),
                  helper.make_node("Add", ["sc5", "wmask"], ["sc5m"]),
                  helper.make_node("Reshape", ["sc5m", "s_merge"], ["sc2"])]
        scores = "sc2"
    nodes += [helper.make_node("Softmax", [scores], ["pr"], axis=-1),
              helper.make_node("MatMul", ["pr", "v"], ["att"]),
              helper.make_node("Transpose", ["att"], ["attt"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["attt", "s_rows"], ["arows"]),
              helper.make_node("MatMul", ["arows", "w_proj"], ["p0"]),
              helper.make_node("Add", ["p0", "b_proj"], ["p1"]),
              helper.make_node("Reshape", ["p1", "s_back"], ["back"]),
              helper.make_node("Transpose", ["back"], ["backt"], perm=[0, 1, 3, 2, 4, 5]),
              helper.make_node("Reshape", ["backt", "s_img"], ["img"])]
    out = "img"
    if shift:
        more, extra = _roll("img", "unrolled", shift, (1, 2), (Hs, Ws), "b")
        nodes, inits, out = nodes + more, inits + extra, "unrolled"
    nodes.append(helper.make_node("Add", [out, "x"], ["y"]))
    g = helper.make_graph(nodes, "window_block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, Hs, Ws, C])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _run(model, B, Hs, Ws, C):
    feeds = {"x": RNG.standard_normal((B, Hs, Ws, C)).astype(np.float32)}
    plan = build_plan(model, BuilderConfig(target="cpu"))
    with Engine(plan) as engine, engine.create_execution_context() as ctx:
        got = ctx.execute(feeds)["y"]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    return plan


@pytest.mark.parametrize("B, Hs, Ws, C, heads, win", [(2, 6, 9, 12, 3, 3), (3, 10, 5, 10, 2, 5), (2, 4, 4, 8, 1, 2)])
def test_shifted_window_block_runs_rank5_attention_on_views_and_matches_onnxruntime(B, Hs, Ws, C, heads, win):
    plan = _run(window_block(B, Hs, Ws, C, heads, win, shift=win // 2 or 1), B, Hs, Ws, C)
    kinds = [layer.kind for layer in plan.layers]
    (att,) = [layer for layer in plan.layers if layer.kind == "Attention"]
    assert "Transpose" not in kinds
    assert len(att.out_shapes[0]) == 5
    assert att.attrs.get("out_layout") == ("bshd" if heads > 1 else None)  # one head: the transpose is a view
    assert all(att.attrs.get(a) is not None for a in ("q_view", "k_view", "v_view"))


@pytest.mark.parametrize("B, Hs, Ws, C, heads, win", [(2, 6, 9, 12, 3, 3), (3, 10, 5, 10, 2, 5)])
def test_plain_window_block_matches_onnxruntime(B, Hs, Ws, C, heads, win):
    plan = _run(window_block(B, Hs, Ws, C, heads, win, shift=0), B, Hs, Ws, C)
    (att,) = [layer for layer in plan.layers if layer.kind == "Attention"]
    assert all(att.attrs.get(a) is not None for a in ("q_view", "k_view", "v_view"))

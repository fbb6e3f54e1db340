"""FlexAttention (ai.onnx.preview): the importer's rewrite against an independent numpy oracle,
in the graph evaluator and in cpu plans (cuda twin gpu-marked)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.ir import dtypes
from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.graph.evaluator import evaluate_model
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.errors import NodeAttributeError
from polykit.runtime.engine import Engine

RNG = np.random.default_rng(26)
F = TensorProto.FLOAT


def _mod(name: str, nodes: list, inits: list = (), n_inputs: int = 1) -> onnx.GraphProto:
    ins = [helper.make_tensor_value_info(f"{name}_in{i}" if i else "s", F, None) for i in range(n_inputs)]
    return helper.make_graph(nodes, name, ins, [helper.make_tensor_value_info("s_out", F, None)], list(inits))


def _model(qkv: dict, out_dtype, nodes=None, inits=(), **attrs) -> onnx.ModelProto:
    nodes = nodes or [helper.make_node("FlexAttention", ["Q", "K", "V"], ["Y"], domain="ai.onnx.preview", **attrs)]
    graph = helper.make_graph(nodes, "flex",
                              [helper.make_tensor_value_info(n, dtypes.to_onnx(a.dtype), a.shape)
                               for n, a in qkv.items()],
                              [helper.make_tensor_value_info("Y", dtypes.to_onnx(out_dtype), None)], list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 26), helper.make_opsetid("ai.onnx.preview", 1)],
                             ir_version=10)


def _qkv(b=2, hq=4, hkv=4, lq=5, lk=7, e=8, ev=8, dtype=np.float32) -> dict:
    return {"Q": RNG.standard_normal((b, hq, lq, e)).astype(dtype), "K": RNG.standard_normal((b, hkv, lk, e)).astype(dtype),
            "V": RNG.standard_normal((b, hkv, lk, ev)).astype(dtype)}


def _oracle(q, k, v, scale=None, score=lambda s: s, prob=lambda p: p):
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    s = score(q @ np.swapaxes(k, -1, -2) * (1 / np.sqrt(q.shape[-1]) if scale is None else scale))
    p = np.exp(s - s.max(-1, keepdims=True))
    return prob(p / p.sum(-1, keepdims=True)) @ v


@pytest.mark.parametrize("shape", [dict(), dict(hq=8, hkv=2), dict(ev=12)], ids=["mha", "gqa", "wide_v"])
def test_flex_attention_matches_scaled_dot_product_attention(shape):
    feeds = _qkv(**shape)
    got = evaluate_model(_model(feeds, np.float32), feeds)["Y"]
    assert got.dtype == np.float32 and got.shape == (2, shape.get("hq", 4), 5, shape.get("ev", 8))
    np.testing.assert_allclose(got, _oracle(*feeds.values()), rtol=1e-5, atol=1e-6)


def test_the_scale_attribute_replaces_one_over_sqrt_of_the_head_size():
    feeds = _qkv()
    got = evaluate_model(_model(feeds, np.float32, scale=0.3), feeds)["Y"]
    np.testing.assert_allclose(got, _oracle(*feeds.values(), scale=0.3), rtol=1e-5, atol=1e-6)


def test_score_and_prob_mods_run_inlined_and_read_the_outer_scope():
    feeds = _qkv()
    bias = RNG.standard_normal((5, 7)).astype(np.float32)
    score_mod = _mod("soft_cap", [helper.make_node("Div", ["s", "cap"], ["t0"]), helper.make_node("Tanh", ["t0"], ["t1"]),
                                  helper.make_node("Mul", ["t1", "cap"], ["t2"]),
                                  helper.make_node("Add", ["t2", "bias"], ["s_out"])],
                     [numpy_helper.from_array(np.array(2.0, np.float32), "cap")])
    prob_mod = _mod("halve", [helper.make_node("Mul", ["s", "half"], ["s_out"])],
                    [numpy_helper.from_array(np.array(0.5, np.float32), "half")])
    model = _model(feeds, np.float32, inits=[numpy_helper.from_array(bias, "bias")], score_mod=score_mod,
                   prob_mod=prob_mod)
    want = _oracle(*feeds.values(), score=lambda s: np.tanh(s / 2) * 2 + bias, prob=lambda p: p * 0.5)
    np.testing.assert_allclose(evaluate_model(model, feeds)["Y"], want, rtol=1e-5, atol=1e-6)
    with Engine(build_plan(model, BuilderConfig(target="cpu"))) as engine, engine.create_execution_context() as ctx:
        np.testing.assert_allclose(ctx.execute(feeds)["Y"], want, rtol=1e-5, atol=1e-6)


def test_two_nodes_with_the_same_modifier_names_inline_apart():
    feeds = _qkv()
    mod = _mod("plus", [helper.make_node("Add", ["s", "one"], ["s_out"])],
               [numpy_helper.from_array(np.array(1.0, np.float32), "one")])
    nodes = [helper.make_node("FlexAttention", ["Q", "K", "V"], ["Y1"], domain="ai.onnx.preview", score_mod=mod),
             helper.make_node("FlexAttention", ["Q", "K", "V"], ["Y2"], domain="ai.onnx.preview", prob_mod=mod),
             helper.make_node("Add", ["Y1", "Y2"], ["Y"])]
    got = evaluate_model(_model(feeds, np.float32, nodes=nodes), feeds)["Y"]
    want = _oracle(*feeds.values(), score=lambda s: s + 1) + _oracle(*feeds.values(), prob=lambda p: p + 1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_sixteen_bit_inputs_run_softmax_in_float32_and_double_in_double(dtype):
    feeds = _qkv(dtype=dtype)
    graph = load_onnx(_model(feeds, dtype))
    softmax = next(n for n in graph.nodes if n.op_type == "Softmax")
    assert graph.value(softmax.inputs[0]).dtype == (np.float64 if dtype == np.float64 else np.float32)
    got = evaluate_model(_model(feeds, dtype), feeds)["Y"]
    assert got.dtype == dtype
    # the function body forms the scale's root in float32 and casts it to T: ~1e-7 relative in double
    tol = 1e-2 if dtype == np.float16 else 1e-6
    np.testing.assert_allclose(got, _oracle(*feeds.values()), rtol=tol, atol=tol)


def test_a_modifier_of_the_newer_five_input_form_is_refused_naming_the_node():
    feeds = _qkv()
    mod = _mod("pointwise", [helper.make_node("Identity", ["s"], ["s_out"])], n_inputs=5)
    with pytest.raises(NodeAttributeError, match="score_mod must be a graph of one input"):
        load_onnx(_model(feeds, np.float32, score_mod=mod))


def test_an_unknown_attribute_is_refused():
    feeds = _qkv()
    with pytest.raises(NodeAttributeError, match="enable_gqa"):
        load_onnx(_model(feeds, np.float32, enable_gqa=1))


@pytest.mark.gpu
def test_flex_attention_with_a_score_mod_runs_on_cuda():
    feeds = _qkv(hq=8, hkv=2)
    mod = _mod("soft_cap", [helper.make_node("Div", ["s", "cap"], ["t0"]), helper.make_node("Tanh", ["t0"], ["t1"]),
                            helper.make_node("Mul", ["t1", "cap"], ["s_out"])],
               [numpy_helper.from_array(np.array(2.0, np.float32), "cap")])
    model = _model(feeds, np.float32, score_mod=mod)
    with Engine(build_plan(model, BuilderConfig(target="cuda"))) as engine, engine.create_execution_context() as ctx:
        got = ctx.execute(feeds)["Y"]
    np.testing.assert_allclose(got, _oracle(*feeds.values(), score=lambda s: np.tanh(s / 2) * 2), rtol=1e-4, atol=1e-5)

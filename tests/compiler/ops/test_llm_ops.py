"""RotaryEmbedding, SwiGLU, TensorScatter, LinearAttention, CausalConvWithState: reference kernels
against onnx's own reference on random inputs, shape rules against the real output shapes, and
errors naming the node."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from polykit.compiler.graph.infer import infer_shapes
from polykit.compiler.ir.graph import Graph, Node, Value
from polykit.errors import ShapeError
from polykit.compiler.ops.references import run_reference

rng = np.random.default_rng(11)
OPSET = 28


def rand(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def onnx_reference(op, inputs, n_out, attrs):
    names = [f"x{i}" if x is not None else "" for i, x in enumerate(inputs)]
    node = helper.make_node(op, names, [f"y{i}" for i in range(n_out)], **attrs)
    ins = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
           for n, x in zip(names, inputs) if n]
    outs = [helper.make_tensor_value_info(f"y{i}", TensorProto.UNDEFINED, None) for i in range(n_out)]
    model = helper.make_model(helper.make_graph([node], "g", ins, outs), opset_imports=[helper.make_opsetid("", OPSET)])
    return ReferenceEvaluator(model).run(None, {n: x for n, x in zip(names, inputs) if n})


def inferred_shapes(op, inputs, n_out, attrs):
    names = [f"x{i}" if x is not None else "" for i, x in enumerate(inputs)]
    values = {n: Value(n, x.dtype, x.shape) for n, x in zip(names, inputs) if n}
    node = Node(op, names, [f"y{i}" for i in range(n_out)], dict(attrs), "llm0")
    graph = Graph([node], list(values), node.outputs, {}, values)
    infer_shapes(graph)
    return [graph.value(o).shape for o in node.outputs]


POS = rng.integers(0, 50, (2, 3)).astype(np.int64)
CASES = {
    "rotary_4d_positions": ("RotaryEmbedding", [rand(2, 4, 3, 8), rand(50, 4), rand(50, 4), POS], 1, {}),
    "rotary_3d_interleaved_partial": ("RotaryEmbedding", [rand(2, 3, 32), rand(50, 2), rand(50, 2), POS], 1,
                                      {"num_heads": 4, "interleaved": 1, "rotary_embedding_dim": 4}),
    "rotary_caches_per_token": ("RotaryEmbedding", [rand(2, 4, 3, 8), rand(2, 3, 4), rand(2, 3, 4), None], 1, {}),
    "swiglu_alpha": ("SwiGLU", [rand(3, 7), rand(3, 7)], 1, {"alpha": 0.7}),
    "swiglu_fp16": ("SwiGLU", [rand(4, 5, dtype=np.float16), rand(4, 5, dtype=np.float16)], 1, {}),
    "tensor_scatter_circular": ("TensorScatter", [rand(3, 2, 5, 4), rand(3, 2, 3, 4), np.array([0, 3, 4], np.int64)],
                                1, {"mode": "circular"}),
    "tensor_scatter_axis1": ("TensorScatter", [rand(2, 6, 3), rand(2, 2, 3), np.array([1, 4], np.int64)], 1,
                             {"axis": 1}),
    "linear_attention_gated_delta_gqa": ("LinearAttention", [rand(2, 5, 64), rand(2, 5, 32), rand(2, 5, 24),
                                                             rand(2, 4, 8, 6) * 0.1, -np.abs(rand(2, 5, 32)),
                                                             np.abs(rand(2, 5, 4))],
                                         2, {"q_num_heads": 8, "kv_num_heads": 4}),
    "linear_attention_linear": ("LinearAttention", [rand(1, 3, 16), rand(1, 3, 16), rand(1, 3, 16)], 2,
                                {"q_num_heads": 2, "kv_num_heads": 2, "update_rule": "linear", "scale": 0.3}),
    "causal_conv_silu_past_bias": ("CausalConvWithState", [rand(2, 5, 7), rand(5, 1, 3), rand(5), rand(2, 5, 2)], 2,
                                   {"activation": "silu"}),
    "causal_conv_plain": ("CausalConvWithState", [rand(1, 3, 2), rand(3, 1, 4)], 2, {}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_reference_matches_onnx_reference_and_shape_rule(case):
    op, inputs, n_out, attrs = CASES[case]
    expected = onnx_reference(op, inputs, n_out, attrs)
    names = [f"x{i}" if x is not None else "" for i, x in enumerate(inputs)]
    got = run_reference(Node(op, names, [f"y{i}" for i in range(n_out)], attrs, "n"), inputs)
    assert inferred_shapes(op, inputs, n_out, attrs) == [e.shape for e in expected]
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape
        tol = 1e-3 if g.dtype == np.float16 else 1e-5
        np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), rtol=tol, atol=tol)


def test_tensor_scatter_linear_mode_refuses_a_write_past_the_cache():
    node = Node("TensorScatter", ["c", "u", "i"], ["y"], {}, "scatter0")
    with pytest.raises(ShapeError, match="past the cache length"):
        run_reference(node, [rand(2, 4, 3), rand(2, 2, 3), np.array([0, 3], np.int64)])


@pytest.mark.parametrize("op,inputs,attrs,needle", [
    ("SwiGLU", [rand(2, 3), rand(2, 4)], {}, "one shape"),
    ("LinearAttention", [rand(1, 2, 8), rand(1, 2, 8), rand(1, 2, 8)], {"q_num_heads": 2, "kv_num_heads": 2},
     "needs decay"),
    ("RotaryEmbedding", [rand(2, 3, 32), rand(50, 4), rand(50, 4)], {}, "num_heads"),
    ("CausalConvWithState", [rand(2, 3, 4), rand(3, 1, 2)], {"activation": "gelu"}, "unknown activation"),
    ("TensorScatter", [rand(2, 4, 3), rand(2, 5, 3)], {}, "does not fit"),
])
def test_shape_rules_refuse_bad_llm_nodes_naming_them(op, inputs, attrs, needle):
    with pytest.raises(ShapeError, match=needle) as info:
        inferred_shapes(op, inputs, 1, attrs)
    assert "llm0" in str(info.value)

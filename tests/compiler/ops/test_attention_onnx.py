"""ONNX Attention (opset 23-25): shape rule (3-D/4-D, GQA, past, qk output), errors naming the
node, and the reference kernel against onnx's own reference on random inputs of every variant."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from polykit.compiler.graph.infer import infer_shapes
from polykit.compiler.ir.graph import Graph, Node, Value
from polykit.errors import ShapeError
from polykit.compiler.ops.references import run_reference

rng = np.random.default_rng(7)
NAMES = ("Q", "K", "V", "attn_mask", "past_key", "past_value", "nonpad_kv_seqlen")
OUTS = ("Y", "present_key", "present_value", "qk")


def infer(shapes, dtypes=None, n_out=1, **attrs):
    dtypes = dtypes or {}
    names = [n if s is not None else "" for n, s in zip(NAMES, shapes)]
    values = {n: Value(n, np.dtype(dtypes.get(n, np.float32)), tuple(s)) for n, s in zip(names, shapes) if n}
    node = Node("Attention", names, list(OUTS[:n_out]), attrs, "att0")
    graph = Graph([node], list(values), node.outputs, {}, values)
    infer_shapes(graph)
    return [graph.value(o) for o in node.outputs]


def test_shape_rule_of_4d_gqa_with_past_gives_present_and_qk_shapes():
    y, pk, pv, qk = infer([(2, 8, 5, 16), (2, 2, 3, 16), (2, 2, 3, 12), None, (2, 2, 7, 16), (2, 2, 7, 12)], n_out=4)
    assert (y.shape, pk.shape, pv.shape, qk.shape) == ((2, 8, 5, 12), (2, 2, 10, 16), (2, 2, 10, 12), (2, 8, 5, 10))


def test_shape_rule_of_3d_inputs_uses_the_head_attributes():
    (y,) = infer([("B", 4, 72), ("B", 6, 24), ("B", 6, 30)], q_num_heads=9, kv_num_heads=3)
    assert y.shape == ("B", 4, 90)


@pytest.mark.parametrize("shapes,attrs,needle", [
    ([(2, 4, 24), (2, 6, 24), (2, 6, 24)], {}, "q_num_heads"),
    ([(2, 5, 4, 8), (2, 2, 6, 8), (2, 2, 6, 8)], {}, "multiple"),
    ([(2, 3, 4, 8), (2, 3, 6, 4), (2, 3, 6, 8)], {}, "head sizes"),
    ([(2, 3, 4, 8), (2, 3, 6, 8)], {}, "rank"),
])
def test_shape_rule_refuses_inconsistent_attention_naming_the_node(shapes, attrs, needle):
    if len(shapes) == 2:
        shapes = [shapes[0], shapes[1], (2, 3, 6)]
    with pytest.raises(ShapeError, match=needle) as info:
        infer(shapes, **attrs)
    assert "att0" in str(info.value)


def _onnx_reference(inputs: dict, attrs: dict, n_out: int, opset: int):
    """onnx's own reference implementation of one Attention node."""
    names = [n if n in inputs else "" for n in NAMES]
    while names and not names[-1]:
        names.pop()
    node = helper.make_node("Attention", names, list(OUTS[:n_out]), **attrs)
    ins = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(inputs[n].dtype), inputs[n].shape)
           for n in names if n]
    outs = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in OUTS[:n_out]]
    model = helper.make_model(helper.make_graph([node], "g", ins, outs), opset_imports=[helper.make_opsetid("", opset)])
    return ReferenceEvaluator(model).run(None, {n: inputs[n] for n in names if n}), names


def rand(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


CASES = {
    "gqa_causal_past_qk_bias": (dict(Q=rand(2, 6, 3, 8), K=rand(2, 2, 3, 8), V=rand(2, 2, 3, 5),
                                     attn_mask=rand(2, 1, 3, 7), past_key=rand(2, 2, 4, 8), past_value=rand(2, 2, 4, 5)),
                                dict(is_causal=1, qk_matmul_output_mode=2), 4, 23),
    "3d_softcap_bool_mask_probs": (dict(Q=rand(2, 5, 32), K=rand(2, 7, 16), V=rand(2, 7, 12),
                                        attn_mask=rng.random((5, 7)) > 0.3),
                                   dict(q_num_heads=4, kv_num_heads=2, softcap=1.5, qk_matmul_output_mode=3, scale=0.2),
                                   4, 23),
    "short_mask_nonpad_causal": (dict(Q=rand(3, 2, 2, 8), K=rand(3, 2, 6, 8), V=rand(3, 2, 6, 8),
                                      attn_mask=rand(3, 1, 2, 4), nonpad_kv_seqlen=np.array([6, 3, 2], np.int64)),
                                 dict(is_causal=1), 1, 24),
    "window_both_sides_with_past": (dict(Q=rand(1, 2, 4, 8), K=rand(1, 2, 4, 8), V=rand(1, 2, 4, 8),
                                         past_key=rand(1, 2, 3, 8), past_value=rand(1, 2, 3, 8)),
                                    dict(left_window_size=2, right_window_size=1), 3, 25),
    "fully_masked_row_is_zero": (dict(Q=rand(1, 1, 3, 4), K=rand(1, 1, 3, 4), V=rand(1, 1, 3, 4),
                                      attn_mask=np.array([[True, False, True], [False, False, False], [True] * 3])),
                                 dict(qk_matmul_output_mode=3), 4, 24),
    "fp16_gqa_causal": (dict(Q=rand(1, 4, 5, 8, dtype=np.float16), K=rand(1, 2, 5, 8, dtype=np.float16),
                             V=rand(1, 2, 5, 8, dtype=np.float16)), dict(is_causal=1), 1, 23),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_reference_matches_onnx_reference(case):
    inputs, attrs, n_out, opset = CASES[case]
    expected, names = _onnx_reference(inputs, attrs, n_out, opset)
    node = Node("Attention", names, list(OUTS[:n_out]), attrs, "att")
    got = run_reference(node, [inputs[n] if n else None for n in names])
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), rtol=1e-5 if g.dtype != np.float16 else 1e-3,
                                   atol=1e-6 if g.dtype != np.float16 else 1e-3)


def test_reference_fully_masked_row_gives_zero_output_and_probabilities():
    inputs, attrs, n_out, _ = CASES["fully_masked_row_is_zero"]
    node = Node("Attention", list(NAMES[:4]), list(OUTS[:n_out]), attrs, "att")
    y, _, _, probs = run_reference(node, [inputs[n] for n in NAMES[:4]])
    assert np.all(y[0, 0, 1] == 0) and np.all(probs[0, 0, 1] == 0)
    assert np.allclose(probs[0, 0, 0].sum(), 1.0) and probs[0, 0, 0, 1] == 0


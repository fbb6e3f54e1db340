import numpy as np

from .passes_testkit import graph, node, op_counts, run_and_compare, scalar

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.passes import recognize_attention

ATT = f"{POLYKIT_DOMAIN}:Attention"
SHAPES = {"q": (2, 2, 5, 8), "k": (2, 2, 7, 8), "v": (2, 2, 7, 4)}


def test_bert_style_export_with_transposed_k_division_and_mask():
    g = graph([node("Transpose", ["k"], "kt", perm=[0, 1, 3, 2]), node("MatMul", ["q", "kt"], "s"),
               node("Div", ["s", "sqrt_d"], "ss"), node("Add", ["ss", "mask"], "sm"),
               node("Softmax", ["sm"], "p", axis=-1), node("MatMul", ["p", "v"], "y")],
              {**SHAPES, "mask": (2, 1, 1, 7)}, ["y"], {"sqrt_d": scalar(np.sqrt(8.0))})
    out, changed = run_and_compare(g, recognize_attention)
    assert changed and op_counts(out) == {ATT: 1}
    (att,) = out.nodes
    assert att.inputs == ["q", "k", "v", "mask"] and att.outputs == ["y"]
    assert abs(att.attrs["scale"] - 1 / np.sqrt(8.0)) < 1e-6


def test_torch_sdpa_export_with_split_scales_bool_mask_and_nan_guard():
    # torch.onnx scaled_dot_product_attention: Q*sqrt(s), K^T*sqrt(s), Where(mask, 0, -inf), Softmax, NaN guard
    g = graph([node("Transpose", ["k"], "kt", perm=[0, 1, 3, 2]), node("Mul", ["q", "c"], "qs"),
               node("Mul", ["kt", "c"], "kts"), node("MatMul", ["qs", "kts"], "s"),
               node("Where", ["keep", "zero", "neg_inf"], "add_mask"), node("Add", ["s", "add_mask"], "sm"),
               node("Softmax", ["sm"], "p", axis=-1), node("IsNaN", ["p"], "isnan"),
               node("Where", ["isnan", "zero", "p"], "pg"), node("MatMul", ["pg", "v"], "y")],
              {**SHAPES, "keep": ((2, 1, 5, 7), np.bool_)}, ["y"],
              {"c": scalar(8 ** -0.25), "zero": scalar(0.0), "neg_inf": scalar(-np.inf)})
    out, _ = run_and_compare(g, recognize_attention)
    assert op_counts(out) == {"Where": 1, ATT: 1}
    att = out.nodes[-1]
    assert att.attrs["nan_probs_to_zero"] == 1 and abs(att.attrs["scale"] - 8 ** -0.5) < 1e-6


def test_k_transposed_by_other_means_gets_a_transpose_inserted():
    g = graph([node("MatMul", ["q", "kt"], "s"), node("Softmax", ["s"], "p"), node("MatMul", ["p", "v"], "y")],
              {"q": (5, 8), "kt": (8, 7), "v": (7, 4)}, ["y"])
    out, _ = run_and_compare(g, recognize_attention)
    assert op_counts(out) == {"Transpose": 1, ATT: 1}
    assert out.nodes[0].attrs["perm"] == [1, 0] and out.nodes[1].attrs["scale"] == 1.0


def test_softmax_over_another_axis_is_not_attention():
    g = graph([node("MatMul", ["q", "kt"], "s"), node("Softmax", ["s"], "p", axis=0), node("MatMul", ["p", "v"], "y")],
              {"q": (5, 8), "kt": (8, 7), "v": (7, 4)}, ["y"])
    assert not recognize_attention(g)


def test_probabilities_read_elsewhere_block_the_rewrite():
    g = graph([node("MatMul", ["q", "kt"], "s"), node("Softmax", ["s"], "p"), node("MatMul", ["p", "v"], "y")],
              {"q": (5, 8), "kt": (8, 7), "v": (7, 4)}, ["y", "p"])
    assert not recognize_attention(g)

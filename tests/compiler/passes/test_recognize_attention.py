import numpy as np
import pytest

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


def _windowed(B, W, H=2, N=5, d=4, *, bias_shape=(1, 2, 5, 5), wmask_shape=(1, 3, 1, 5, 5), const=True, split=None):
    """Swin's shifted-window block: scores [B*W, H, N, N] + bias, viewed [B, W, H, N, N] + a
    per-window mask, viewed back, softmax, times V."""
    rng = np.random.default_rng(1)
    qkv = {"q": (B * W, H, N, d), "k": (B * W, H, N, d), "v": (B * W, H, N, d)}
    terms = {"bias": rng.standard_normal(bias_shape).astype(np.float32),
             "wmask": np.where(rng.random(wmask_shape) > 0.5, 0.0, -100.0).astype(np.float32)}
    inits = {"c": scalar(d ** -0.5), "split": np.array(split or [B, W, H, N, N], np.int64),
             "merge": np.array([-1, H, N, N], np.int64), **(terms if const else {})}
    inputs = {**qkv, **({} if const else {n: t.shape for n, t in terms.items()})}
    return graph([node("Transpose", ["k"], "kt", perm=[0, 1, 3, 2]), node("Mul", ["q", "c"], "qs"),
                  node("MatMul", ["qs", "kt"], "s"), node("Add", ["s", "bias"], "sb"),
                  node("Reshape", ["sb", "split"], "s5"), node("Add", ["s5", "wmask"], "sm5"),
                  node("Reshape", ["sm5", "merge"], "sm"), node("Softmax", ["sm"], "p", axis=-1),
                  node("MatMul", ["p", "v"], "y")], inputs, ["y"], inits)


def _folded(g):
    from polykit.compiler.passes import fold_constants

    changed = recognize_attention(g)
    while fold_constants(g):
        pass
    return changed


def test_shifted_window_mask_of_one_image_folds_into_one_mask_over_the_windows():
    out, changed = run_and_compare(_windowed(1, 3), _folded, rtol=1e-4)
    assert changed and op_counts(out) == {ATT: 1}
    (att,) = out.nodes
    assert att.inputs[:3] == ["q", "k", "v"] and out.initializers[att.inputs[3]].shape == (3, 2, 5, 5)


def test_shifted_windows_of_a_batch_become_attention_over_batch_and_window_dims():
    out, changed = run_and_compare(_windowed(2, 3), _folded, rtol=1e-4)
    assert changed and op_counts(out) == {"Reshape": 4, ATT: 1}
    att = next(n for n in out.nodes if n.op_type == "Attention")
    assert [out.value(t).shape for t in att.inputs[:3]] == [(2, 3, 2, 5, 4)] * 3
    assert out.initializers[att.inputs[3]].shape == (1, 3, 2, 5, 5)  # broadcast over the batch
    assert out.value(att.outputs[0]).shape == (2, 3, 2, 5, 4)


@pytest.mark.parametrize("B, W, H, N, d", [(3, 2, 3, 7, 5), (2, 5, 1, 3, 8)])
def test_shifted_windows_of_odd_sizes_match_the_unfused_graph(B, W, H, N, d):
    g = _windowed(B, W, H, N, d, bias_shape=(1, H, N, N), wmask_shape=(1, W, 1, N, N))
    out, changed = run_and_compare(g, _folded, rtol=1e-4)
    assert changed and op_counts(out)[ATT] == 1


def test_window_terms_varying_over_the_batch_and_computed_at_run_time_stay_graph_ops():
    g = _windowed(2, 3, bias_shape=(6, 1, 5, 5), wmask_shape=(2, 3, 2, 5, 1), const=False)
    out, changed = run_and_compare(g, recognize_attention, rtol=1e-4)
    assert changed and op_counts(out)[ATT] == 1 and op_counts(out)["Expand"] == 1
    att = next(n for n in out.nodes if n.op_type == "Attention")
    assert out.value(att.inputs[3]).shape == (2, 3, 2, 5, 5)


def test_a_view_that_does_not_split_the_scores_batch_is_left_alone():
    g = _windowed(1, 3, split=[1, 3, 5, 2, 5], wmask_shape=(1, 3, 1, 1, 5))  # mixes heads and queries
    assert not recognize_attention(g)
    assert op_counts(g)["Softmax"] == 1

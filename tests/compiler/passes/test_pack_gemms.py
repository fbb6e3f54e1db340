"""pack_gemms: GEMMs reading one tensor with constant weights of one K become one GEMM + Split;
the outputs are unchanged (evaluated before and after), and what must stay apart stays."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.passes import pack_gemms
from tests.compiler.passes.passes_testkit import graph, node, op_counts, run_and_compare

RNG = np.random.default_rng(0)


def w(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def three_projections(bias=(True, True, True), outputs=("yq", "yk", "yv"), x_shape=(2, 5, 8)):
    """x -> three MatMuls of widths 8, 4, 6 (each + bias where `bias` says) -> Relu each -> outputs."""
    nodes, inits = [], {}
    for i, (n, width) in enumerate(zip("qkv", (8, 4, 6))):
        inits[f"w{n}"] = w(x_shape[-1], width)
        nodes.append(node("MatMul", ["x", f"w{n}"], f"{n}m", name=f"{n}_proj"))
        last = f"{n}m"
        if bias[i]:
            inits[f"b{n}"] = w(width)
            nodes.append(node("Add", [f"b{n}", last] if n == "k" else [last, f"b{n}"], f"{n}b"))  # either order
            last = f"{n}b"
        nodes.append(node("Relu", [last], f"y{n}"))
    return graph(nodes, {"x": x_shape}, list(outputs), inits)


def test_three_projections_with_biases_become_one_matmul_one_add_and_a_split():
    g, changed = run_and_compare(three_projections(), pack_gemms)
    assert changed
    counts = op_counts(g)
    assert counts["MatMul"] == 1 and counts["Add"] == 1 and counts["Split"] == 1, counts
    (mm,) = [n for n in g.nodes if n.op_type == "MatMul"]
    assert g.initializers[mm.inputs[1]].shape == (8, 18)
    (split,) = [n for n in g.nodes if n.op_type == "Split"]
    assert split.outputs == ["qb", "kb", "vb"] and split.attrs["axis"] == 2
    assert g.initializers[split.inputs[1]].tolist() == [8, 4, 6]


def test_a_member_without_a_bias_packs_with_zeros():
    g, changed = run_and_compare(three_projections(bias=(True, False, True)), pack_gemms)
    assert changed and op_counts(g)["MatMul"] == 1
    (add,) = [n for n in g.nodes if n.op_type == "Add"]
    packed_bias = g.initializers[add.inputs[1]]
    assert packed_bias.shape == (18,) and not packed_bias[8:12].any()


def test_no_bias_at_all_packs_without_an_add():
    g, changed = run_and_compare(three_projections(bias=(False, False, False), x_shape=(7, 8)), pack_gemms)
    assert changed and op_counts(g)["Add"] == 0 and op_counts(g)["MatMul"] == 1
    (split,) = [n for n in g.nodes if n.op_type == "Split"]
    assert split.attrs["axis"] == 1


def test_a_member_whose_output_is_a_graph_output_stays_out():
    g = three_projections(bias=(False, True, True))
    g.outputs.append("qm")  # q's projection itself is a graph output
    g2, changed = run_and_compare(g, pack_gemms)
    assert changed
    mms = [n for n in g2.nodes if n.op_type == "MatMul"]
    assert len(mms) == 2 and any(n.name == "q_proj" for n in mms)
    assert "qm" in g2.outputs and any("qm" in n.outputs for n in mms)


def test_a_kept_projection_keeps_its_member_out_and_one_member_left_packs_nothing():
    g = three_projections()
    assert not pack_gemms(g, keep=frozenset({"qm", "km"}))
    assert op_counts(g)["MatMul"] == 3


def test_a_kept_bias_output_packs_its_matmul_and_leaves_its_add():
    g = three_projections()
    assert pack_gemms(g, keep=frozenset({"qb"}))
    counts = op_counts(g)
    assert counts["MatMul"] == 1 and counts["Add"] == 2, counts  # the packed bias (k, v) and q's own Add
    assert any(n.op_type == "Add" and n.outputs == ["qb"] and "qm" in n.inputs for n in g.nodes)


def test_skipped_layers_stay_out():
    g = three_projections()
    assert not pack_gemms(g, skip=("q_proj", "k_proj"))


def test_matmuls_on_different_inputs_or_with_a_non_constant_weight_do_not_pack():
    nodes = [node("MatMul", ["x", "w1"], "a"), node("MatMul", ["z", "w2"], "b"),  # K 8 and K 6: other inputs
             node("MatMul", ["x", "z2"], "c"), *(node("Relu", [n], f"{n}2") for n in "abc")]  # c: a weight input
    g = graph(nodes, {"x": (3, 8), "z": (3, 6), "z2": (8, 5)}, ["a2", "b2", "c2"], {"w1": w(8, 4), "w2": w(6, 4)})
    assert not pack_gemms(g)


def test_a_bias_that_is_not_along_the_last_axis_stays_a_separate_add():
    nodes = [node("MatMul", ["x", "w1"], "a"), node("Add", ["a", "rowbias"], "a2"), node("MatMul", ["x", "w2"], "b"),
             node("Relu", ["b"], "b2")]
    g = graph(nodes, {"x": (3, 8)}, ["a2", "b2"], {"w1": w(8, 4), "w2": w(8, 4), "rowbias": w(3, 1)})
    g2, changed = run_and_compare(g, pack_gemms)
    assert changed and op_counts(g2)["Add"] == 1
    (add,) = [n for n in g2.nodes if n.op_type == "Add"]
    assert "rowbias" in add.inputs  # the member's output is its MatMul's; the Add reads the Split's piece


@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemms_pack_along_n_with_transB_and_beta_folded_into_the_bias(trans_b):
    def weight(n):
        return w(n, 8) if trans_b else w(8, n)

    nodes = [node("Gemm", ["x", "w1", "c1"], "a", transB=trans_b, beta=0.5),
             node("Gemm", ["x", "w2"], "b", transB=trans_b),
             node("Gemm", ["x", "w3", "c3"], "c", transB=trans_b, alpha=1.0),
             *(node("Relu", [n], f"{n}2") for n in "abc")]
    g = graph(nodes, {"x": (4, 8)}, ["a2", "b2", "c2"], {"w1": weight(5), "w2": weight(3), "w3": weight(7),
                                                       "c1": w(5), "c3": w(1, 7)})
    g2, changed = run_and_compare(g, pack_gemms)
    assert changed
    (gemm,) = [n for n in g2.nodes if n.op_type == "Gemm"]
    assert gemm.attrs["transB"] == trans_b
    assert g2.initializers[gemm.inputs[1]].shape == ((15, 8) if trans_b else (8, 15))
    assert g2.initializers[gemm.inputs[2]].shape == (15,)


def test_gemms_of_other_transB_or_alpha_do_not_pack_together():
    nodes = [node("Gemm", ["x", "w1"], "a", transB=1), node("Gemm", ["x", "w2"], "b", transB=0),
             node("Gemm", ["x", "w3"], "c", alpha=2.0), *(node("Relu", [n], f"{n}2") for n in "abc")]
    g = graph(nodes, {"x": (4, 8)}, ["a2", "b2", "c2"], {"w1": w(5, 8), "w2": w(8, 3), "w3": w(8, 2)})
    assert not pack_gemms(g)


def test_half_precision_projections_pack_in_their_dtype():
    nodes = [node("MatMul", ["x", "w1"], "a"), node("MatMul", ["x", "w2"], "b"), node("Relu", ["a"], "ya"),
             node("Relu", ["b"], "yb")]
    g = graph(nodes, {"x": ((2, 8), np.float16)}, ["ya", "yb"],
              {"w1": w(8, 4).astype(np.float16), "w2": w(8, 4).astype(np.float16)})
    g2, changed = run_and_compare(g, pack_gemms, rtol=1e-3, atol=1e-3)
    assert changed and op_counts(g2)["MatMul"] == 1
    (mm,) = [n for n in g2.nodes if n.op_type == "MatMul"]
    assert g2.initializers[mm.inputs[1]].dtype == np.float16


def test_projections_of_a_transposed_tensor_stay_apart_for_move_row_transposes():
    g = three_projections()
    g.nodes.insert(0, node("Transpose", ["x0"], "x", perm=[1, 0, 2]))
    g.inputs = ["x0"]
    g.values.pop("x")
    g = graph(g.nodes, {"x0": (5, 2, 8)}, g.outputs, g.initializers)
    assert not pack_gemms(g)


def _gated_mlp():
    """x -> gate, up, other MatMuls; SiLU(gate) * up (Sigmoid, Mul, Mul); other -> Relu."""
    nodes = [node("MatMul", ["x", "wg"], "g"), node("MatMul", ["x", "wu"], "u"), node("MatMul", ["x", "wo"], "o"),
             node("Sigmoid", ["g"], "gs"), node("Mul", ["g", "gs"], "silu"), node("Mul", ["silu", "u"], "h"),
             node("Relu", ["o"], "ro")]
    return graph(nodes, {"x": (2, 3, 8)}, ["h", "ro"], {"wg": w(8, 12), "wu": w(8, 12), "wo": w(8, 5)})


def test_members_that_meet_in_an_elementwise_op_stay_apart_unless_gated_is_asked():
    g = _gated_mlp()
    assert not pack_gemms(g)  # gate and up meet in the Mul; "o" alone is no group
    g2, changed = run_and_compare(_gated_mlp(), lambda graph_: pack_gemms(graph_, gated=True))
    assert changed and op_counts(g2)["MatMul"] == 1 and op_counts(g2)["Split"] == 1


@pytest.mark.parametrize("factor,folds", [(0.125, True), (4.0, True), (0.3, False), (-0.5, False)])
def test_a_power_of_two_scale_after_the_bias_folds_into_the_members_columns(factor, folds):
    nodes = [node("MatMul", ["x", "wq"], "qm"), node("Add", ["qm", "bq"], "qb"), node("Mul", ["qb", "s"], "qs"),
             node("MatMul", ["x", "wk"], "km"), node("Relu", ["qs"], "yq"), node("Relu", ["km"], "yk")]
    g = graph(nodes, {"x": (2, 5, 8)}, ["yq", "yk"], {"wq": w(8, 4), "bq": w(4), "wk": w(8, 6),
                                                      "s": np.array(factor, np.float32)})
    g2, changed = run_and_compare(g, pack_gemms)
    assert changed and op_counts(g2)["MatMul"] == 1
    assert op_counts(g2)["Mul"] == (0 if folds else 1)
    (split,) = [n for n in g2.nodes if n.op_type == "Split"]
    assert split.outputs[0] == ("qs" if folds else "qb")


def test_projections_of_a_tensor_with_dynamic_dims_stay_apart():
    from polykit.compiler.ir.graph import Value
    from polykit.compiler.ir.symbolic import SymInt, symbol

    g = three_projections()
    g.values["x"] = Value("x", np.dtype(np.float32), (SymInt(2, symbol("B")), 5, 8))
    assert not g.values["x"].is_static
    assert not pack_gemms(g)

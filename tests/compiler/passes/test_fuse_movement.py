"""fuse_movement: torch.roll exports, window partition / merge chains and selections of transposed
tensors become single PermutedCopy layers (outputs compared with the graph before, by the evaluator)."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.graph.evaluator import evaluate_graph
from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.passes import fuse_movement, optimize

from .passes_testkit import feeds_for, graph, node, op_counts, run_and_compare

COPY = f"{POLYKIT_DOMAIN}:PermutedCopy"
INT_MAX = 2**63 - 1


class Nodes:
    """Collects nodes and the constants they read."""

    def __init__(self):
        self.nodes, self.consts = [], {}

    def const(self, name, value):
        self.consts[name] = np.asarray(value, np.int64)
        return name

    def add(self, op, inputs, out, **attrs):
        self.nodes.append(node(op, inputs, out, **attrs))
        return out

    def slice(self, x, out, start, end, axis, step=None):
        ins = [x, self.const(f"{out}_s", [start]), self.const(f"{out}_e", [end]), self.const(f"{out}_a", [axis])]
        if step is not None:
            ins.append(self.const(f"{out}_t", [step]))
        return self.add("Slice", ins, out)

    def roll(self, x, out, shift, axis):
        """torch.roll(x, shift, axis) as the TorchScript exporter writes it: Concat(x[-s:], x[:-s])."""
        head = self.slice(x, f"{out}_head", -shift, INT_MAX, axis)
        tail = self.slice(x, f"{out}_tail", 0, -shift, axis)
        return self.add("Concat", [head, tail], out, axis=axis)

    def reshape(self, x, out, shape):
        return self.add("Reshape", [x, self.const(f"{out}_shape", shape)], out)

    def graph(self, inputs, outputs):
        return graph(self.nodes, inputs, outputs, self.consts)


def copies(g):
    return [n for n in g.nodes if n.op_type == "PermutedCopy"]


@pytest.mark.parametrize("shift", [3, -2, 7])
def test_a_torch_roll_on_one_axis_is_one_copy(shift):
    b = Nodes()
    b.roll("x", "y", shift, 1)
    out, changed = run_and_compare(b.graph({"x": (2, 9, 4)}, ["y"]), fuse_movement)
    assert changed and op_counts(out) == {COPY: 1}
    assert copies(out)[0].attrs["starts"] == [0, (-shift) % 9, 0]


def test_rolls_on_two_axes_in_a_row_merge_into_one_copy():
    b = Nodes()
    b.roll("x", "r1", -3, 1)
    b.roll("r1", "y", -3, 2)
    out, changed = run_and_compare(b.graph({"x": (1, 14, 14, 8)}, ["y"]), fuse_movement)
    assert changed and op_counts(out) == {COPY: 1}
    assert copies(out)[0].attrs["starts"] == [0, 3, 3, 0]


def test_a_roll_and_its_inverse_leave_a_view():
    b = Nodes()
    b.roll("x", "r", 4, 0)
    b.roll("r", "y", -4, 0)
    b.add("Relu", ["y"], "z")
    out, changed = run_and_compare(b.graph({"x": (10, 3)}, ["z"]), fuse_movement)
    assert changed and op_counts(out) == {"Reshape": 1, "Relu": 1}


def partition(b, x, out, h, w, c, win, shift):
    """Swin's shifted window partition: roll by -shift on H and W, [B,H,W,C] -> [B*nW, win*win, C]."""
    r = b.roll(b.roll(x, f"{out}_r1", -shift, 1), f"{out}_r2", -shift, 2)
    v = b.reshape(r, f"{out}_v", [1, h // win, win, w // win, win, c])
    t = b.add("Transpose", [v], f"{out}_t", perm=[0, 1, 3, 2, 4, 5])
    return b.reshape(t, out, [-1, win * win, c])


def merge(b, x, out, h, w, c, win, shift):
    """The window merge: [B*nW, win*win, C] -> [B,H,W,C], then roll back by +shift."""
    v = b.reshape(x, f"{out}_v", [1, h // win, w // win, win, win, c])
    t = b.add("Transpose", [v], f"{out}_t", perm=[0, 1, 3, 2, 4, 5])
    m = b.reshape(t, f"{out}_m", [1, h, w, c])
    return b.roll(b.roll(m, f"{out}_r1", shift, 1), out, shift, 2)


def test_shifted_window_partition_is_one_copy():
    b = Nodes()
    partition(b, "x", "y", 14, 21, 5, 7, 3)
    out, changed = run_and_compare(b.graph({"x": (1, 14, 21, 5)}, ["y"]), fuse_movement)
    assert changed and op_counts(out) == {COPY: 1, "Reshape": 1}
    (copy,) = copies(out)
    assert copy.inputs == ["x"] and copy.attrs["starts"] == [0, 3, 3, 0]


def test_window_merge_with_the_roll_back_is_one_copy():
    b = Nodes()
    merge(b, "x", "y", 14, 21, 5, 7, 3)
    out, changed = run_and_compare(b.graph({"x": (6, 49, 5)}, ["y"]), fuse_movement)
    assert changed and op_counts(out) == {COPY: 1, "Reshape": 1}
    assert copies(out)[0].attrs["out_shifts"] == [0, 3, 3, 0]


def test_partition_then_merge_round_trip_keeps_the_values():
    b = Nodes()
    p = partition(b, "x", "p", 7, 14, 3, 7, 2)
    q = b.add("Neg", [p], "q")
    merge(b, q, "y", 7, 14, 3, 7, 2)
    out, _ = run_and_compare(b.graph({"x": (1, 7, 14, 3)}, ["y"]), fuse_movement)
    assert op_counts(out)[COPY] == 2 and "Transpose" not in op_counts(out)


def test_qkv_selections_of_a_transpose_read_the_projection_directly():
    b = Nodes()
    t = b.add("Transpose", ["qkv"], "t", perm=[2, 0, 3, 1, 4])
    for i, name in enumerate("qkv_"[:3]):
        b.add("Gather", [t, b.const(f"i{i}", i)], name, axis=0)
    g = b.graph({"qkv": (4, 7, 3, 2, 5)}, ["q", "k", "v"])
    out, changed = run_and_compare(g, fuse_movement)
    assert changed and op_counts(out) == {COPY: 3}
    assert all(c.inputs == ["qkv"] for c in copies(out))
    assert [c.attrs.get("starts", [0] * 5)[2] for c in copies(out)] == [0, 1, 2]


def test_a_slice_of_a_transpose_is_one_copy():
    b = Nodes()
    t = b.add("Transpose", ["x"], "t", perm=[1, 0, 2])
    b.slice(t, "y", 1, 4, 0)
    b.add("Exp", [t], "z")  # the Transpose is read elsewhere too: it stays, the Slice still reads x
    out, changed = run_and_compare(b.graph({"x": (3, 6, 2)}, ["y", "z"]), fuse_movement)
    assert changed and op_counts(out) == {COPY: 1, "Transpose": 1, "Exp": 1}


def test_a_negative_gather_index_counts_from_the_end():
    b = Nodes()
    t = b.add("Transpose", ["x"], "t", perm=[2, 0, 1])
    b.add("Gather", [t, b.const("i", -1)], "y", axis=0)
    out, changed = run_and_compare(b.graph({"x": (3, 4, 5)}, ["y"]), fuse_movement)
    assert changed and op_counts(out) == {COPY: 1}


def test_pieces_that_do_not_follow_each_other_stay_a_concat():
    b = Nodes()
    b.slice("x", "a", 5, 8, 0)  # x[8] is skipped
    b.slice("x", "c", 0, 3, 0)
    b.add("Concat", ["a", "c"], "y", axis=0)
    out, changed = run_and_compare(b.graph({"x": (9, 2)}, ["y"]), fuse_movement)
    assert not changed and op_counts(out)["Concat"] == 1


def test_a_partial_cyclic_window_is_a_copy():
    b = Nodes()
    b.slice("x", "a", 6, 9, 0)
    b.slice("x", "c", 0, 2, 0)
    b.add("Concat", ["a", "c"], "y", axis=0)
    out, changed = run_and_compare(b.graph({"x": (9, 2)}, ["y"]), fuse_movement)
    assert changed and copies(out)[0].attrs["window"] == [5, 2]


def test_a_roll_read_by_two_readers_does_not_merge_into_the_transpose():
    b = Nodes()
    r = b.roll("x", "r", 2, 1)
    b.add("Transpose", [r], "y", perm=[0, 2, 1])
    b.add("Neg", [r], "z")
    out, _ = run_and_compare(b.graph({"x": (2, 5, 3)}, ["y", "z"]), fuse_movement)
    assert op_counts(out) == {COPY: 1, "Transpose": 1, "Neg": 1}


def test_a_kept_intermediate_is_not_fused_away():
    b = Nodes()
    r = b.roll("x", "r", 2, 1)
    b.add("Transpose", [r], "y", perm=[0, 2, 1])
    g = b.graph({"x": (2, 5, 3)}, ["y"])
    out, _ = run_and_compare(g, lambda g: fuse_movement(g, keep=frozenset({"r"})))
    assert "r" in {o for n in out.nodes for o in n.outputs}


def test_optimize_fuses_a_shifted_window_block_and_the_values_hold():
    b = Nodes()
    p = partition(b, "x", "p", 14, 14, 4, 7, 3)
    q = b.add("Sigmoid", [p], "q")
    merge(b, q, "y", 14, 14, 4, 7, 3)
    g = b.graph({"x": (1, 14, 14, 4)}, ["y"])
    out = optimize(g)
    feeds = feeds_for(g)
    np.testing.assert_allclose(evaluate_graph(out, feeds)["y"], evaluate_graph(g, feeds)["y"], rtol=1e-6)
    assert op_counts(out)[COPY] == 2 and not {"Slice", "Concat", "Transpose"} & set(op_counts(out))


def strided(b, x, out, starts, steps, axes):
    n = len(axes)
    ins = [x, b.const(f"{out}_s", starts), b.const(f"{out}_e", [INT_MAX] * n), b.const(f"{out}_a", axes),
           b.const(f"{out}_t", steps)]
    return b.add("Slice", ins, out)


def test_swin_patch_merging_phases_are_one_copy():
    """cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], -1)."""
    b = Nodes()
    parts = [strided(b, "x", f"p{i}", [h, w], [2, 2], [1, 2]) for i, (h, w) in enumerate([(0, 0), (1, 0), (0, 1), (1, 1)])]
    b.add("Concat", parts, "y", axis=-1)
    out, changed = run_and_compare(b.graph({"x": (2, 6, 10, 3)}, ["y"]), fuse_movement)
    assert changed and op_counts(out) == {COPY: 1}


def test_space_to_depth_phases_in_row_major_order_are_one_copy():
    b = Nodes()
    parts = [strided(b, "x", f"p{h}{w}", [h, w], [3, 2], [2, 3]) for h in range(3) for w in range(2)]
    b.add("Concat", parts, "y", axis=1)
    out, changed = run_and_compare(b.graph({"x": (1, 2, 9, 4)}, ["y"]), fuse_movement)
    assert changed and op_counts(out) == {COPY: 1}


def test_phases_in_no_nesting_order_stay():
    b = Nodes()
    order = [(0, 0), (1, 1), (0, 1), (1, 0)]
    parts = [strided(b, "x", f"p{i}", [h, w], [2, 2], [0, 1]) for i, (h, w) in enumerate(order)]
    b.add("Concat", parts, "y", axis=2)
    out, changed = run_and_compare(b.graph({"x": (4, 4, 3)}, ["y"]), fuse_movement)
    assert not changed and op_counts(out)["Concat"] == 1


def test_nested_strided_slices_as_torch_exports_them_meet_in_one_copy():
    b = Nodes()
    rows = [strided(b, "x", f"r{h}", [h], [2], [1]) for h in range(2)]
    parts = [strided(b, rows[h], f"p{h}{w}", [w], [2], [2]) for w in range(2) for h in range(2)]
    b.add("Concat", parts, "y", axis=-1)
    out, changed = run_and_compare(b.graph({"x": (1, 6, 8, 5)}, ["y"]), fuse_movement)
    assert changed and op_counts(out) == {COPY: 1}


def test_a_slice_of_a_slice_is_one_slice_and_the_inner_goes():
    b = Nodes()
    inner = strided(b, "x", "a", [1, 0], [2, 1], [0, 1])
    b.slice(inner, "y", 1, 3, 1)
    out, changed = run_and_compare(b.graph({"x": (9, 5)}, ["y"]), fuse_movement)
    assert changed and op_counts(out) == {"Slice": 1} and out.nodes[0].inputs[0] == "x"


def test_rotate_half_is_a_roll_times_signs():
    """Rotary embeddings: cat(-x[..., d/2:], x[..., :d/2]) * sin + x * cos."""
    b = Nodes()
    x2 = b.slice("x", "x2", 4, INT_MAX, -1)
    x1 = b.slice("x", "x1", 0, 4, -1)
    neg = b.add("Neg", [x2], "n")
    rot = b.add("Concat", [neg, x1], "rot", axis=-1)
    b.add("Mul", [rot, "sin"], "a")
    b.add("Mul", ["x", "cos"], "c")
    b.add("Add", ["a", "c"], "y")
    g = b.graph({"x": (1, 2, 5, 8), "sin": (5, 8), "cos": (5, 8)}, ["y"])
    out, changed = run_and_compare(g, fuse_movement)
    assert changed and op_counts(out) == {COPY: 1, "Mul": 3, "Add": 1}


def test_a_transpose_of_a_selected_key_composes_into_the_selection():
    b = Nodes()
    t = b.add("Transpose", ["qkv"], "t", perm=[2, 0, 3, 1, 4])
    k = b.add("Gather", [t, b.const("one", 1)], "k", axis=0)
    b.add("Transpose", [k], "kt", perm=[0, 1, 3, 2])
    out, changed = run_and_compare(b.graph({"qkv": (4, 7, 3, 2, 5)}, ["kt"]), fuse_movement)
    assert changed and op_counts(out) == {COPY: 1}


def test_a_transpose_that_moves_only_unit_dims_is_a_view():
    b = Nodes()
    b.add("Transpose", ["x"], "t", perm=[1, 0, 2])
    b.add("Relu", ["t"], "y")
    out, changed = run_and_compare(b.graph({"x": (1, 7, 5)}, ["y"]), fuse_movement)
    assert changed and op_counts(out) == {"Reshape": 1, "Relu": 1}


def test_vit_qkv_selections_through_squeeze_and_head_transposes_are_three_copies():
    """torchvision MultiheadAttention: [S, 1, 3, D] -> unsqueeze, transpose, squeeze -> q, k, v = p[0..2],
    each reshaped to heads and transposed."""
    b = Nodes()
    u = b.add("Unsqueeze", ["qkv", b.const("ax0", [0])], "u")
    t = b.add("Transpose", [u], "t", perm=[3, 1, 2, 0, 4])
    sq = b.add("Squeeze", [t, b.const("ax3", [3])], "sq")
    for i, name in enumerate("qkv"):
        g = b.add("Gather", [sq, b.const(f"i{i}", i)], f"{name}_g", axis=0)
        r = b.reshape(g, f"{name}_r", [7, 2, 4])
        b.add("Transpose", [r], name, perm=[1, 0, 2])
    out, changed = run_and_compare(b.graph({"qkv": (7, 1, 3, 8)}, ["q", "k", "v"]), fuse_movement)
    assert changed and op_counts(out) == {COPY: 3, "Unsqueeze": 1}  # the copies read the (view) Unsqueeze


def test_a_split_of_a_transpose_is_one_copy_per_output():
    """timm's q, k, v = qkv.reshape(B, N, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0), exported as Split."""
    b = Nodes()
    t = b.add("Transpose", ["qkv"], "t", perm=[2, 0, 3, 1, 4])
    b.nodes.append(node("Split", [t], ["s0", "s1", "s2"], axis=0, num_outputs=3))
    for i in range(3):
        b.add("Squeeze", [f"s{i}", b.const(f"ax{i}", [0])], "qkv"[i])
    out, changed = run_and_compare(b.graph({"qkv": (1, 7, 3, 2, 4)}, ["q", "k", "v"]), fuse_movement)
    assert changed and op_counts(out) == {COPY: 3, "Squeeze": 3}


def test_more_compositions_than_sweeps_all_happen():
    b = Nodes()
    for i in range(40):
        r = b.roll("x", f"r{i}", 1 + i % 3, 0)
        b.add("Transpose", [r], f"y{i}", perm=[1, 0])
    g = b.graph({"x": (5, 3)}, [f"y{i}" for i in range(40)])
    out, changed = run_and_compare(g, fuse_movement)
    assert changed and op_counts(out) == {COPY: 40}

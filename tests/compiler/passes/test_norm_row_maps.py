"""fold_norm_row_maps: a row-permuting Transpose / PermutedCopy of a LayerNorm's output becomes the
norm's row map (ops/nn/norm_row_map.py). Swin-style window blocks (shifted: the rolled partition,
a PermutedCopy; plain: the partition Transpose) at odd sizes and windows, on the cpu target against
onnxruntime, any transpose keeping the row against the reference evaluator; the fitting of a row permutation to the map's form over random transposes and rolls;
and the copies the pass leaves (moving the normalized axis, a second reader, a window)."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.ops.nn.norm_row_map import IN_MAP, ROW_MAP, check_row_map, row_destinations
from polykit.compiler.ops.nn.normalization_reference import layer_normalization, mapped_normalization
from polykit.compiler.passes.norm_row_maps import fit_row_map, fold_norm_row_maps
from polykit.errors import RuntimeInputError
from tests.compiler.passes.passes_testkit import graph, node, run_and_compare
from tests.compiler.passes.test_window_attention_blocks import _run, window_block

RNG = np.random.default_rng(30)


@pytest.mark.parametrize("B, Hs, Ws, C, heads, win, shift", [
    (2, 6, 9, 12, 3, 3, 1),    # shifted: the rolled partition (a PermutedCopy) goes into the norm
    (3, 10, 15, 10, 2, 5, 2),
    (1, 14, 7, 8, 2, 7, 3),    # windows of 7, one batch
    (2, 6, 9, 12, 3, 3, 0),    # plain: the partition Transpose goes into the norm
    (3, 4, 6, 8, 2, 2, 0),
    (2, 14, 21, 6, 1, 7, 0),
])
def test_window_partitions_are_written_by_the_layer_norm_and_match_onnxruntime(B, Hs, Ws, C, heads, win, shift):
    plan = _run(window_block(B, Hs, Ws, C, heads, win, shift), B, Hs, Ws, C)
    kinds = [layer.kind for layer in plan.layers]
    (norm,) = [layer for layer in plan.layers if layer.kind == "LayerNormalization"]
    assert "Transpose" not in kinds and "PermutedCopy" not in kinds
    assert norm.domain == POLYKIT_DOMAIN and ROW_MAP in norm.attrs
    shifts = [d["shift"] for d in norm.attrs[ROW_MAP]["dims"]]
    assert any(shifts) == bool(shift)


def ln_graph(shape, nodes, outputs, **consts):
    C = shape[-1]
    inits = {"s": (RNG.standard_normal(C) + 1).astype(np.float32), "b": RNG.standard_normal(C).astype(np.float32),
             **consts}
    return graph([node("LayerNormalization", ["x", "s", "b"], "ln", axis=-1), *nodes], {"x": shape}, outputs, inits)


@pytest.mark.parametrize("shape, perm", [((3, 5, 7, 6), [2, 0, 1, 3]), ((2, 3, 4, 5, 9), [3, 2, 1, 0, 4]),
                                         ((5, 7, 4), [1, 0, 2])])
def test_any_transpose_that_keeps_the_normalized_axis_last_folds(shape, perm):
    g = ln_graph(shape, [node("Transpose", ["ln"], "y", perm=perm)], ["y"])
    after, changed = run_and_compare(g, fold_norm_row_maps)
    assert changed and [(n.domain, n.op_type) for n in after.nodes] == [(POLYKIT_DOMAIN, "LayerNormalization")]


def test_a_transpose_moving_the_normalized_axis_stays():
    g = ln_graph((3, 5, 6), [node("Transpose", ["ln"], "y", perm=[0, 2, 1])], ["y"])
    assert not fold_norm_row_maps(g)


def test_a_norm_output_read_elsewhere_keeps_its_copy():
    g = ln_graph((3, 5, 6), [node("Transpose", ["ln"], "y", perm=[1, 0, 2]), node("Relu", ["ln"], "r")], ["y", "r"])
    assert not fold_norm_row_maps(g)


def test_a_second_copy_composes_into_the_map_and_a_view_between_passes():
    g = ln_graph((4, 6, 5), [node("Transpose", ["ln"], "t", perm=[1, 0, 2]),
                             node("Reshape", ["t", "to4d"], "v"),
                             node("Transpose", ["v"], "y", perm=[0, 2, 1, 3])], ["y"],
                 to4d=np.array([2, 3, 4, 5], np.int64))
    after, changed = run_and_compare(g, fold_norm_row_maps)
    assert changed and [n.op_type for n in after.nodes] == ["LayerNormalization"]
    assert after.nodes[0].domain == POLYKIT_DOMAIN and after.value("y").shape == (2, 4, 3, 5)


def test_the_mapped_reference_writes_the_rows_of_the_plain_norm_to_their_destinations():
    x = RNG.standard_normal((4, 6, 5)).astype(np.float32)
    ins = [x, np.ones(5, np.float32), np.zeros(5, np.float32)]
    row_map = {"dims": [{"shift": 1, "pieces": [[4, 1]]}, {"shift": 0, "pieces": [[2, 12], [3, 4]]}],
               "shape": [24, 5]}
    mapped = Node("LayerNormalization", ["x", "s", "b"], ["y"], {"axis": -1, ROW_MAP: row_map}, domain=POLYKIT_DOMAIN)
    got = mapped_normalization(mapped, ins)[0]
    plain = layer_normalization(mapped, ins)[0].reshape(24, 5)
    dest = row_destinations(row_map)
    assert sorted(dest.tolist()) == list(range(24))
    np.testing.assert_array_equal(got[dest], plain)


# ---- fitting ------------------------------------------------------------------------------------
def test_random_transposes_and_rolls_of_row_dims_fit_the_map_exactly():
    for _ in range(200):
        rank = int(RNG.integers(1, 5))
        dims = tuple(int(d) for d in RNG.integers(1, 7, rank))
        rows = np.arange(int(np.prod(dims))).reshape(dims)
        shifts = [int(RNG.integers(0, d)) if RNG.random() < 0.5 else 0 for d in dims]
        moved = np.roll(rows, shifts, axis=tuple(range(rank))).transpose(RNG.permutation(rank))
        src = moved.reshape(-1)  # output row o holds input row src[o]
        dest = np.empty_like(src)
        dest[src] = np.arange(src.size)
        fitted = fit_row_map(dest, dims)
        assert fitted is not None, (dims, shifts)
        assert np.array_equal(row_destinations({"dims": fitted}), dest)


def test_a_permutation_that_mixes_dims_does_not_fit():
    dest = RNG.permutation(24)
    assert fit_row_map(dest, (4, 6)) is None or np.array_equal(row_destinations({"dims": fit_row_map(dest, (4, 6))}),
                                                               dest)
    mixed = np.arange(12).reshape(3, 4)
    mixed = np.roll(mixed.reshape(-1), 5).reshape(3, 4)  # a roll of the flat rows seen as [3, 4]
    assert fit_row_map(mixed.reshape(-1), (3, 4)) is None


def test_a_row_map_that_is_no_permutation_is_refused():
    with pytest.raises(ValueError, match="no permutation"):
        check_row_map({"dims": [{"shift": 0, "pieces": [[4, 0]]}], "shape": [4, 3]}, (4, 3), 1)
    with pytest.raises(ValueError, match="rows of 3"):
        check_row_map({"dims": [{"shift": 0, "pieces": [[4, 1]]}], "shape": [2, 6]}, (4, 3), 1)
    node = Node("LayerNormalization", ["x", "s"], ["y"], {"axis": -1, ROW_MAP: {
        "dims": [{"shift": 0, "pieces": [[4, 1]]}], "shape": [4, 3]}}, domain=POLYKIT_DOMAIN)
    with pytest.raises(RuntimeInputError):
        mapped_normalization(node, [np.zeros((5, 3), np.float32), np.ones(3, np.float32)])


def test_a_folded_graph_exports_to_onnx_and_reads_back_with_its_row_map():
    from polykit.compiler.graph.onnx_export import to_onnx
    from polykit.compiler.graph.onnx_import import load_onnx

    g = ln_graph((4, 6, 5), [node("Transpose", ["ln"], "y", perm=[1, 0, 2])], ["y"])
    assert fold_norm_row_maps(g)
    back = load_onnx(to_onnx(g))
    (folded,) = back.nodes
    assert folded.domain == POLYKIT_DOMAIN and folded.attrs[ROW_MAP] == g.nodes[0].attrs[ROW_MAP]
    assert back.value("y").shape == (6, 4, 5)


def patch_merging(B, H, W, C):
    """torchvision's PatchMerging: cat(x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2],
    x[:, 1::2, 1::2], -1) -> LayerNorm(4C) -> Linear(4C, 2C), as Slices + Concat; y = that + 0."""
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array((RNG.standard_normal(4 * C) + 1).astype(np.float32), "s"),
             numpy_helper.from_array(RNG.standard_normal(4 * C).astype(np.float32), "b"),
             numpy_helper.from_array(RNG.standard_normal((4 * C, 2 * C)).astype(np.float32) * 0.2, "w"),
             numpy_helper.from_array(np.array([1, 2], np.int64), "axes"),
             numpy_helper.from_array(np.array([2, 2], np.int64), "steps"),
             numpy_helper.from_array(np.array([H, W], np.int64), "ends")]
    nodes = []
    for k, (h0, w0) in enumerate([(0, 0), (1, 0), (0, 1), (1, 1)]):
        inits.append(numpy_helper.from_array(np.array([h0, w0], np.int64), f"st{k}"))
        nodes.append(helper.make_node("Slice", ["x", f"st{k}", "ends", "axes", "steps"], [f"x{k}"]))
    nodes += [helper.make_node("Concat", [f"x{k}" for k in range(4)], ["cat"], axis=-1),
              helper.make_node("LayerNormalization", ["cat", "s", "b"], ["ln"], axis=-1),
              helper.make_node("MatMul", ["ln", "w"], ["y"])]
    g = helper.make_graph(nodes, "patch_merging", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, H, W, C])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("B, H, W, C", [(2, 6, 10, 8), (1, 14, 6, 12), (3, 4, 4, 5)])
def test_the_patch_merging_copy_is_read_by_the_layer_norm_and_matches_onnxruntime(B, H, W, C):
    plan = _run(patch_merging(B, H, W, C), B, H, W, C)
    kinds = [layer.kind for layer in plan.layers]
    (norm,) = [layer for layer in plan.layers if layer.kind == "LayerNormalization"]
    assert "PermutedCopy" not in kinds and "Concat" not in kinds
    assert norm.attrs[IN_MAP]["segment"] == C and norm.in_shapes[0] == (B, H, W, C)

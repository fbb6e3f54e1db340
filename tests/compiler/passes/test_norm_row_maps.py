"""fold_norm_row_maps: a row-permuting Transpose / PermutedCopy of a LayerNorm's output becomes the
norm's row map (ops/nn/norm_row_map.py). Swin-style window blocks (shifted: the rolled partition,
a PermutedCopy; plain: the partition Transpose) at odd sizes and windows, on the cpu target against
onnxruntime; the fitting of a row permutation to the map's form over random transposes and rolls;
and the copies the pass leaves (moving the normalized axis, a second reader, a window)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.ops.nn.norm_row_map import ROW_MAP, check_row_map, row_destinations
from polykit.compiler.ops.nn.normalization_reference import layer_normalization, mapped_normalization
from polykit.compiler.passes.norm_row_maps import fit_row_map, fold_norm_row_maps
from polykit.errors import RuntimeInputError
from polykit.runtime.engine import Engine
from tests.compiler.passes.passes_testkit import graph, node, run_and_compare
from tests.compiler.passes.test_window_attention_blocks import window_block

RNG = np.random.default_rng(30)


def run_cpu(model, shape):
    feeds = {"x": RNG.standard_normal(shape).astype(np.float32)}
    plan = build_plan(model, BuilderConfig(target="cpu"))
    with Engine(plan) as engine, engine.create_execution_context() as ctx:
        got = ctx.execute(feeds)["y"]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    return plan


@pytest.mark.parametrize("B, Hs, Ws, C, heads, win, shift", [
    (2, 6, 9, 12, 3, 3, 1),    # shifted: the rolled partition (a PermutedCopy) goes into the norm
    (3, 10, 15, 10, 2, 5, 2),
    (1, 14, 7, 8, 2, 7, 3),    # windows of 7, one batch
    (2, 6, 9, 12, 3, 3, 0),    # plain: the partition Transpose goes into the norm
    (3, 4, 6, 8, 2, 2, 0),
    (2, 14, 21, 6, 1, 7, 0),
])
def test_window_partitions_are_written_by_the_layer_norm_and_match_onnxruntime(B, Hs, Ws, C, heads, win, shift):
    plan = run_cpu(window_block(B, Hs, Ws, C, heads, win, shift), (B, Hs, Ws, C))
    kinds = [layer.kind for layer in plan.layers]
    (norm,) = [layer for layer in plan.layers if layer.kind == "LayerNormalization"]
    assert "Transpose" not in kinds and "PermutedCopy" not in kinds
    assert norm.domain == POLYKIT_DOMAIN and ROW_MAP in norm.attrs
    shifts = [d["shift"] for d in norm.attrs[ROW_MAP]["dims"]]
    assert any(shifts) == bool(shift)


def norm_then(copy_nodes, shape, out_inits=(), extra_outputs=()):
    """x -> LayerNorm -> `copy_nodes` (reading "ln", writing "y") as an ONNX model."""
    C = shape[-1]
    inits = [numpy_helper.from_array((RNG.standard_normal(C) + 1).astype(np.float32), "s"),
             numpy_helper.from_array(RNG.standard_normal(C).astype(np.float32), "b"), *out_inits]
    nodes = [helper.make_node("LayerNormalization", ["x", "s", "b"], ["ln"], axis=-1), *copy_nodes]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", *extra_outputs)]
    g = helper.make_graph(nodes, "norm_copy", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                          outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("shape, perm", [((3, 5, 7, 6), [2, 0, 1, 3]), ((2, 3, 4, 5, 9), [4, 3, 1, 0, 2]),
                                         ((5, 7, 4), [1, 0, 2])])
def test_any_transpose_that_keeps_the_normalized_axis_last_folds(shape, perm):
    perm = [p for p in perm if p != len(shape) - 1] + [len(shape) - 1]  # the normalized axis stays last
    model = norm_then([helper.make_node("Transpose", ["ln"], ["y"], perm=perm)], shape)
    plan = run_cpu(model, shape)
    assert [layer.kind for layer in plan.layers] == ["LayerNormalization"]


def test_a_transpose_moving_the_normalized_axis_stays():
    model = norm_then([helper.make_node("Transpose", ["ln"], ["y"], perm=[0, 2, 1])], (3, 5, 6))
    plan = run_cpu(model, (3, 5, 6))
    assert "Transpose" in [layer.kind for layer in plan.layers]
    assert all(ROW_MAP not in layer.attrs for layer in plan.layers)


def ln_graph(shape, nodes, outputs, **consts):
    C = shape[-1]
    inits = {"s": (RNG.standard_normal(C) + 1).astype(np.float32), "b": RNG.standard_normal(C).astype(np.float32),
             **consts}
    return graph([node("LayerNormalization", ["x", "s", "b"], "ln", axis=-1), *nodes], {"x": shape}, outputs, inits)


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

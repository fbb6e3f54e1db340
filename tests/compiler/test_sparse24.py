"""2:4 structured sparsity: the pattern, pruning, the compressed form and its PTX metadata, and
builds with --sparsity (eligibility, the sparse candidate, force pruning, the plan's record)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.plan import sparse24
from polykit.errors import PlanError, UsageError
from polykit.runtime.engine import Engine


def random_24(n: int, k: int, dtype=np.float32, seed: int = 0) -> np.ndarray:
    """W[n, k] with the 2:4 pattern, some groups holding fewer than 2 non-zeros."""
    rng = np.random.default_rng(seed)
    w = sparse24.prune(rng.standard_normal((n, k)).astype(dtype))
    w[rng.random((n, k)) < 0.1] = 0
    return w


def test_prune_zeroes_the_two_smallest_magnitudes_of_each_group_of_four():
    w = np.array([[1.0, -4.0, 3.0, 0.5, 2.0, 2.0, 2.0, -2.0]], np.float32)
    assert sparse24.prune(w).tolist() == [[0.0, -4.0, 3.0, 0.0, 0.0, 0.0, 2.0, -2.0]]  # ties: the earlier go


def test_prune_runs_along_the_given_axis():
    w = np.arange(1, 25, dtype=np.float32).reshape(8, 3)  # axis 0: groups of rows 0-3 and 4-7
    pruned = sparse24.prune(w, axis=0)
    assert sparse24.has_pattern(pruned, axis=0) and not sparse24.has_pattern(pruned, axis=1)
    assert (pruned[[2, 3, 6, 7]] == w[[2, 3, 6, 7]]).all() and not pruned[[0, 1, 4, 5]].any()


def test_has_pattern_needs_at_most_two_non_zeros_per_group():
    assert sparse24.has_pattern(np.array([[1, 0, 0, 2, 0, 0, 0, 0]]))
    assert not sparse24.has_pattern(np.array([[1, 1, 1, 0]]))
    assert not sparse24.has_pattern(np.zeros((2, 6)))  # not groups of 4


@pytest.mark.parametrize("n,k", [(1, 32), (7, 64), (33, 96), (5, 320)])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_compression_round_trips(n, k, dtype):
    w = random_24(n, k, dtype, seed=n)
    blob = sparse24.compress(w)
    assert blob.dtype == np.uint8 and blob.size == sparse24.blob_bytes(n, k, dtype)
    assert np.array_equal(sparse24.decompress(blob, n, k, dtype), w)


def test_metadata_is_the_ptx_layout_for_m16n8k32():
    """Row 0 keeps positions 0 and 2 of its first group (nibble 0b1000); all-zero groups keep 0 and
    1 (0b0100); each uint16 covers 16 K, its first group in the low nibble."""
    w = np.zeros((2, 32), np.float16)
    w[0, 0], w[0, 2], w[1, 19] = 1, 2, 3
    blob = sparse24.compress(w)
    meta = blob[sparse24.values_bytes(2, 32, np.float16):].view("<u2").reshape(2, 2)
    assert meta.tolist() == [[0x4448, 0x4444], [0x4444, 0x444C]]  # w[1, 19]: the second word, positions 0 and 3
    values = blob[:sparse24.values_bytes(2, 32, np.float16)].view(np.float16).reshape(2, 16)
    assert values[0, :2].tolist() == [1, 2] and values[1, 8:10].tolist() == [0, 3]


def test_compress_refuses_what_is_not_eligible():
    with pytest.raises(ValueError):
        sparse24.compress(random_24(4, 48))  # K not a multiple of 32
    with pytest.raises(ValueError):
        sparse24.compress(np.ones((4, 32), np.float32))  # no pattern


def test_decompress_refuses_a_blob_of_the_wrong_size_or_order():
    blob = sparse24.compress(random_24(3, 32))
    with pytest.raises(ValueError):
        sparse24.decompress(blob[:-2], 3, 32, np.float32)
    bad = blob.copy()
    bad[sparse24.values_bytes(3, 32, np.float32)] = 0x01  # group 0: positions 1 then 0
    with pytest.raises(ValueError):
        sparse24.decompress(bad, 3, 32, np.float32)


# ---- builds ---------------------------------------------------------------------------------------
def matmul_model(w: np.ndarray, bias: bool = True, m: int = 5):
    k, n = w.shape
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h" if bias else "y"], name="mm")]
    inits = [numpy_helper.from_array(w, "W")]
    if bias:
        nodes.append(helper.make_node("Add", ["h", "b"], ["y"], name="add"))
        inits.append(numpy_helper.from_array(np.linspace(-1, 1, n, dtype=np.float32), "b"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def conv_model(w: np.ndarray):
    cout, cin = w.shape[:2]
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], name="conv"), helper.make_node("Relu", ["c"], ["y"], name="relu")]
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.linspace(-1, 1, cout, dtype=np.float32), "B")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, cin, 3, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, cout, 3, 5])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def run(plan, x):
    return Engine(plan).create_execution_context().execute({"x": x})["y"]


def test_enable_lists_eligible_layers_and_the_sparse_tactic_computes_from_the_compressed_weight(caplog, tmp_path):
    w = random_24(48, 64).T.copy()  # MatMul B [K, N]: the pattern along K
    x = np.random.default_rng(1).standard_normal((5, 64)).astype(np.float32)
    with caplog.at_level(logging.INFO, logger="polykit"):
        plan = build_plan(matmul_model(w), BuilderConfig(target="cpu", sparsity="enable",
                                                         tactic_replay={"mm": "cpu.gemm.sparse24"}))
    assert "Layers eligible for sparse math: mm" in caplog.text
    (layer,) = plan.layers
    assert layer.tactic == "cpu.gemm.sparse24" and layer.inputs[1] == "W::sparse24"
    assert "W" not in plan.weights and plan.weights["W::sparse24"].dtype == np.uint8
    want = x.astype(np.float64) @ w + np.linspace(-1, 1, 48)
    np.testing.assert_allclose(run(plan, x), want, rtol=1e-5, atol=1e-5)
    plan.save(tmp_path / "sparse.plan")
    from polykit.compiler.plan.file import Plan

    np.testing.assert_array_equal(run(Plan.load(tmp_path / "sparse.plan"), x), run(plan, x))


def test_a_timed_build_times_the_sparse_candidate_and_keeps_only_the_weight_its_choice_reads():
    plan = build_plan(matmul_model(random_24(48, 64).T.copy()), BuilderConfig(target="cpu", sparsity="enable"))
    assert plan.metadata["tuning"]["timed_tactics"] == 3  # two dense (the level's cap) and the sparse candidate
    layer = plan.layers[0]
    assert "sparse24_offer" not in layer.attrs
    weight = "W::sparse24" if layer.tactic == "cpu.gemm.sparse24" else "W"
    assert layer.inputs[1] == weight and set(plan.weights) == {weight, "mm_C__0"}


def test_a_1x1_conv_with_an_epilogue_runs_sparse(caplog):
    w = sparse24.prune(np.random.default_rng(2).standard_normal((40, 32, 1, 1)).astype(np.float32), axis=1)
    x = np.random.default_rng(3).standard_normal((2, 32, 3, 5)).astype(np.float32)
    dense = build_plan(conv_model(w), BuilderConfig(target="cpu"))
    name = dense.layers[0].name
    sparse = build_plan(conv_model(w), BuilderConfig(target="cpu", sparsity="enable", tactic_replay={name: "cpu.gemm.sparse24"}))
    assert sparse.layers[0].tactic == "cpu.gemm.sparse24" and sparse.layers[0].attrs.get("epilogue")
    np.testing.assert_allclose(run(sparse, x), run(dense, x), rtol=1e-6, atol=1e-6)


def test_k_not_a_multiple_of_the_mma_step_is_not_eligible(caplog):
    with caplog.at_level(logging.INFO, logger="polykit"):
        plan = build_plan(matmul_model(random_24(8, 48).T.copy()), BuilderConfig(target="cpu", sparsity="enable"))
    assert "Layers eligible for sparse math: none" in caplog.text and "W::sparse24" not in plan.weights


def test_a_weight_without_the_pattern_is_not_eligible_and_disable_offers_nothing(caplog):
    w = np.random.default_rng(4).standard_normal((64, 16)).astype(np.float32)
    with caplog.at_level(logging.INFO, logger="polykit"):
        build_plan(matmul_model(w), BuilderConfig(target="cpu", sparsity="enable"))
        build_plan(matmul_model(random_24(16, 64).T.copy()), BuilderConfig(target="cpu"))
    assert caplog.text.count("Layers eligible for sparse math") == 1 and "math: none" in caplog.text


def test_force_prunes_eligible_weights_with_a_warning(caplog):
    w = np.random.default_rng(5).standard_normal((64, 16)).astype(np.float32)
    x = np.random.default_rng(6).standard_normal((5, 64)).astype(np.float32)
    with caplog.at_level(logging.INFO, logger="polykit"):
        plan = build_plan(matmul_model(w, bias=False), BuilderConfig(target="cpu", sparsity="force"))
    assert "pruned 1 weight(s) to the 2:4 pattern" in caplog.text and "eligible for sparse math: mm" in caplog.text
    want = x.astype(np.float64) @ sparse24.prune(w, axis=0)
    np.testing.assert_allclose(run(plan, x), want, rtol=1e-5, atol=1e-5)


def test_the_config_refuses_an_unknown_mode_and_a_refittable_sparse_build():
    with pytest.raises(UsageError, match="sparsity mode"):
        BuilderConfig(sparsity="on")
    with pytest.raises(UsageError, match="refittable"):
        BuilderConfig(sparsity="enable", refittable=True)
    assert "sparsity" not in BuilderConfig().to_json() and BuilderConfig(sparsity="force").to_json()["sparsity"] == "force"


def test_a_plan_whose_sparse_record_lies_is_refused(tmp_path):
    from polykit.compiler.plan.file import Plan

    plan = build_plan(matmul_model(random_24(48, 64).T.copy()), BuilderConfig(
        target="cpu", sparsity="enable", tactic_replay={"mm": "cpu.gemm.sparse24"}))
    layer = plan.layers[0]
    bad = dict(layer.attrs["sparse24"], k=96, shape=[48, 96])
    plan.layers[0] = type(layer)(**{**layer.__dict__, "attrs": {**layer.attrs, "sparse24": bad}})
    plan.save(tmp_path / "bad.plan")
    with pytest.raises(PlanError, match="sparse24"):
        Plan.load(tmp_path / "bad.plan")


def test_dense_tactics_never_serve_a_sparse_variant_and_the_sparse_tactic_only_them():
    from dataclasses import replace

    from polykit.compiler.builder.sparsity import OFFER, sparse_variant
    from polykit.kernels.tactics import candidates

    plan = build_plan(matmul_model(random_24(48, 64).T.copy()), BuilderConfig(target="cpu"))
    dense = plan.layers[0]
    offered = replace(dense, attrs={**dense.attrs, OFFER: sparse24.sparse_record("W::sparse24", 48, 64, "float32", (64, 48))})
    variant = sparse_variant(offered)
    assert [t.name for t in candidates("cpu", variant.kind, variant)] == ["cpu.gemm.sparse24"]
    assert "cpu.gemm.sparse24" not in [t.name for t in candidates("cpu", dense.kind, offered)]
    assert variant.in_shapes[1] == (sparse24.blob_bytes(48, 64, np.float32),)


def test_a_build_with_several_profiles_offers_no_sparse_candidate(caplog):
    from polykit.compiler.plan.profiles import Profile

    model = matmul_model(random_24(48, 64).T.copy(), bias=False)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "m"
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "m"
    profiles = (Profile({"x": ((1, 64), (2, 64), (4, 64))}), Profile({"x": ((5, 64), (8, 64), (16, 64))}))
    with caplog.at_level(logging.INFO, logger="polykit"):
        plan = build_plan(model, BuilderConfig(target="cpu", sparsity="enable", profiles=profiles))
    assert "not offered in a build with 2 optimization profiles" in caplog.text
    assert "W::sparse24" not in plan.weights and plan.layers[0].inputs[1] == "W"

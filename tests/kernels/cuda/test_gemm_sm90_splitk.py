"""Split-K on the Hopper GEMM (gemm_sm90_splitk): slice counts, workspace and cost-model order
(CPU), ptxas on the split units (NVRTC, no GPU), and every split tactic against a float64
reference on random data with outputs poisoned, run-to-run bit equality (GPU, compute
capability 9.0)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from polykit.compiler.plan.records import LayerDesc, TensorDesc
from polykit.kernels.cuda.gemm.gemm_sm90 import Sm90Gemm, plan_gemm
from polykit.kernels.cuda.gemm.gemm_sm90_splitk import (SPLIT_TILES, SPLITS, X3_SPLIT_TILES, compile_variants,
                                                   partial_bytes, slices)
from tests.kernels.cuda.test_gemm_sm90 import BF16, check_matmul, rand, rel_err, require_sm90, run, stamped
from tests.kernels.cuda.test_sm90_wgmma_pipeline import ptxas_report

GELU_RES = [{"op": "Add", "inputs": ["raw", "bias"], "outputs": ["s"], "attrs": {}},
            {"op": "Gelu", "inputs": ["s"], "outputs": ["g"], "attrs": {}},
            {"op": "Add", "inputs": ["g", "res"], "outputs": ["Y"], "attrs": {}}]


# ---- slices, workspace, order (no GPU) -------------------------------------------------------

def test_every_split_tile_has_a_tactic_per_slice_count():
    from polykit.kernels.tactics import find_tactic

    for prefix, tiles in (("sm90", SPLIT_TILES), ("sm90x3", X3_SPLIT_TILES)):
        assert [t.label for t in tiles] == ["128x128", "64x128"]
        for tile in tiles:
            for s in SPLITS:
                for kind in ("MatMul", "Gemm"):
                    tactic = find_tactic("cuda", kind, f"cuda.gemm.{prefix}_{tile.label}_sk{s}")
                    assert tactic is not None and tactic.params["splits"] == s


@pytest.mark.parametrize("K,storage,splits,want", [
    (768, "float16", 8, 8),      # 12 K steps of 64
    (200, "float16", 4, 4),      # 4 steps, the last one partial
    (72, "float16", 8, 2),       # fewer steps than slices: one slice a step
    (8, "bfloat16", 16, 1),
    (72, "float32", 8, 3),       # float: 32-deep steps
])
def test_slices_are_the_tactics_count_or_one_per_k_step(K, storage, splits, want):
    assert slices(Sm90Gemm(128, 768, K, 1, 1, 1, True), splits, storage) == want


def test_workspace_holds_the_fp32_partials_of_every_slice_with_rows_padded_to_the_tile():
    from polykit.kernels.tactics import find_tactic

    layer = LayerDesc("mm", "MatMul", ("A", "B"), ("Y",), {})
    tensors = {"A": TensorDesc("A", "float16", (2, 17, 200), "input"),
               "B": TensorDesc("B", "float16", (200, 136), "weight"),
               "Y": TensorDesc("Y", "float16", (2, 17, 136), "output")}
    tactic = find_tactic("cuda", "MatMul", "cuda.gemm.sm90_64x128_sk8")
    geo = plan_gemm("MatMul", {}, (2, 17, 200), (200, 136))
    assert geo == Sm90Gemm(34, 136, 200, 1, 1, 1, True)
    # 200 = 4 K steps: 4 slices of 34 rows x 256 columns (136 rounded up to two 128-column tiles)
    assert tactic.workspace(layer, tensors, 132) == partial_bytes(geo, SPLIT_TILES[1], 4) == 4 * 34 * 256 * 4


def _first_sm90(M, N, K):
    from polykit.compiler.builder.tuner import by_estimate
    from polykit.kernels.tactics import candidates

    layer = stamped(LayerDesc("mm", "MatMul", ("A", "B"), ("Y",), {}, precision="fp16"),
                    {"A": np.zeros((M, K), np.float16), "B": np.zeros((K, N), np.float16)}, (M, N), np.float16)
    pairs = by_estimate([(layer, t) for t in candidates("cuda", "MatMul", layer, arch="sm_90")], 132)
    return next(t.name for _, t in pairs if t.name.startswith("cuda.gemm.sm90"))


def _splits_k(name: str) -> bool:
    """Whether a tactic cuts tiles' K between blocks: split-K (_sk<S>) or stream-K (_streamk)."""
    return "_sk" in name or name.endswith("_streamk")


def test_an_untimed_build_splits_k_where_the_tiles_leave_sms_idle_and_not_elsewhere():
    assert _splits_k(_first_sm90(128, 768, 3072))  # BERT-base bs1 FFN2: 6 tiles of 128x128 for 132 SMs
    assert _splits_k(_first_sm90(16, 768, 3072))
    assert not _splits_k(_first_sm90(4096, 4096, 4096))
    assert not _splits_k(_first_sm90(1024, 3072, 768))  # BERT-base bs8 FFN1: 192 tiles


def fused_fp16_desc(M: int, N: int, K: int) -> LayerDesc:
    """An fp16 MatMul M x N x K with a bias + GELU + residual epilogue, shapes stamped (ptxas tests)."""
    return LayerDesc("mm", "MatMul", ("A", "B", "bias", "res"), ("Y",), {"epilogue": {"input": "raw", "body": GELU_RES}},
                     domain="ai.polykit", in_dtypes=("float16",) * 4, out_dtypes=("float16",),
                     in_shapes=((M, K), (K, N), (N,), (M, N)), out_shapes=((M, N),))


@pytest.mark.parametrize("tile", SPLIT_TILES, ids=lambda t: t.label)
def test_the_fused_split_k_unit_keeps_its_wgmma_pipeline_and_spills_nothing(tile):
    pytest.importorskip("cuda.core")
    from polykit.kernels.cuda.gemm.gemm_sm90 import kernel_for

    # BERT-base bs1's FFN2 with a bias + GELU + residual epilogue
    text = ptxas_report(kernel_for(fused_fp16_desc(128, 768, 3072), tile, "half_t", True, splitk=True), "gemm_sm90.cu")
    assert text.count("Used") == 2, f"expected the kernel and its reduce in the report:\n{text}"
    assert "C7514" not in text, f"ptxas serializes the split-K wgmma pipeline of tile {tile.label}:\n{text}"
    assert text.count(" 0 bytes spill stores") == 2, f"tile {tile.label} split-K spills:\n{text}"


def test_split_k_compile_variants_cover_each_dtype_and_b_layout():
    units = compile_variants()
    elems = {(dict(u.defines)["ELEM"], dict(u.defines)["B_MN"], dict(u.defines).get("SPLIT3", "0")) for u in units}
    assert {("half_t", "1", "0"), ("half_t", "0", "0"), ("bf16_t", "1", "0"), ("float", "0", "0"),
            ("float", "0", "1"), ("float", "1", "1")} <= elems
    assert all(dict(u.defines)["SPLITK"] == "1" and u.arch == "sm_90a" for u in units)


# ---- GPU ----------------------------------------------------------------------------------

SPLIT_TACTICS = ["128x128_sk2", "128x128_sk4", "64x128_sk8", "64x128_sk16"]
SHAPES = [((128, 768), (768, 768)), ((128, 3072), (3072, 768)), ((128, 768), (768, 3072)),  # BERT-base bs1
          ((1, 768), (768, 768)), ((17, 3072), (3072, 768)),                               # M 1, M 17
          ((77, 200), (200, 264)),   # K 200: 4 K steps, the last partial (not a multiple of any slice depth)
          ((33, 72), (72, 136)),     # K 72: 2 K steps, fewer than the slices of sk4..sk16
          ((3, 40, 136), (136, 200)),   # batch folded into M (B broadcast)
          ((4, 65, 136), (4, 136, 24)),  # batched A and B
          ((33, 264), (5, 264, 16))]     # A broadcast over B's batch


@pytest.mark.gpu
@pytest.mark.parametrize("name", SPLIT_TACTICS)
@pytest.mark.parametrize("a_shape,b_shape", SHAPES)
@pytest.mark.parametrize("dtype", [np.dtype(np.float16), BF16], ids=["fp16", "bf16"])
def test_split_k_matmul_matches_float64_reference(name, a_shape, b_shape, dtype):
    if dtype == BF16 and name != "128x128_sk4" and a_shape != (77, 200):
        pytest.skip("bf16 runs on one split tactic and one odd shape per tactic")
    check_matmul(f"cuda.gemm.sm90_{name}", a_shape, b_shape, dtype)


def check_gemm(tactic: str, M: int, K: int, N: int, trans_b: int, c_shape) -> None:
    """Gemm alpha 0.75, beta -1.5 with C of `c_shape` (None: no C) by `tactic` against float64 (GPU)."""
    require_sm90()
    a = rand((M, K), np.float16)
    b = rand((N, K) if trans_b else (K, N), np.float16)
    inputs = {"A": a, "B": b}
    ref = 0.75 * (a.astype(np.float64) @ (b.T if trans_b else b).astype(np.float64))
    if c_shape is not None:
        inputs["C"] = rand(c_shape, np.float16)
        ref = ref - 1.5 * inputs["C"].astype(np.float64)
    layer = LayerDesc("gemm", "Gemm", tuple(inputs), ("Y",), {"transB": trans_b, "alpha": 0.75, "beta": -1.5})
    out = run(layer, inputs, tactic, (M, N), np.float16)
    err = rel_err(out, ref)
    assert err <= 2e-3, f"{tactic} Gemm {M}x{N}x{K} transB {trans_b} C {c_shape}: relative error {err:.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["128x128_sk4", "64x128_sk8"])
@pytest.mark.parametrize("trans_b,c_shape", [(1, (137,)), (0, (77, 1)), (1, (77, 137)), (1, None)])
def test_split_k_gemm_applies_alpha_beta_and_broadcast_c_in_the_reduce(name, trans_b, c_shape):
    """N 137 (odd: the reduce's pair path with a lone last column) where B is [N, K]; N 136 else."""
    N = 137 if trans_b else 136
    check_gemm(f"cuda.gemm.sm90_{name}", 77, 1000, N, trans_b, c_shape and tuple(N if d == 137 else d for d in c_shape))


def _fused(M, N, K, dtype):
    layer = LayerDesc("mm", "MatMul", ("A", "B", "bias", "res"), ("Y",), {"epilogue": {"input": "raw", "body": GELU_RES}},
                      domain="ai.polykit")
    inputs = {"A": rand((M, K), dtype), "B": rand((K, N), dtype), "bias": rand((N,), dtype), "res": rand((M, N), dtype)}
    return layer, inputs


def check_fused(tactic: str, M: int, N: int, K: int) -> None:
    """MatMul + bias + GELU + residual (fused epilogue) by `tactic` against float64 (GPU)."""
    require_sm90()
    from math import erf

    layer, inputs = _fused(M, N, K, np.float16)
    s = inputs["A"].astype(np.float64) @ inputs["B"].astype(np.float64) + inputs["bias"].astype(np.float64)
    ref = 0.5 * s * (1.0 + np.vectorize(erf)(s / np.sqrt(2.0))) + inputs["res"].astype(np.float64)
    err = rel_err(run(layer, inputs, tactic, (M, N), np.float16), ref)
    assert err <= 3e-3, f"{tactic} fused {M}x{N}x{K}: relative error {err:.2e}"


def check_same_bits(tactic: str, M: int, N: int, K: int) -> None:
    """Three runs of the fused MatMul by `tactic` on the same inputs give the same bits (GPU)."""
    require_sm90()
    layer, inputs = _fused(M, N, K, np.float16)
    runs = [run(layer, inputs, tactic, (M, N), np.float16).view(np.uint16) for _ in range(3)]
    for i in (1, 2):
        differ = np.argwhere(runs[i] != runs[0])
        assert differ.size == 0, f"run {i} differs from run 0 in {len(differ)} elements, first {differ[:3].tolist()}"


@pytest.mark.gpu
@pytest.mark.parametrize("name", SPLIT_TACTICS)
@pytest.mark.parametrize("M,N,K", [(128, 768, 3072), (17, 136, 768)])
def test_split_k_runs_the_fused_bias_gelu_residual_epilogue_once_on_the_sum(name, M, N, K):
    check_fused(f"cuda.gemm.sm90_{name}", M, N, K)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["128x128_sk8", "64x128_sk16"])
def test_split_k_results_are_the_same_bits_run_to_run(name):
    check_same_bits(f"cuda.gemm.sm90_{name}", 128, 768, 3072)


@pytest.mark.gpu
@pytest.mark.parametrize("tile", ["128x128", "64x128"])
@pytest.mark.parametrize("splits", [2, 16])
def test_3xtf32_split_k_is_within_fp32_accumulation_of_the_unsplit_kernel(tile, splits):
    """float32 layers of precision fp32 (3xTF32): the split result against the float64 reference
    and against the unsplit kernel on the same data, both at fp32's accuracy."""
    require_sm90()
    a, b = rand((128, 3072), np.float32), rand((768, 3072), np.float32)
    layer = LayerDesc("gemm", "Gemm", ("A", "B"), ("Y",), {"transB": 1}, precision="fp32")
    ref = a.astype(np.float64) @ b.T.astype(np.float64)
    split = run(layer, {"A": a, "B": b}, f"cuda.gemm.sm90x3_{tile}_sk{splits}", ref.shape, np.float32)
    whole = run(layer, {"A": a, "B": b}, f"cuda.gemm.sm90x3_{tile}", ref.shape, np.float32)
    assert rel_err(split, ref) <= 2e-6
    assert rel_err(split, whole.astype(np.float64)) <= 2e-6


@pytest.mark.gpu
def test_3xtf32_split_k_takes_a_k_by_n_b():
    require_sm90()
    a, b = rand((2, 17, 768), np.float32), rand((768, 3072), np.float32)
    ref = np.matmul(a.astype(np.float64), b.astype(np.float64))
    layer = LayerDesc("mm", "MatMul", ("A", "B"), ("Y",), {}, precision="fp32")
    out = run(layer, {"A": a, "B": b}, "cuda.gemm.sm90x3_128x128_sk8", ref.shape, np.float32)
    assert rel_err(out, ref) <= 2e-6


def check_tf32_gemm(tactic: str, M: int, N: int, K: int) -> None:
    """A float32 Gemm (alpha 0.5, B [N, K], bias C) of precision tf32 by `tactic` against float64 (GPU)."""
    require_sm90()
    a, b, c = rand((M, K), np.float32), rand((N, K), np.float32), rand((N,), np.float32)
    ref = 0.5 * (a.astype(np.float64) @ b.T.astype(np.float64)) + c.astype(np.float64)
    layer = replace(LayerDesc("gemm", "Gemm", ("A", "B", "C"), ("Y",), {"transB": 1, "alpha": 0.5}), precision="tf32")
    err = rel_err(run(layer, {"A": a, "B": b, "C": c}, tactic, (M, N), np.float32), ref)
    assert err <= 3e-3, f"{tactic} tf32 Gemm {M}x{N}x{K}: relative error {err:.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K", [(128, 768, 3072), (1, 264, 72)])
def test_tf32_split_k_gemm_with_bias(M, N, K):
    check_tf32_gemm("cuda.gemm.sm90_128x128_sk4", M, N, K)


@pytest.mark.gpu
def test_split_k_16_byte_reduce_path_equals_its_pair_path_bit_for_bit():
    """A misaligned Y sends the reduce to value + store2; aligned, N % 8 == 0, to finish8: same bits."""
    require_sm90()
    from polykit.runtime.cuda.harness import run_layer

    layer, inputs = _fused(128, 768, 768, np.float16)
    layer = stamped(layer, inputs, (128, 768), np.float16)
    out = {}
    for shift in (0, 4):  # 4 bytes: pairs stay 4-byte aligned, 16-byte stores are not
        out[shift] = run_layer(layer, inputs, tactic="cuda.gemm.sm90_64x128_sk4",
                               output_specs={"Y": ((128, 768), np.float16)}, misalign={"Y": shift})["Y"]
    differ = np.argwhere(out[0].view(np.uint16) != out[4].view(np.uint16))
    assert differ.size == 0, f"{len(differ)} elements differ between the paths, first at {differ[:3].tolist()}"

"""The ping-pong sm90 GEMM tiles (gemm_sm90_pingpong.cuh): geometry and cost model (CPU); every
tile against a float64 reference on random data with odd shapes, with many tiles a block (several
turns, an odd count) and with the fused bias + GELU + residual epilogue, run twice for the same bits
(GPU, compute capability 9.0; outputs poisoned)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from polykit.compiler.plan_records import LayerDesc
from polykit.kernels.cuda.gemm_sm90 import PINGPONG_TILES, predicted_us
from tests.kernels.cuda.test_gemm_sm90 import BF16, check_matmul, rand, rel_err, require_sm90, run


def test_pingpong_tiles_are_one_warpgroup_of_rows_and_fit_the_chip():
    for t in PINGPONG_TILES:
        assert t.bm == 64 * t.msub and t.consumers == 2 and t.label.endswith("p")
        assert t.fits("float16", True, False) and t.fits("bfloat16", False, False)
        assert not t.fits("float32", True, False) and not t.fits("float32", False, True)
        assert ("PINGPONG", "1") in t.defines(True)


def test_pingpong_cost_counts_one_epilogue_a_block():
    """As the one-warpgroup tile of its size, less the epilogues a block's later tiles hide."""
    pp = next(t for t in PINGPONG_TILES if t.label == "64x192p")
    one_wg = replace(pp, pingpong=False, consumers=1)
    assert one_wg.bm == pp.bm
    one_tile_a_block = (1024, 1536, 768)  # 16 x 8 tiles on 132 SMs
    assert predicted_us(pp, *one_tile_a_block, 1, 132) == pytest.approx(predicted_us(one_wg, *one_tile_a_block, 1, 132))
    two_tiles_a_block = (1024, 3072, 768)  # BERT bs8's FFN1: 16 x 16 tiles
    assert predicted_us(pp, *two_tiles_a_block, 1, 132) == pytest.approx(
        predicted_us(one_wg, *two_tiles_a_block, 1, 132) - 2 * 2.0 + 1.5)


SHAPES = [((77, 72), (72, 264)), ((1, 8), (8, 8)), ((3, 100, 136), (136, 200)), ((4, 65, 40), (4, 40, 24)),
          ((300, 1000), (1000, 520)), ((2048, 128), (128, 2048)), ((4100, 96), (96, 1000))]


@pytest.mark.gpu
@pytest.mark.parametrize("tile", PINGPONG_TILES, ids=lambda t: t.label)
@pytest.mark.parametrize("a_shape,b_shape", SHAPES)
def test_pingpong_matmul_matches_float64_reference(tile, a_shape, b_shape):
    check_matmul(f"cuda.gemm.sm90_{tile.label}", a_shape, b_shape, np.dtype(np.float16))


@pytest.mark.gpu
@pytest.mark.parametrize("tile", PINGPONG_TILES[:2], ids=lambda t: t.label)
def test_pingpong_bf16_matmul_matches_float64_reference(tile):
    check_matmul(f"cuda.gemm.sm90_{tile.label}", (4100, 96), (96, 1000), BF16)


@pytest.mark.gpu
@pytest.mark.parametrize("tile", PINGPONG_TILES, ids=lambda t: t.label)
def test_pingpong_gemm_with_transposed_b_alpha_beta_and_bias(tile):
    require_sm90()
    M, K, N = 1000, 200, 776
    a, b, c = rand((M, K), np.float16), rand((N, K), np.float16), rand((N,), np.float16)
    ref = 0.75 * (a.astype(np.float64) @ b.T.astype(np.float64)) - 1.5 * c.astype(np.float64)
    layer = LayerDesc("gemm", "Gemm", ("A", "B", "C"), ("Y",), {"transB": 1, "alpha": 0.75, "beta": -1.5})
    out = run(layer, {"A": a, "B": b, "C": c}, f"cuda.gemm.sm90_{tile.label}", (M, N), np.float16)
    err = rel_err(out, ref)
    assert err <= 2e-3, f"{tile.label}: relative error {err:.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize("tile", PINGPONG_TILES, ids=lambda t: t.label)
def test_pingpong_bias_gelu_residual_epilogue_matches_reference_and_repeats_bit_for_bit(tile):
    require_sm90()
    from math import erf

    body = [{"op": "Add", "inputs": ["raw", "bias"], "outputs": ["s"], "attrs": {}},
            {"op": "Gelu", "inputs": ["s"], "outputs": ["g"], "attrs": {}},
            {"op": "Add", "inputs": ["g", "res"], "outputs": ["Y"], "attrs": {}}]
    layer = LayerDesc("mm", "MatMul", ("A", "B", "bias", "res"), ("Y",), {"epilogue": {"input": "raw", "body": body}},
                      domain="ai.polykit")
    M, K, N = 1100, 200, 1000  # 18 x 6 64x192 tiles: several a block on 132 SMs
    inputs = {"A": rand((M, K), np.float16), "B": rand((K, N), np.float16), "bias": rand((N,), np.float16),
              "res": rand((M, N), np.float16)}
    s = inputs["A"].astype(np.float64) @ inputs["B"].astype(np.float64) + inputs["bias"].astype(np.float64)
    ref = 0.5 * s * (1.0 + np.vectorize(erf)(s / np.sqrt(2.0))) + inputs["res"].astype(np.float64)
    tactic = f"cuda.gemm.sm90_{tile.label}"
    first = run(layer, inputs, tactic, (M, N), np.float16)
    err = rel_err(first, ref)
    assert err <= 3e-3, f"{tile.label}: relative error {err:.2e}"
    again = run(layer, inputs, tactic, (M, N), np.float16)
    assert np.array_equal(first.view(np.uint16), again.view(np.uint16)), f"{tile.label}: two runs differ"

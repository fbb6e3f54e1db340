"""The skinny GEMM tactics (cuda.gemm.skinny_*, cuda.conv_nhwc.skinny_*): geometry, shared memory
and the cost model's ordering (CPU); every tile against the float64 reference with poisoned
outputs, odd M, the mobile nets' small N and K, and the fused epilogues (GPU, sm_80+)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.conv.conv_skinny import plan_pointwise
from polykit.kernels.cuda.conv.conv_sm90 import CONV_TILES
from polykit.kernels.cuda.gemm.gemm_skinny import (ARCHS, MAX_K, SMEM_PER_BLOCK, TILES, SkinnyTile, blocks_per_sm,
                                                  n_splits, skinny_us)
from polykit.kernels.cuda.gemm.gemm_sm90 import memory_us, predicted_us

from tests.kernels.cuda.test_conv_sm90 import RELU, RESIDUAL_RELU, run_conv
from tests.kernels.cuda.test_gemm_sm90 import rel_err, run

rng = np.random.default_rng(29)
BF16 = np.dtype(ml_dtypes.bfloat16)
FP16 = np.dtype(np.float16)
TOL = {FP16: 2e-3, BF16: 1e-2}


# ---- geometry and cost (no GPU) -----------------------------------------------------------

def test_plan_pointwise_takes_unpadded_stride_1_1x1_convolutions():
    geo = plan_pointwise({"kernel_shape": [1, 1]}, (2, 7, 9, 24), (40, 1, 1, 24), (2, 7, 9, 40))
    assert (geo.M, geo.N, geo.K) == (2 * 7 * 9, 40, 24)


@pytest.mark.parametrize("attrs,w,y", [
    ({"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, (40, 3, 3, 24), (2, 7, 9, 40)),  # not 1x1
    ({"kernel_shape": [1, 1], "strides": [2, 2]}, (40, 1, 1, 24), (2, 4, 5, 40)),      # strided
    ({"kernel_shape": [1, 1], "pads": [1, 1, 1, 1]}, (40, 1, 1, 24), (2, 9, 11, 40)),  # padded
    ({"kernel_shape": [1, 1], "group": 2}, (40, 1, 1, 12), (2, 7, 9, 40)),            # grouped
])
def test_plan_pointwise_declines_other_convolutions(attrs, w, y):
    assert plan_pointwise(attrs, (2, 7, 9, 24), w, y) is None


def test_tiles_fit_two_blocks_an_sm_up_to_their_depth():
    for tile in TILES:
        assert tile.bm % 64 == 0 and tile.bn % 16 == 0
        assert tile.fits(16, False) and tile.fits(16, True) and tile.fits(128, False)
        assert not tile.fits(MAX_K + 8, False) and not tile.fits(0, False)
        assert tile.smem(MAX_K, False) > SMEM_PER_BLOCK or tile.fits(MAX_K, False)
    assert any(t.fits(320, False) for t in TILES)  # efficientnet's deepest expand convolution
    # A tile rows padded by 8 elements (K rounded up to 16), two W chunks: 2 * (128 * 40 + 2 * 16 * 40)
    assert SkinnyTile(128, 16).smem(24, False) == 2 * (128 * 40 + 2 * 16 * 40)
    assert SkinnyTile(128, 16).smem(24, True) == 2 * (128 * 40 + 2 * 32 * 24)


def test_skinny_cost_is_its_dram_traffic_on_memory_bound_shapes():
    """efficientnet_b0's first expand at batch 32 (401,408 pixels, 16 -> 96 channels): the model
    prices it by the bytes it moves, far above its flops."""
    M, N, K = 401_408, 96, 16
    for tile in TILES:
        assert skinny_us(tile, M, N, K, 132) >= memory_us(M, N, K, 1, 2)
    assert skinny_us(SkinnyTile(128, 48), M, N, K, 132) < 1.3 * memory_us(M, N, K, 1, 2) + 3.0


def test_sm90_estimate_is_never_below_the_dram_traffic():
    for tile in CONV_TILES:
        assert predicted_us(tile, 401_408, 24, 144, 1, 132) >= memory_us(401_408, 24, 144, 1, 2)


def test_narrow_chunks_cost_less_where_n_is_narrow():
    """N = 72 in 16-wide chunks pads to 80 columns, in 64-wide chunks to 128: at K = 256 the padded
    mma work outweighs the DRAM traffic, and the narrow tile is predicted faster."""
    M, N, K = 100_352, 72, 256
    narrow, wide = skinny_us(SkinnyTile(128, 16), M, N, K, 132), skinny_us(SkinnyTile(128, 64), M, N, K, 132)
    assert memory_us(M, N, K, 1, 2) < narrow < wide


def test_few_row_tiles_split_n_over_the_grid():
    """1,568 pixels (efficientnet_b0's last stage at batch 32) make 13 row tiles of 128: their
    chunks of N = 1152 are spread over grid y until the SM slots are filled; 401,408 pixels need none."""
    tile = SkinnyTile(128, 32)
    slots = 132 * blocks_per_sm(tile, 192, False)
    assert n_splits(tile, 1568, 1152, 192, 132) == -(-slots // 13) and n_splits(tile, 401_408, 96, 16, 132) == 1
    assert n_splits(tile, 64, 40, 16, 132) == 2  # never more groups than chunks


def pointwise_layer(M_img, C, N, dtype="float16"):
    x, w, y = (2, M_img, 7, C), (N, 1, 1, C), (2, M_img, 7, N)
    return LayerDesc("pw", "ConvNHWC", ("X", "W", "B"), ("Y",), {"kernel_shape": [1, 1]}, domain=POLYKIT_DOMAIN,
                     precision="fp16", in_dtypes=(dtype,) * 3, out_dtypes=(dtype,), in_shapes=(x, w, (N,)),
                     out_shapes=(y,))


def test_pointwise_layers_time_a_skinny_tactic_first():
    """The tuner times a layer's candidates cheapest-estimate first (level 3: the first 4): on a
    memory-bound pointwise convolution a skinny tile leads them; float32 layers are not taken."""
    from polykit.compiler.builder.tuner import by_estimate
    from polykit.kernels.cuda.base import all_cuda_tactics

    layer = pointwise_layer(28_672, 24, 144)  # 401,408 pixels at batch 32, halved
    pairs = [(layer, t) for t in all_cuda_tactics() if t.kind == "ConvNHWC" and t.supports(layer)]
    names = [t.name for _, t in by_estimate(pairs, 132)]
    assert any(n.startswith("cuda.conv_nhwc.skinny_") for n in names)
    assert names[0].startswith("cuda.conv_nhwc.skinny_"), names[:4]
    wide = pointwise_layer(28, 24, 144, "float32")
    assert not any(t.supports(wide) for _, t in pairs if t.name.startswith("cuda.conv_nhwc.skinny_"))


def test_skinny_gemm_declines_batched_b_and_deep_k():
    """A B with its own batch items is not one GEMM, and K past MAX_K does not fit: no skinny tile takes them."""
    from polykit.kernels.cuda.base import all_cuda_tactics

    def matmul(a, b, out):
        return LayerDesc("mm", "MatMul", ("A", "B"), ("Y",), {}, precision="fp16", in_dtypes=("float16", "float16"),
                         out_dtypes=("float16",), in_shapes=(a, b), out_shapes=(out,))

    skinny = [t for t in all_cuda_tactics() if t.kind == "MatMul" and t.name.startswith("cuda.gemm.skinny_")]
    assert len(skinny) == len(TILES) and all(t.supports(matmul((4, 65, 40), (40, 24), (4, 65, 24))) for t in skinny)
    assert not any(t.supports(matmul((4, 65, 40), (4, 40, 24), (4, 65, 24))) for t in skinny)
    assert not any(t.supports(matmul((65, 1024), (1024, 24), (65, 24))) for t in skinny)


# ---- GPU ----------------------------------------------------------------------------------

def require_sm80():
    try:
        from polykit.runtime.cuda import driver

        ok = driver.is_available() and driver.current_device().arch in ARCHS
    except Exception:  # no driver, no GPU
        ok = False
    if not ok:
        pytest.skip("needs a GPU of compute capability 8.0 or later")


def rand(shape, dtype):
    return rng.standard_normal(shape).astype(np.float32).astype(dtype)


SILU = {"input": "raw", "body": [{"op": "Sigmoid", "inputs": ["raw"], "outputs": ["s"], "attrs": {}},
                                 {"op": "Mul", "inputs": ["raw", "s"], "outputs": ["Y"], "attrs": {}}]}
HARDSWISH = {"input": "raw", "body": [{"op": "HardSwish", "inputs": ["raw"], "outputs": ["Y"], "attrs": {}}]}
#: (C, N): the mobile nets' expand / project / SE channel counts, and odd multiples of 8
CHANNELS = [(16, 96), (24, 144), (40, 240), (96, 24), (144, 40), (240, 80), (8, 16), (200, 56), (256, 48),
            (72, 120), (120, 72)]


def conv_case(tile, x_shape, n, dtype, epilogue=None, extra=None):
    x = rand(x_shape, dtype)
    inputs = {"X": x, "W": rand((n, 1, 1, x_shape[-1]), dtype), "B": rand((n,), dtype), **(extra or {})}
    return rel_err(*run_conv(tile, inputs, {}, dtype, epilogue, prefix="skinny"))


#: every tile on every channel pair whose K it fits
CONV_CASES = [(t, c, n) for t in TILES for c, n in CHANNELS if t.fits(c, False)]


@pytest.mark.gpu
@pytest.mark.parametrize("tile,c,n", CONV_CASES, ids=[f"{t.label}-{c}-{n}" for t, c, n in CONV_CASES])
def test_skinny_pointwise_conv_matches_float64_reference(tile, c, n):
    """Odd pixel counts (2 x 13 x 11 = 286: a partial last tile) and every chunk width."""
    require_sm80()
    assert conv_case(tile, (2, 13, 11, c), n, FP16) <= TOL[FP16]


@pytest.mark.gpu
@pytest.mark.parametrize("epilogue,name", [(RELU, "relu"), (SILU, "silu"), (HARDSWISH, "hardswish")])
@pytest.mark.parametrize("dtype", [FP16, BF16], ids=["fp16", "bf16"])
def test_skinny_pointwise_conv_with_activation_epilogue(epilogue, name, dtype):
    require_sm80()
    assert conv_case(TILES[1], (3, 9, 7, 40), 72, dtype, epilogue) <= TOL[dtype]


@pytest.mark.gpu
@pytest.mark.parametrize("tile", [TILES[0], TILES[3]], ids=lambda t: t.label)
def test_skinny_pointwise_conv_with_residual_relu_epilogue(tile):
    """The project convolution's residual add (here with a Relu after it)."""
    require_sm80()
    extra = {"skip": rand((2, 15, 9, 24), FP16)}
    assert conv_case(tile, (2, 15, 9, 144), 24, FP16, RESIDUAL_RELU, extra) <= TOL[FP16]


MATMUL_SHAPES = [((333, 16), (16, 96)), ((3, 101, 40), (40, 24)), ((1000, 256), (256, 48)), ((77, 72), (72, 136))]
#: every tile on every shape whose K it fits (fp16), the first tile on each (bf16)
MATMUL_CASES = ([(t, a, b, FP16) for t in TILES for a, b in MATMUL_SHAPES if t.fits(a[-1], True)]
                + [(TILES[0], a, b, BF16) for a, b in MATMUL_SHAPES])


@pytest.mark.gpu
@pytest.mark.parametrize("tile,a_shape,b_shape,dtype", MATMUL_CASES,
                         ids=[f"{t.label}-{a}x{b}-{d.name}" for t, a, b, d in MATMUL_CASES])
def test_skinny_matmul_matches_float64_reference(tile, a_shape, b_shape, dtype):
    """A [K, N] B (B_KN 1): shared by every batch item of A, whose batch folds into M."""
    require_sm80()
    a, b = rand(a_shape, dtype), rand(b_shape, dtype)
    ref = np.matmul(a.astype(np.float64), b.astype(np.float64))
    out = run(LayerDesc("mm", "MatMul", ("A", "B"), ("Y",), {}), {"A": a, "B": b}, f"cuda.gemm.skinny_{tile.label}",
              ref.shape, dtype)
    assert rel_err(out, ref) <= TOL[dtype]


@pytest.mark.gpu
@pytest.mark.parametrize("tile", [TILES[0], TILES[2], TILES[4]], ids=lambda t: t.label)
@pytest.mark.parametrize("trans_b,c_shape", [(1, (40,)), (0, (301, 1)), (1, (301, 40)), (0, None)])
def test_skinny_gemm_with_alpha_beta_and_broadcast_c(tile, trans_b, c_shape):
    require_sm80()
    M, K, N = 301, 56, 40
    a = rand((M, K), FP16)
    b = rand((N, K) if trans_b else (K, N), FP16)
    inputs = {"A": a, "B": b}
    ref = 0.75 * (a.astype(np.float64) @ (b.T if trans_b else b).astype(np.float64))
    if c_shape is not None:
        inputs["C"] = rand(c_shape, FP16)
        ref = ref - 1.5 * inputs["C"].astype(np.float64)
    layer = LayerDesc("gemm", "Gemm", tuple(inputs), ("Y",), {"transB": trans_b, "alpha": 0.75, "beta": -1.5})
    assert rel_err(run(layer, inputs, f"cuda.gemm.skinny_{tile.label}", (M, N), FP16), ref) <= TOL[FP16]

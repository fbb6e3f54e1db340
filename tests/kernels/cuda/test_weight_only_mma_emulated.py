"""weight_only_mma.cu and weight_only_mma_staged.cu emulated on the host (no GPU; block_emulation.py,
every thread a real thread, warp_emulation.py's mma.sync, prmt and cp.async).

The dequantization alone (weight_only_mma.cuh: the magic-number decode and the packed 16-bit subtract
and multiply, their PTX modelled per half with one rounding) runs in a tiny kernel against numpy's
DequantizeLinear value, bit for bit, over every code at every nibble of a word, many scales and
zero points of the 8-bit range. The whole kernels run through their tactics' real enqueue, outputs
(and the staged kernel's split-K workspace) poisoned, against the cpu reference.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from polykit.compiler.ops.quant.weight_only import unpack_values
from polykit.kernels.cuda.base import DeviceTensor, KernelSource
from polykit.kernels.cuda.int8.weight_only_mma import ELEMS, MMA_TILES
from polykit.kernels.cuda.int8.weight_only_mma_staged import FILE as STAGED_FILE
from polykit.kernels.cuda.int8.weight_only_mma_staged import KERNEL as STAGED_KERNEL
from polykit.kernels.cuda.int8.weight_only_mma_staged import ROLLED_TILES, STAGED_TILES
from tests.kernels.weight_only_cases import BF16, random_layer

WQ_CODES = {"int4": 0, "uint4": 1}
DEQUANT = r"""
#include "weight_only_mma.cuh"
template <int WT>
__device__ void wq_check_one(const u32* words, const unsigned short* scales, const int* zps, u32* out, int i) {
  u32 w[4];
  WqDequant<ELEM, WT>(scales[i], zps[i])(words[i], w);
  for (int e = 0; e < 4; ++e) out[4 * i + e] = w[e];
}
extern "C" __global__ void wq_dequant_check(const u32* words, const unsigned short* scales, const int* zps, u32* out,
                                            int n, int wtype) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    if (wtype == WQ_I4) wq_check_one<WQ_I4>(words, scales, zps, out, i);
    else wq_check_one<WQ_U4>(words, scales, zps, out, i);
  }
}
"""
KERNEL_PARAMS = ("const ELEM* x, const u8* w, const ELEM* scale, const void* zero, const ELEM* bias, ELEM* y, int M, "
                 "int N, int K, int ldw, int block, int nb, int wtype")
KERNEL_ARGS = "x, w, scale, zero, bias, y, M, N, K, ldw, block, nb, wtype"


@pytest.fixture(scope="module")
def dequant_launcher(tmp_path_factory):
    from tests.kernels.cuda.block_emulation import host_launcher

    return host_launcher(tmp_path_factory, "const u32* words, const unsigned short* scales, "
                         "const int* zps, u32* out, int n, int wtype", "words, scales, zps, out, n, wtype")


@pytest.fixture(scope="module")
def launcher(tmp_path_factory):
    from tests.kernels.cuda.block_emulation import host_launcher

    return host_launcher(tmp_path_factory, KERNEL_PARAMS, KERNEL_ARGS)


@pytest.fixture(scope="module")
def staged_launcher(tmp_path_factory):
    """The staged kernel and its reduce (one parameter list) on the host, lending NaN-poisoned workspace
    and poisoning the staged X's shared memory (all ones: NaN in float16 and bfloat16) before each launch,
    so that a read of what the kernel did not stage shows."""
    from tests.kernels.cuda.block_emulation import EmulatedLauncher, host_launcher, kernel_signature

    class LendingLauncher(EmulatedLauncher):
        def launch(self, kernel, grid, block, args, shared_mem=0):
            if kernel.name == STAGED_KERNEL:
                ctypes.memset((ctypes.c_ubyte * self.smem).in_dll(self._lib(kernel), "xs_smem"), 0xFF, self.smem)
            super().launch(kernel, grid, block, args, shared_mem)

        def workspace(self, nbytes: int) -> int:
            buf = np.full(-(-nbytes // 4), np.nan, np.float32)
            self.lent.append(buf)
            return buf.ctypes.data

    launcher = host_launcher(tmp_path_factory, *kernel_signature(STAGED_FILE, STAGED_KERNEL),
                             cls=LendingLauncher)
    launcher.lent = []
    return launcher


def tensor(a: np.ndarray) -> DeviceTensor:
    return DeviceTensor(a.ctypes.data, a.shape, a.dtype)


def dequant_inputs(dtype, weight_type, seed=0):
    """Words whose 8 nibbles each take all 16 codes (and random ones), scales of both signs over 2^-24
    .. 2^8 (float16 subnormals included), zero points over the zero point type's whole range."""
    rng = np.random.default_rng(seed)
    n = 4096
    nibbles = rng.integers(0, 16, (n, 8), dtype=np.uint32)
    nibbles[:16] = (np.arange(16)[:, None] + np.arange(8)[None, :]) % 16
    words = (nibbles << (4 * np.arange(8, dtype=np.uint32))).sum(axis=1, dtype=np.uint32)
    scales = (rng.choice([-1.0, 1.0], n) * 2.0 ** rng.uniform(-24, 8, n)).astype(dtype)
    scales[:16] = np.asarray(1.0, dtype)
    low, high = (-128, 128) if weight_type == "int4" else (0, 256)
    zps = rng.integers(low, high, n).astype(np.int32)
    zps[: n // 2] = rng.integers(*((-8, 8) if weight_type == "int4" else (0, 16)), n // 2)  # the codes' own range
    return words, scales, zps


def expected_pairs(words, scales, zps, weight_type):
    """DequantizeLinear's value of each code (float64, rounded once to the scale's type) as the
    kernel's pairs: word i -> (c0, c4), (c1, c5), (c2, c6), (c3, c7), the low half first."""
    codes = unpack_values(words.view(np.uint8).reshape(len(words), 4), 8, weight_type).astype(np.float64)
    w = ((codes - zps[:, None]) * scales.astype(np.float64)[:, None]).astype(scales.dtype).view(np.uint16)
    return (w[:, :4].astype(np.uint32) | (w[:, 4:].astype(np.uint32) << 16)).reshape(-1)


@pytest.mark.parametrize("weight_type", list(WQ_CODES))
@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["float16", "bfloat16"])
def test_the_packed_dequantization_is_dequantize_linear_bit_for_bit(dequant_launcher, dtype, weight_type):
    words, scales, zps = dequant_inputs(np.dtype(dtype), weight_type)
    out = np.zeros(4 * len(words), np.uint32)
    bits = scales.view(np.uint16)
    source = KernelSource("wq_dequant_check", code=DEQUANT,
                          defines=(("ELEM", ELEMS[np.dtype(dtype).name]),))
    dequant_launcher.launch(source, (1,), (64,), [tensor(words), tensor(bits), tensor(zps), tensor(out),
                                                  np.int32(len(words)), np.int32(WQ_CODES[weight_type])])
    want = expected_pairs(words, scales, zps, weight_type)
    bad = np.flatnonzero(out != want)
    assert bad.size == 0, f"{bad.size} pairs differ, first {bad[:4]}: {out[bad[:4]]} != {want[bad[:4]]}"


def run_emulated(launcher, tactic_name, layer, inputs, shift_x=0):
    """The tactic's real enqueue on the emulated launcher, Y poisoned (NaN) first, X `shift_x`
    elements past a 16-byte boundary; Y."""
    from polykit.compiler.ops.quant.weight_only import KIND
    from polykit.kernels.tactics import find_tactic

    tactic = find_tactic("cuda", KIND, tactic_name)
    assert tactic.supports(layer)
    x = inputs["X"]
    n = inputs["W"].shape[0]
    y = np.full((*x.shape[:-1], n), np.nan, x.dtype)
    tensors = {name: tensor(np.ascontiguousarray(a)) for name, a in inputs.items()}
    moved = np.empty(x.size + 8, x.dtype)  # numpy's buffer: 16-byte aligned
    moved[shift_x:shift_x + x.size] = x.reshape(-1)
    tensors["X"] = DeviceTensor(moved.ctypes.data + shift_x * x.itemsize, x.shape, x.dtype)
    tensors["Y"] = tensor(y)
    tactic.enqueue(layer, launcher, tensors)
    lent = getattr(launcher, "lent", [])
    assert sum(buf.nbytes for buf in lent) <= tactic.workspace(layer, tensors, 132)  # what a build sets aside
    lent.clear()
    return y


# M = 1, 5 (rows g + 8 not loaded), 16, 17 (two row tiles); N odd (tiles past N); K a multiple of 16 and not
# of 32 or 128 (chunks and slices past K); blocks of 32 and 128
MMA_CASES = [((1, 272), 37, 32), ((5, 208), 21, 128), ((16, 144), 19, 32), ((17, 400), 13, 128)]
# the staged kernel: those (one block's K range: slices and chunks past K skipped or zero) and K past a
# block's range (split over blocks into the workspace and reduced: 2 splits of c16_k4096, 3 of c32_k2048, 5
# of c64_k1024 at K = 4112; 2 of c64_k1024 at K = 1040, whose last split holds 16 elements); blocks of 96 and
# 160, which do not divide a warp's step from slice to slice (128 x WK elements): the scale block's carry; and
# K = 4096, N = 32, where every block of the 16- and 32-column tiles lies within N and K (the kernel's FULL body,
# unpredicated loads; K = 4112's first split and N = 17's first block take it too, beside the bounded body); K =
# 4096, blocks of 128 at M = 2 (float16) and 3 (bfloat16): the FULL body's scale-after sets (xs_slices' AFTER).
# The K = 4096 cases on two tiles only (c16_k4096 whole, c32_k2048 split in 2): their emulation is the slowest
STAGED_CASES = MMA_CASES + [((1, 4112), 17, 128), ((17, 1040), 11, 32), ((5, 2064), 9, 64), ((3, 1056), 7, 96),
                            ((2, 4400), 5, 160), ((1, 4096), 32, 64), ((2, 4096), 32, 128), ((3, 4096), 16, 128)]
FULL_CASES = STAGED_CASES[-3:]
FULL_TILES = [tile for tile in STAGED_TILES if tile.name.endswith(("_c16_k4096", "_c32_k2048"))]
EMULATED = [(tile, *case) for tile in MMA_TILES for case in MMA_CASES] + \
    [(tile, *case) for tile in STAGED_TILES for case in STAGED_CASES
     if case not in FULL_CASES or tile in FULL_TILES]


def launcher_of(request, tile):
    return request.getfixturevalue("staged_launcher" if tile in STAGED_TILES + ROLLED_TILES else "launcher")


def assert_emulated_matches(launcher, tile, layer, inputs, shift_x=0):
    from polykit.runtime.cuda.harness import reference_layer
    from tests.kernels.cuda.test_weight_only import STAGED_SCALE_AFTER, TOLERANCE, assert_near_the_reference

    got = run_emulated(launcher, tile.name, layer, inputs, shift_x)
    if tile.name in STAGED_SCALE_AFTER and int(layer.attrs["block_size"]) % 128 == 0:  # unrounded weights there
        assert_near_the_reference(got, layer, inputs)
        return
    rtol, atol = TOLERANCE[inputs["X"].dtype]
    want = reference_layer(layer, inputs)["Y"]
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=rtol, atol=atol)


@pytest.mark.parametrize("zero_point,bias", [(True, True), (False, False)], ids=["zp_bias", "plain"])
@pytest.mark.parametrize("weight_type", list(WQ_CODES))
@pytest.mark.parametrize("tile,x_shape,n,block", EMULATED, ids=[f"{t.name}-{c}" for t, *c in EMULATED])
def test_the_emulated_kernel_matches_the_reference(request, tile, x_shape, n, block, weight_type, zero_point, bias):
    dtype = (np.float16, BF16)[STAGED_CASES.index((x_shape, n, block)) % 2]
    layer, inputs = random_layer(x_shape, n, weight_type, block, dtype=dtype, zero_point=zero_point, bias=bias,
                                 seed=n)
    assert_emulated_matches(launcher_of(request, tile), tile, layer, inputs)


@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("tile", [MMA_TILES[0], *STAGED_TILES], ids=lambda tile: tile.name)
def test_the_emulated_kernel_reads_a_misaligned_x_element_by_element(request, tile, dtype):
    """X 2 bytes past a 16-byte boundary: element loads (the staged kernel: element stores to shared memory)
    in place of 16-byte ones; K = 1040 splits the staged c64_k1024 tile."""
    layer, inputs = random_layer((9, 1040 if tile in STAGED_TILES else 144), 11, "int4", 32, dtype=dtype, seed=3)
    assert_emulated_matches(launcher_of(request, tile), tile, layer, inputs, shift_x=1)


def test_the_emulated_split_kernel_launches_its_reduce_after_the_splits(staged_launcher):
    """K past a block's range: the main kernel's grid has one z a split and the reduce runs after it; K
    within it: one launch, Y written directly."""
    tile = next(tile for tile in STAGED_TILES if tile.k_block == 1024)  # c64_k1024
    for k, launches in ((1040, [(STAGED_KERNEL, 2), ("weight_only_mma_reduce", 1)]), (272, [(STAGED_KERNEL, 1)])):
        layer, inputs = random_layer((2, k), 8, "uint4", 32, dtype=np.float16, seed=k)
        staged_launcher.launches.clear()
        run_emulated(staged_launcher, tile.name, layer, inputs)
        assert [(kernel.name, grid[2]) for kernel, grid, _, _ in staged_launcher.launches] == launches


@pytest.mark.parametrize("weight_type", list(WQ_CODES))
@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["float16", "bfloat16"])
def test_the_scale_after_sets_give_the_unrounded_weights_sums(request, dtype, weight_type):
    """M = 3, N = 32, K = 4096, blocks of 128 on c16_k4096: every block within N and K, one row tile of 3 rows, so every
    slice is scaled after its sums (weight_only_mma_staged.cu's AFTER): within TOLERANCE of the unrounded weights' Y
    (and of the reference plus its own rounding: assert_rows_match), as weight_only_mma_rows is."""
    from polykit.runtime.cuda.harness import reference_layer
    from tests.kernels.cuda.test_weight_only import assert_rows_match, rows_expected

    tile = next(tile for tile in STAGED_TILES if tile.name.endswith("_c16_k4096"))
    layer, inputs = random_layer((3, 4096), 32, weight_type, 128, dtype=dtype, zero_point=True, bias=True, seed=5)
    got = run_emulated(request.getfixturevalue("staged_launcher"), tile.name, layer, inputs)
    assert_rows_match(got, layer, inputs)
    # and closer to the unrounded Y than the reference (weights rounded to 16 bits) is: the scaled-weights path
    # would be as far from it as the reference, the scale-after one is a float32 sum's rounding away
    exact = rows_expected(layer, inputs)[0].astype(np.float64)
    ours, theirs = (np.abs(y.astype(np.float64) - exact).mean() for y in (got, reference_layer(layer, inputs)["Y"]))
    assert ours < 0.5 * theirs, (ours, theirs)


# the rolled tiles (XS_ROLLED: decode's blocks land their weights in shared memory and run one slice body SW times):
# M = 1 and 5 at K = 272 / 208 (bounded blocks: the unrolled bodies, beside the rolled path in the same kernel), and
# the FULL cases' M = 2 / 3 at blocks of 128, where every block is rolled: bit for bit what the unrolled tile of the
# same geometry computes (the same sums in the same order), both weight types, with and without zero points
ROLLED_PAIRS = [(tile, next(t for t in STAGED_TILES if t.name == tile.name.removesuffix("_r"))) for tile in ROLLED_TILES]


@pytest.mark.parametrize("zero_point,bias", [(True, True), (False, False)], ids=["zp_bias", "plain"])
@pytest.mark.parametrize("weight_type", list(WQ_CODES))
@pytest.mark.parametrize("x_shape,n,block", MMA_CASES[:2])
def test_the_rolled_tiles_bounded_blocks_match_the_reference(request, x_shape, n, block, weight_type, zero_point,
                                                             bias):
    layer, inputs = random_layer(x_shape, n, weight_type, block, dtype=np.float16, zero_point=zero_point, bias=bias,
                                 seed=n)
    assert_emulated_matches(launcher_of(request, ROLLED_TILES[0]), ROLLED_TILES[0], layer, inputs)


@pytest.mark.parametrize("zero_point,bias", [(True, True), (False, False)], ids=["zp_bias", "plain"])
@pytest.mark.parametrize("weight_type", list(WQ_CODES))
@pytest.mark.parametrize("x_shape,n,dtype", [((2, 4096), 32, np.float16), ((3, 4096), 16, BF16)],
                         ids=["m2_float16", "m3_bfloat16"])
@pytest.mark.parametrize("rolled,unrolled", ROLLED_PAIRS[:1], ids=lambda t: t.name)
def test_the_rolled_slice_body_computes_the_unrolled_scale_after_bit_for_bit(request, rolled, unrolled, x_shape, n,
                                                                             dtype, weight_type, zero_point, bias):
    layer, inputs = random_layer(x_shape, n, weight_type, 128, dtype=dtype, zero_point=zero_point, bias=bias, seed=n)
    launcher = launcher_of(request, rolled)
    got, want = (run_emulated(launcher, tile.name, layer, inputs) for tile in (rolled, unrolled))
    assert not np.isnan(got.astype(np.float32)).any()  # every output written (Y was NaN-poisoned)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    assert_emulated_matches(launcher, rolled, layer, inputs)

"""weight_only_mma_rows.cu emulated on the host (no GPU; block_emulation.py, every thread a real thread,
warp_emulation.py's mma.sync, prmt and cp.async), and its tiles' ptxas report (NVRTC, no GPU).

Every tile runs through its tactic's real enqueue, Y, the split-K workspace and the staged X's shared memory
poisoned (NaN), against test_weight_only.assert_rows_match (TOLERANCE of the unrounded weights' Y, and of the cpu
reference plus the reference's own weight rounding: the kernel never rounds a weight to 16 bits), over the staged kernel's cases whose
block is a multiple of 128 (and more of those: K not a multiple of 128, K past a block's range, M = 1, 5, 16, 17),
int4 / uint4, with and without zero points and bias, float16 and bfloat16, X misaligned. Blocks of 32 / 64 are
refused: supports() False on a stamped layer, a DeviceError at enqueue of a hand-built one.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from polykit.kernels.cuda.int8.weight_only_mma_rows import FILE, KERNEL, ROWS_TILES
from tests.kernels.cuda.test_weight_only import assert_rows_match
from tests.kernels.cuda.test_weight_only_mma_emulated import WQ_CODES, run_emulated
from tests.kernels.weight_only_cases import BF16, random_layer


@pytest.fixture(scope="module")
def rows_launcher(tmp_path_factory):
    """The rows kernel and the staged reduce (one parameter list) on the host, lending NaN-poisoned workspace and
    poisoning the staged X's shared memory (all ones: NaN in float16 and bfloat16) before each launch."""
    from tests.kernels.cuda.block_emulation import EmulatedLauncher, host_launcher, kernel_signature

    class LendingLauncher(EmulatedLauncher):
        def launch(self, kernel, grid, block, args, shared_mem=0):
            if kernel.name == KERNEL:
                ctypes.memset((ctypes.c_ubyte * self.smem).in_dll(self._lib(kernel), "wr_smem"), 0xFF, self.smem)
            super().launch(kernel, grid, block, args, shared_mem)

        def workspace(self, nbytes: int) -> int:
            buf = np.full(-(-nbytes // 4), np.nan, np.float32)
            self.lent.append(buf)
            return buf.ctypes.data

    launcher = host_launcher(tmp_path_factory, *kernel_signature(FILE, KERNEL), cls=LendingLauncher)
    launcher.lent = []
    return launcher


# (X shape, N, block), blocks of 128 and 256: M = 1, 5 (X rows g + 8 absent: one column tile), 16, 17 (two row
# tiles), rows folded from batch dims; N odd (weight rows past N); K a multiple of 16 but not of 128 (chunks and
# slices past K); K past every tile's range (split into the workspace and reduced: K = 4112 splits n16_k4096 in 2,
# the others in 3 / 5, the last split 16 elements); K = 1040 splits n64_k1024 (the last split 16 elements); a block
# of 384, not a power of two (the scale stream's start by the division, wq_divmod; the others by a shift); K = 4096,
# N = 32: every block of the 16- and 32-row tiles within N and K (the FULL body: unpredicated copies)
ROWS_CASES = [((1, 272), 37, 128), ((5, 208), 21, 128), ((16, 400), 19, 256), ((17, 400), 13, 128),
              ((1, 4112), 17, 128), ((17, 1040), 11, 128), ((2, 3, 2064), 9, 256), ((3, 1056), 7, 128),
              ((2, 800), 7, 384), ((1, 4096), 32, 128)]
#: (the all-in-bounds K = 4096 case on n16_k4096 only: the slowest emulation)
EMULATED = [(tile, *case) for tile in ROWS_TILES for case in ROWS_CASES
            if case != ((1, 4096), 32, 128) or tile.name.endswith("_n16_k4096")]


@pytest.mark.parametrize("zero_point,bias", [(True, True), (False, False)], ids=["zp_bias", "plain"])
@pytest.mark.parametrize("weight_type", list(WQ_CODES))
@pytest.mark.parametrize("tile,x_shape,n,block", EMULATED, ids=[f"{t.name}-{c}" for t, *c in EMULATED])
def test_the_emulated_rows_kernel_matches_the_reference(rows_launcher, tile, x_shape, n, block, weight_type,
                                                        zero_point, bias):
    dtype = (np.float16, BF16)[ROWS_CASES.index((x_shape, n, block)) % 2]
    layer, inputs = random_layer(x_shape, n, weight_type, block, dtype=dtype, zero_point=zero_point, bias=bias,
                                 seed=n)
    assert_rows_match(run_emulated(rows_launcher, tile.name, layer, inputs), layer, inputs)


@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("tile", ROWS_TILES, ids=lambda tile: tile.name)
def test_the_emulated_rows_kernel_reads_a_misaligned_x_element_by_element(rows_launcher, tile, dtype):
    """X 2 bytes past a 16-byte boundary: element stores to shared memory in place of cp.async; K = 1040 splits
    every tile."""
    layer, inputs = random_layer((9, 1040), 11, "int4", 128, dtype=dtype, seed=3)
    assert_rows_match(run_emulated(rows_launcher, tile.name, layer, inputs, shift_x=1), layer, inputs)


@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["float16", "bfloat16"])
def test_the_emulated_rows_kernel_takes_zero_points_of_the_whole_8_bit_range(rows_launcher, dtype):
    """uint4 with zero points far outside the codes' range: value - zero point down to -255 (exact in bfloat16's
    8 bits), int4's down to -128 in another case."""
    for weight_type, low, high in (("uint4", 0, 256), ("int4", -128, 128)):
        layer, inputs = random_layer((3, 256), 24, weight_type, 128, dtype=dtype, seed=7)
        zeros = np.random.default_rng(7).integers(low, high, inputs["Z"].shape)
        inputs["Z"] = zeros.astype(inputs["Z"].dtype)
        assert_rows_match(run_emulated(rows_launcher, ROWS_TILES[0].name, layer, inputs), layer, inputs)


def test_the_emulated_rows_kernel_launches_the_staged_reduce_after_its_splits(rows_launcher):
    """K past a block's range: the rows kernel's grid has one z a split and weight_only_mma_staged.cu's reduce
    runs after it; K within it: one launch, Y written directly."""
    tile = next(tile for tile in ROWS_TILES if tile.k_block == 1024)
    for k, launches in ((1040, [(KERNEL, 2), ("weight_only_mma_reduce", 1)]), (272, [(KERNEL, 1)])):
        layer, inputs = random_layer((2, k), 8, "uint4", 128, dtype=np.float16, seed=k)
        rows_launcher.launches.clear()
        run_emulated(rows_launcher, tile.name, layer, inputs)
        assert [(kernel.name, grid[2]) for kernel, grid, _, _ in rows_launcher.launches] == launches
        assert [kernel.file for kernel, *_ in rows_launcher.launches] == \
            ["weight_only_mma_rows.cu", "weight_only_mma_staged.cu"][:len(launches)]


@pytest.mark.parametrize("block", [32, 64, 96])
@pytest.mark.parametrize("tile", ROWS_TILES[:1], ids=lambda tile: tile.name)
def test_the_rows_tactics_refuse_blocks_that_are_not_a_multiple_of_128(tile, block):
    """A stamped layer: supports() False (the staged and mma tiles still take it); a hand-built one (types known
    at enqueue only) passes supports() only if its block fits, else a DeviceError naming the block, the tactic and
    the layer, before anything launches."""
    from polykit.compiler.ops.quant.weight_only import KIND
    from polykit.errors import DeviceError
    from polykit.kernels.cuda.base import DeviceTensor
    from polykit.kernels.tactics import find_tactic
    from tests.kernels.cuda.test_weight_only import stamped

    tactic = find_tactic("cuda", KIND, tile.name)
    assert not tactic.supports(stamped(block=block, k=256))
    assert tactic.supports(stamped(block=128, k=256)) and tactic.supports(stamped(block=256, k=256))
    assert find_tactic("cuda", KIND, "cuda.weight_only.mma_staged_c16_k4096").supports(stamped(block=block, k=256))

    class Refuser:
        sm_count = 132

        def launch(self, *args, **kwargs):
            raise AssertionError("launched")

        def workspace(self, nbytes):
            raise AssertionError("borrowed")

    layer, inputs = random_layer((2, 256), 8, "int4", block, dtype=np.float16)
    tensors = {name: DeviceTensor(1 << 20, a.shape, a.dtype) for name, a in inputs.items()}
    tensors["Y"] = DeviceTensor(1 << 20, (2, 8), np.dtype(np.float16))
    with pytest.raises(DeviceError, match=f"multiple of 128: got block {block}") as info:
        tactic.enqueue(layer, Refuser(), tensors)
    assert "'wo'" in str(info.value) and tile.name in str(info.value)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("elem", ["half_t", "bf16_t"])
@pytest.mark.parametrize("tile", ROWS_TILES, ids=lambda tile: tile.name)
def test_every_rows_tile_fits_its_registers_without_spilling(tile, elem, arch):
    """ptxas -v (NVRTC, the tactics' archs, no GPU): at most 128 registers a thread (what __launch_bounds__ asks: the blocks an SM
    the model counts) and no spill stores or loads (weight_only_mma_rows.py's module docstring has the counts)."""
    import io
    import re

    pytest.importorskip("cuda.core")
    from cuda.core import Program, ProgramOptions

    from polykit.runtime.cuda import nvrtc

    options = ProgramOptions(arch=arch, name=FILE, include_path=[str(nvrtc.CUDA_DIR)], ptxas_options="-v",
                             **dict(nvrtc.BASE_OPTIONS))
    log = io.StringIO()
    Program(tile.source(elem).render(), "c++", options).compile("cubin", logs=log)
    text = log.getvalue()
    regs = [int(r) for r in re.findall(r"Used (\d+) registers", text)]
    spills = [int(b) for b in re.findall(r"(\d+) bytes spill (?:stores|loads)", text)]
    assert regs and spills, f"ptxas -v printed no register report for {tile.name}:\n{text}"
    assert max(regs) <= 128 and not any(spills), text

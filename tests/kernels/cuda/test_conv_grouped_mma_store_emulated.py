"""conv_grouped_mma.cuh's gm_store, the store that conv_grouped_mma.cu and conv_grouped_mma_pipe.cu
(the grouped mma and halo-tile tactics) share, run on the host (block_emulation.py): a probe kernel
fills each warp's accumulator fragments with their ids and calls gm_store over a grid of tiles, into
an output placed in a Concat's slice (pixel rows LDY elements apart, the slice a wider poisoned
buffer) or dense (LDY == M). Every element must land where the m16n8 fragment layout puts it
(lane l: pixels l / 4 and l / 4 + 8 of its m16 tile, channels 2 (l % 4) + {0, 1} of its n8 tile),
plus the bias and the epilogue, which reads its residual at the dense index; the bytes outside the
slice keep their poison; with the pair stores (vec_out) and element by element."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, defines
from polykit.kernels.cuda.gemm.epilogue import epilogue_args, epilogue_prelude
from tests.kernels.cuda.test_conv_depthwise import F16, RESIDUAL_RELU

#: each warp's tiles (the warp shape of conv_grouped_mma.py's WARP_TILES)
WM = 2
#: the probe: block (tile blockIdx.x of image blockIdx.z, channel slice blockIdx.y of CB channels),
#: warps as the kernels place them (channel warp w % CW, pixel warp w / CW); accumulator element
#: (mi, ni, e) of lane l of warp w holds its id ((w * 32 + l) * GM_WM + mi) * GM_NB + ni) * 4 + e
PROBE = r"""
#include "conv_grouped_mma.cuh"
#define PROBE_PARAMS const ELEM *Bias, ELEM *Y, int OH, int OW, int M, int TH, int TW, int tiles_w, int CB, \
    int vec_out, i64 LDY EPI_PARAMS
#define PROBE_ARGS Bias, Y, OH, OW, M, TH, TW, tiles_w, CB, vec_out, LDY EPI_COMMA_ARGS
extern "C" __global__ void gm_store_probe(PROBE_PARAMS) {
  GM_EPI_STATE
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, CW = CB / (8 * GM_NB);
  GM_TILE(blockIdx.x)
  float acc[GM_WM][GM_NB][4];
  for (int mi = 0; mi < GM_WM; ++mi)
    for (int ni = 0; ni < GM_NB; ++ni)
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = (float)((((warp * 32 + lane) * GM_WM + mi) * GM_NB + ni) * 4 + e);
  gm_store(acc, Bias, Y, (int)blockIdx.z, OH, OW, M, TH, TW, oh0, ow0, warp / CW * 16 * GM_WM,
           (int)blockIdx.y * CB + warp % CW * 8 * GM_NB, lane, vec_out, LDY GM_EPI_ARG);
}
"""


@pytest.fixture(scope="module")
def launcher(tmp_path_factory):
    from tests.kernels.cuda.block_emulation import host_launcher

    return host_launcher(tmp_path_factory, "PROBE_PARAMS", "PROBE_ARGS")


def residual_layer(y: tuple[int, ...]) -> LayerDesc:
    """A ConvNHWC whose epilogue adds a residual of the output's shape, then Relu."""
    attrs = {"group": 1, "kernel_shape": [1, 1], "epilogue": RESIDUAL_RELU}
    w = (y[3], 1, 1, 8)
    return LayerDesc("probe", "ConvNHWC", ("X", "W", "B", "skip"), ("Y",), attrs, domain="ai.polykit",
                     in_shapes=(y[:3] + (8,), w, (y[3],), y), out_shapes=(y,),
                     in_dtypes=("float16",) * 4, out_dtypes=("float16",))


def expected(y: tuple[int, ...], th: int, tw: int, cb: int, nb: int, warps: int) -> np.ndarray:
    """The accumulator id each output element gets from the fragment layout (NaN: none)."""
    n_img, oh_, ow_, m = y
    out = np.full(y, np.nan)
    tiles_w, cw = -(-ow_ // tw), cb // (8 * nb)
    for n in range(n_img):
        for tile in range(-(-oh_ // th) * tiles_w):
            oh0, ow0 = tile // tiles_w * th, tile % tiles_w * tw
            for s in range(-(-m // cb)):
                for warp in range(warps):
                    p0, c0 = warp // cw * 16 * WM, s * cb + warp % cw * 8 * nb
                    for lane in range(32):
                        gid, tig = divmod(lane, 4)
                        for mi in range(WM):
                            for ni in range(nb):
                                for e in range(4):
                                    p = p0 + mi * 16 + gid + 8 * (e // 2)
                                    pr, pc = divmod(p, tw)
                                    co = c0 + ni * 8 + 2 * tig + e % 2
                                    if pr >= th or oh0 + pr >= oh_ or ow0 + pc >= ow_ or co >= m:
                                        continue
                                    assert np.isnan(out[n, oh0 + pr, ow0 + pc, co]), "two lanes own one element"
                                    out[n, oh0 + pr, ow0 + pc, co] = (((warp * 32 + lane) * WM + mi) * nb + ni) * 4 + e
    return out


def run_probe(launcher, y, th, tw, cb, nb, warps, before, after, vec_out, epilogue):
    """gm_store_probe over every tile, slice and image of output `y` (N, OH, OW, M) placed `before`
    elements into rows of before + M + after; (the rows, the expected slice)."""
    m = y[3]
    ldy = before + m + after
    rows = np.full((int(np.prod(y[:3])), ldy), np.nan, F16)   # numpy's buffer: 16-byte aligned
    rng = np.random.default_rng(7)
    bias = rng.integers(0, 8, m).astype(F16)
    layer = residual_layer(y) if epilogue else None
    code, shape = PROBE, defines(GM_WM=WM, GM_NB=nb)
    tensors = {"B": DeviceTensor(bias.ctypes.data, bias.shape, F16),
               "Y": DeviceTensor(rows.ctypes.data + before * 2, y, F16, ldy)}
    want = expected(y, th, tw, cb, nb, warps) + bias
    if layer is not None:
        skip = rng.integers(-600, 8, y).astype(F16)   # some sums below zero: the Relu's
        tensors["skip"] = DeviceTensor(skip.ctypes.data, y, F16)
        code = epilogue_prelude(layer, "half_t") + code
        want = np.maximum(want + skip, 0)
    else:
        shape = defines(ELEM="half_t") + shape
    tiles_w = -(-y[2] // tw)
    grid = (-(-y[1] // th) * tiles_w, -(-m // cb), y[0])
    ints = [np.int32(a) for a in (y[1], y[2], m, th, tw, tiles_w, cb, vec_out)]
    args = [tensors["B"], tensors["Y"], *ints, ldy]
    if layer is not None:
        args += epilogue_args(layer, tensors, F16)
    launcher.launch(KernelSource("gm_store_probe", code=code, defines=shape), grid, (32 * warps,), args)
    return rows, want


#: (output N, OH, OW, M; tile TH x TW; CB; GM_NB; warps): tiles past the output's edges, pixels past
#: a tile's TH rows in its warps, a last slice past M, two images
LAYOUTS = [
    ((2, 5, 9, 24), 3, 16, 16, 2, 2),    # one channel warp of 2 n8 tiles, two pixel warps
    ((1, 6, 11, 16), 4, 8, 16, 1, 2),    # two channel warps of one n8 tile each, one pixel warp
    ((1, 3, 7, 32), 3, 7, 32, 4, 1),     # one warp of 4 n8 tiles
]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("before,after,vec_out", [
    (8, 16, 1),    # pair stores into rows 24 + M apart
    (2, 0, 1),     # the slice 4 bytes in, rows M + 2 apart
    (3, 5, 0),     # the slice 6 bytes in: element stores
    (0, 0, 1),     # dense (LDY == M)
    (0, 0, 0),
])
def test_gm_store_puts_each_fragment_element_in_its_row_of_the_slice(launcher, layout, before, after, vec_out):
    y = layout[0]
    rows, want = run_probe(launcher, *layout, before, after, vec_out, epilogue=False)
    got = rows[:, before:before + y[3]].reshape(y).astype(np.float64)
    np.testing.assert_array_equal(got, want)
    assert np.isnan(rows[:, :before]).all() and np.isnan(rows[:, before + y[3]:]).all()


@pytest.mark.parametrize("before,after,vec_out", [(16, 8, 1), (3, 5, 0)])
def test_gm_store_epilogue_reads_its_residual_at_the_dense_index(launcher, before, after, vec_out):
    y = LAYOUTS[0][0]
    rows, want = run_probe(launcher, *LAYOUTS[0], before, after, vec_out, epilogue=True)
    got = rows[:, before:before + y[3]].reshape(y).astype(np.float64)
    np.testing.assert_array_equal(got, want)
    assert np.isnan(rows[:, :before]).all() and np.isnan(rows[:, before + y[3]:]).all()

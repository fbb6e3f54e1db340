"""MaxPoolNHWC on float8_e4m3fn (pool.cu's POOL_E4M3: the bytes compared as order-preserving keys) emulated on
the host (block_emulation.py: every thread a real thread; CUDA's byte SIMD intrinsics modelled per byte) through
the tactic's real enqueue, Y poisoned first, against the cpu reference (channels_last_reference: numpy's maximum
over the window, the pads e4m3's least value): the 16-channel kernel (C % 16 == 0, aligned) and the byte kernel
(any C), over every e4m3 code (NaNs, both zeros, subnormals, +-448) in the inputs."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.base import DeviceTensor

FP8 = pytest.importorskip("ml_dtypes").float8_e4m3fn
GEOMETRY = ("i64 D, i64 H, i64 W, i64 OD, i64 OH, i64 OW, i64 KD, i64 KH, i64 KW, i64 SD, i64 SH, i64 SW, i64 PD, "
            "i64 PH, i64 PW, i64 ED, i64 EH, i64 EW, i64 DD, i64 DH, i64 DW, i64 count_include_pad, float p")
GEOMETRY_ARGS = "D, H, W, OD, OH, OW, KD, KH, KW, SD, SH, SW, PD, PH, PW, ED, EH, EW, DD, DH, DW, count_include_pad, p"
PARAMS = {"pool_window_nhwc_v16": (f"const ELEM* X, ELEM* Y, int NB, int C, {GEOMETRY}, i64 LDY, i64 LDX",
                                   f"X, Y, NB, C, {GEOMETRY_ARGS}, LDY, LDX"),
          "pool_window_nhwc_e4m3": (f"const u8* X, u8* Y, i64 NC, i64 C, {GEOMETRY}, i64 LDY, i64 LDX",
                                    f"X, Y, NC, C, {GEOMETRY_ARGS}, LDY, LDX")}


@pytest.fixture(scope="module")
def launchers(tmp_path_factory):
    from tests.kernels.cuda.block_emulation import host_launcher

    return {name: host_launcher(tmp_path_factory, *sig) for name, sig in PARAMS.items()}


class ByKernel:
    """A launcher that hands each kernel to the emulated launcher built for its parameter list."""

    stream, communicator, sm_count = None, None, 132

    def __init__(self, launchers):
        self.launchers, self.used = launchers, []

    def launch(self, kernel, grid, block, args, shared_mem=0):
        self.used.append(kernel.name)
        self.launchers[kernel.name].launch(kernel, grid, block, args, shared_mem)


def pool_layer(x_shape, y_shape, attrs):
    return LayerDesc("pool", "MaxPoolNHWC", ("X",), ("Y",), attrs, domain=POLYKIT_DOMAIN,
                     in_dtypes=("float8_e4m3fn",), out_dtypes=("float8_e4m3fn",), in_shapes=(x_shape,),
                     out_shapes=(y_shape,))


# (N, H, W, C), attrs, the kernel the enqueue picks
CASES = [((2, 9, 11, 32), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, "pool_window_nhwc_v16"),
         ((1, 7, 6, 16), {"kernel_shape": [2, 3], "strides": [1, 2], "pads": [1, 0, 1, 2]}, "pool_window_nhwc_v16"),
         ((2, 5, 8, 24), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [2, 2, 2, 2]}, "pool_window_nhwc_e4m3"),
         ((1, 6, 5, 3), {"kernel_shape": [3, 2], "strides": [1, 1], "dilations": [2, 1]}, "pool_window_nhwc_e4m3")]


@pytest.mark.parametrize("x_shape,attrs,kernel", CASES, ids=[c[2] + str(c[0]) for c in CASES])
def test_the_emulated_e4m3_pool_matches_the_reference(launchers, x_shape, attrs, kernel):
    from polykit.compiler.ops.nn.conv import window_geometry
    from polykit.kernels.tactics import find_tactic
    from polykit.runtime.cuda.harness import reference_layer

    n, h, w, c = x_shape
    rng = np.random.default_rng(sum(x_shape))
    codes = rng.integers(0, 256, x_shape, dtype=np.uint8)
    # every code where the input holds 256 (the NaNs 0x7f / 0xff, -0, +-448 and the subnormals first where not)
    special = np.array([0x7F, 0xFF, 0x80, 0x00, 0x7E, 0xFE, 0x01, 0x81], np.uint8)
    order = np.concatenate([special, rng.permutation(np.setdiff1d(np.arange(256, dtype=np.uint8), special))])
    flat = codes.reshape(-1)
    flat[:min(256, flat.size)] = order[:flat.size]
    x = codes.view(FP8)
    geo = window_geometry({k: v for k, v in attrs.items() if k != "pads"} | {"pads": attrs.get("pads", [0] * 4)},
                          (h, w), attrs["kernel_shape"])
    y_shape = (n, *geo.out, c)
    layer = pool_layer(x_shape, y_shape, attrs)
    tactic = find_tactic("cuda", "MaxPoolNHWC", "cuda.pool_nhwc.window")
    assert tactic.supports(layer)
    y = np.full(y_shape, 0x7e, np.uint8)  # poison: 448, which no window here yields alone
    launcher = ByKernel(launchers)
    tactic.enqueue(layer, launcher, {"X": DeviceTensor(x.ctypes.data, x.shape, x.dtype),
                                     "Y": DeviceTensor(y.ctypes.data, y.shape, np.dtype(FP8))})
    assert launcher.used == [kernel]
    want = reference_layer(layer, {"X": x})["Y"]
    got = y.view(FP8).astype(np.float32)
    want = np.asarray(want).astype(np.float32)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[~np.isnan(got)], want[~np.isnan(want)])  # -0 and +0 compare equal

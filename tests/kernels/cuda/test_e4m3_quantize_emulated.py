"""e4m3_quantize.cuh (the fused output stages' QuantizeLinear to float8_e4m3fn), run on the host.

The header's own code (and quotient.cuh's, which it shares with int8_out.cuh) is compiled by g++ with the block
emulation's stand-ins (block_emulation.PRELUDE, warp_emulation's IEEE intrinsics; the clamp is quotient.cuh's
clamp_nan in its host form, which models max.NaN / min.NaN) and run over dense
sets of values for scales across the division-free range and outside it: two values a call (`pair`, each value
once as the first and once as the second of a pair) give, byte for byte, what the stages computed before it, lowp.cuh's saturating encode of the IEEE
quotient (`encode(__fdiv_rn(v, ys), true)`, compiled beside it), and QuantizeLinear's reference. Off the device
the header converts by the software encode (E4M3_CVT 0); the hardware conversion it takes on sm_89+ is held to the
same bytes by the gpu tests of test_output_quantize.py. A NaN gives a NaN byte: clamp_nan's host form returns the
canonical (positive) NaN as the PTX instruction does, where the host's division keeps a NaN's sign, so a
negative NaN's byte may differ in its sign bit between the two here (0x7f / 0xff).
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess

import ml_dtypes
import numpy as np
import pytest

from polykit.compiler.ir.graph import Node
from polykit.compiler.ops.references import run_reference
from polykit.kernels.cuda.base import KernelSource
from tests.kernels.cuda.block_emulation import CXX_FLAGS, PRELUDE
from tests.kernels.cuda.test_int8_out_emulated import y_scales
from tests.kernels.cuda.test_lowp_emulated import HALF
from tests.kernels.cuda.warp_emulation import WARP_PRELUDE, translate_asm

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)

HARNESS = r"""
#include "e4m3_quantize.cuh"
// now: the header's bytes, a pair at a time (n even); was: the encode of the IEEE quotient
extern "C" void quantize_all(const float* v, long n, float ys, unsigned char* now, unsigned char* was) {
  const E4m3Quantizer q = e4m3_quantizer(ys);
  for (long i = 0; i + 1 < n; i += 2) {
    const unsigned short b = q.pair(v[i], v[i + 1]);
    now[i] = (unsigned char)b;
    now[i + 1] = (unsigned char)(b >> 8);
  }
  for (long i = 0; i < n; ++i) was[i] = LowpFmt<f8e4m3fn_t>::F::encode(__fdiv_rn(v[i], ys), true);
}
extern "C" int rcp_ok(float ys) { return e4m3_quantizer(ys).rcp_ok; }
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    text = KernelSource("e4m3_quantize", code=HARNESS).render()  # the header and what it includes, inlined
    for name, repl in HALF.items():
        text = re.sub(r"__device__ __forceinline__ \w+ " + name + r"\(.*?\n\}", repl, text, count=1, flags=re.S)
    folder = tmp_path_factory.mktemp("e4m3_quantize")
    src, so = folder / "e4m3_quantize.cpp", folder / "e4m3_quantize.so"
    src.write_text(PRELUDE + WARP_PRELUDE + translate_asm(text))
    subprocess.run([cxx, *CXX_FLAGS, "-shared", "-o", str(so), str(src)], check=True)
    out = ctypes.CDLL(str(so))
    out.quantize_all.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_float] + [ctypes.c_void_p] * 2
    out.rcp_ok.argtypes = [ctypes.c_float]
    return out


def e4m3_values() -> np.ndarray:
    """Every finite e4m3 magnitude and the midpoints between neighbours (the rounding ties), up to the
    saturation threshold 464 and past it, with both signs."""
    codes = np.arange(0x7F, dtype=np.uint8).view(E4M3).astype(np.float64)  # 0 .. 448
    mids = (codes[1:] + codes[:-1]) / 2
    mags = np.concatenate([codes, mids, [464.0, 480.0, 512.0, 1024.0, 1e6]])
    return np.concatenate([mags, -mags])


def values(ys: np.float32) -> np.ndarray:
    """v with v / ys on and next to (a few float32 ulps either side) every e4m3 value and rounding midpoint,
    uniform ones over many binades, the edges (signed zeros, the smallest subnormals, the largest float,
    +-inf, NaNs of both signs); an even count, so each value is also the first and second of a pair."""
    targets = (e4m3_values() * np.float64(ys)).astype(np.float32)
    around = [targets]
    up, down = targets.copy(), targets.copy()
    for _ in range(3):
        up, down = np.nextafter(up, np.float32(np.inf)), np.nextafter(down, np.float32(-np.inf))
        around += [up, down]
    rng = np.random.default_rng(int(np.float32(ys).view(np.uint32)))
    with np.errstate(over="ignore"):  # past float32's range: +-inf
        wide = (rng.standard_normal(4000) * 2.0 ** rng.integers(-140, 128, 4000)).astype(np.float32)
    edges = np.array([0.0, -0.0, 1e-45, -1e-45, 1.2e-38, np.finfo(np.float32).max, -np.finfo(np.float32).max,
                      np.inf, -np.inf], np.float32)
    nans = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFFFFFFF], np.uint32).view(np.float32)
    v = np.concatenate(around + [wide, edges, nans]).astype(np.float32)
    return np.concatenate([v, v[1:], v[:1]])  # each value once at an even and once at an odd position


def run(lib, v: np.ndarray, ys: np.float32):
    now, was = np.zeros(len(v), np.uint8), np.zeros(len(v), np.uint8)
    lib.quantize_all(v.ctypes.data, len(v), ys, now.ctypes.data, was.ctypes.data)
    return now, was


def reference(v: np.ndarray, ys: np.float32) -> np.ndarray:
    node = Node("QuantizeLinear", ["y", "s", "z"], ["q"])
    with np.errstate(all="ignore"):
        return run_reference(node, [v, np.array(ys, np.float32), np.zeros((), E4M3)])[0].view(np.uint8)


@pytest.mark.parametrize("ys", y_scales(), ids=lambda s: f"{float(s):.3g}")
def test_pairs_give_the_bytes_of_the_ieee_quotient_s_encode(lib, ys):
    v = values(ys)
    now, was = run(lib, v, ys)
    nan = np.isnan(v)
    np.testing.assert_array_equal(now[~nan], was[~nan])
    assert np.all((now[nan] & 0x7F) == 0x7F)  # NaN bytes
    # and QuantizeLinear's reference (numpy's float32 division, ml_dtypes' encode after the saturation)
    np.testing.assert_array_equal(was[~nan], reference(v, ys)[~nan])


def test_the_header_divides_outside_the_range_and_not_inside(lib):
    assert lib.rcp_ok(np.float32(2.0 ** -90)) and lib.rcp_ok(np.float32(2.0 ** 90)) and lib.rcp_ok(np.float32(0.006))
    assert not lib.rcp_ok(np.float32(2.0 ** -91)) and not lib.rcp_ok(np.float32(2.0 ** 91))
    assert not lib.rcp_ok(np.float32(0.0)) and not lib.rcp_ok(np.float32(-1.0)) and not lib.rcp_ok(np.float32(np.nan))


def test_a_division_free_pair_saturates_infinities_and_keeps_the_sign_of_zeros(lib):
    v = np.array([np.inf, -np.inf, 0.0, -0.0, 1e30, -1e30, 1e-30, -1e-30], np.float32)
    now, _ = run(lib, v, np.float32(0.006))
    assert now.tolist() == [0x7E, 0xFE, 0x00, 0x80, 0x7E, 0xFE, 0x00, 0x80]

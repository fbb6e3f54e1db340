"""int8_out.cuh's requantization, emulated on the host: the division-free quotient and requantize.

The header's own code is compiled by g++ (test_lowp_emulated's prelude and IEEE stand-ins; __fmaf_rn is
C's fmaf, correctly rounded; no contraction) and run over millions of values: quotient (Markstein's
refinement by 1 / y_scale) must give the IEEE quotient bit for bit wherever requantize and the FP8
store use it, and requantize QuantizeLinear's reference bytes (round half to even, the zero point,
saturation, NaN -> 0), for y_scales inside the quotient's range and outside it (the division). The GPU
tests (test_int8_sm90.py, test_int8.py, test_fp8_sm90.py) run the same code in the kernels.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from types import SimpleNamespace

import numpy as np
import pytest

from polykit.compiler.ops.quant.quantize_reference import quantize_linear
from polykit.kernels.cuda.base import CUDA_DIR
from tests.kernels.cuda.test_lowp_emulated import HALF, PRELUDE

#: the float intrinsics int8_out.cuh calls, as the IEEE operations they are
INTRINSICS = r"""
#include <algorithm>
using std::min; using std::max;
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __int2float_rn(int a) { return (float)a; }
// cvt.rni.s32.f32 as PTX defines it: half to even, saturated to int32, NaN -> 0 (Y_ZERO 0's rounding relies on it)
inline int __float2int_rn(float a) {
  return a != a ? 0 : a >= 0x1p31f ? 2147483647 : a <= -0x1p31f ? (-2147483647 - 1) : (int)nearbyintf(a);
}
inline int __float_as_int(float f) { int u; memcpy(&u, &f, 4); return u; }
struct uint2 { unsigned x, y; };
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
struct float2 { float x, y; };
inline float2 make_float2(float x, float y) { return {x, y}; }
// PRMT: byte i of the result is byte (s >> 4 i) & 7 of y:x (the selectors int8_out.cuh uses have no sign bit)
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const unsigned long long v = (unsigned long long)y << 32 | x;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= (unsigned)(v >> 8 * ((s >> 4 * i) & 7) & 0xff) << 8 * i;
  return r;
}
// a quad of lanes run one after another: exchange c of lane L returns what lane L ^ mask sent at exchange c
// on the previous run (transpose_all reruns the quad until every exchange has seen its partner's word)
static unsigned quad_sent[4][4], quad_prev[4][4];
static int quad_lane, quad_call;
inline unsigned quad_xor(unsigned x, int mask) {
  quad_sent[quad_call][quad_lane] = x;
  return quad_prev[quad_call++][quad_lane ^ mask];
}
"""

HARNESS = r"""
static Out make(float ys, unsigned char yz, int flags) {
  static float one = 1.f;
  return int8_out(&one, nullptr, &ys, &yz, nullptr, flags, 0, 0);
}
extern "C" void requantize_all(const float* v, long n, float ys, unsigned char yz, int flags, int* out) {
  const Out o = make(ys, yz, flags);
  for (long i = 0; i < n; ++i) out[i] = o.requantize(v[i]);
}
extern "C" void quotient_all(const float* v, long n, float ys, float* out) {
  const Out o = make(ys, 0, FLAG_Y_INT);
#if F8
  for (long i = 0; i < n; ++i) out[i] = o.f8_quotient(v[i]);
#else
  for (long i = 0; i < n; ++i) out[i] = o.quotient(v[i]);
#endif
}
// the 16-byte path's store (n a multiple of 8, out 8-byte aligned): store8 of 8 values at a time
extern "C" void store8_all(const float* v, long n, float ys, unsigned char yz, int flags, unsigned char* out) {
  Out o = make(ys, yz, flags);
  o.Y = out;
  float w[8];
  for (long i = 0; i < n; i += 8) {
    for (int j = 0; j < 8; ++j) w[j] = v[i + j];
    o.store8(i, w);
  }
}
extern "C" int rcp_ok(float ys) { return make(ys, 0, FLAG_Y_INT).rcp_ok; }
// transpose_pairs over one quad: w[2 lane], w[2 lane + 1] are lane's two words, in and out
extern "C" void transpose_all(unsigned* w) {
  unsigned in[8];
  memcpy(in, w, sizeof in);
  memset(quad_prev, 0, sizeof quad_prev);
  for (int run = 0; run < 3; ++run) {
    for (int lane = 0; lane < 4; ++lane) {
      quad_lane = lane;
      quad_call = 0;
      u32 a = in[2 * lane], b = in[2 * lane + 1];
      transpose_pairs(a, b, quad_pairs(lane));
      w[2 * lane] = a;
      w[2 * lane + 1] = b;
    }
    memcpy(quad_prev, quad_sent, sizeof quad_sent);
  }
}
// channel_pairs of lane's column pair for the group at n with `left` columns: s, b (16 floats) as read
// (poisoned first: the blocks past left stay as they were)
extern "C" void channel_pairs_all(const float* scale, const float* bias, int steps, long n, int lane, int left,
                                  float* sb) {
  Out o = make(1.f, 0, 0);
  o.scale = scale; o.bias = bias; o.scale_step = steps & 1; o.bias_step = bias ? steps >> 1 : 2;
  float s[8], b[8];
  for (int i = 0; i < 8; ++i) s[i] = b[i] = -7.f;
  o.channel_pairs(n, 2 * lane, left, s, b);
  for (int i = 0; i < 8; ++i) sb[i] = s[i], sb[8 + i] = b[i];
}
#if !F8
// a row of lane's 8 accumulators (its pairs of the 4 blocks of the group at n, `left` columns) to bytes two
// blocks at a time as gemm_sm90_epilogue.cuh's finish_halves (channel_pairs and dequantize8 of 4 values,
// bytes4: words[0], words[1]) and the whole group at once as finish_native (8 values, bytes8: words[2], [3])
extern "C" void halves_all(const int* acc, const float* scale, const float* bias, int steps, long n, int lane,
                           int left, float ys, unsigned char yz, int flags, int small, unsigned* words) {
  Out o = make(ys, yz, flags);
  o.scale = scale; o.bias = bias; o.scale_step = steps & 1; o.bias_step = bias ? steps >> 1 : 2;
  o.small_sums = small;
  for (int h = 0; h < 2; ++h) {
    float s[4], b[4], v[4];
    const int w4[4] = {acc[4 * h], acc[4 * h + 1], acc[4 * h + 2], acc[4 * h + 3]};
    for (int i = 0; i < 4; ++i) s[i] = b[i] = -7.f;
    o.channel_pairs(n + 16 * h, 2 * lane, left - 16 * h, s, b);
    o.dequantize8(w4, s, b, v);
    words[h] = o.bytes4(v);
  }
  float s[8], b[8], v[8];
  int w[8];
  for (int i = 0; i < 8; ++i) s[i] = b[i] = -7.f, w[i] = acc[i];
  o.channel_pairs(n, 2 * lane, left, s, b);
  o.dequantize8(w, s, b, v);
  const uint2 x = o.bytes8(v);
  words[2] = x.x;
  words[3] = x.y;
}
#endif
"""

FLAG_Y_INT, FLAG_Y_U8 = 4, 8
rng = np.random.default_rng(11)


def host_code(f8: bool, y_zero0: bool = False) -> str:
    dtypes = (CUDA_DIR / "dtypes.cuh").read_text()
    for name, repl in HALF.items():
        dtypes = re.sub(r"__device__ __forceinline__ \w+ " + name + r"\(.*?\n\}", repl, dtypes, count=1, flags=re.S)
    # int8_out.cuh with the quotient's header (quotient.cuh: clamp_nan, markstein_quotient, e4m3x2_cvt) inlined
    out = (CUDA_DIR / "int8_out.cuh").read_text().replace('#include "dtypes.cuh"', "")
    out = out.replace('#include "quotient.cuh"', (CUDA_DIR / "quotient.cuh").read_text())
    # the e4m3 conversion's PTX (not what these tests check) -> a stand-in that compiles
    out = re.sub(r'asm\("cvt\.rn\.satfinite\.e4m3x2\.f32.*?\);', "d = 0;", out, flags=re.S)
    # (clamp_nan's PTX sits under __CUDA_ARCH__, its C form is what g++ compiles)
    y_zero = "#define Y_ZERO 0\n" if y_zero0 else ""
    return (PRELUDE + INTRINSICS + dtypes + f"#define HAS_EPILOGUE 0\n#define F8 {int(f8)}\n" + y_zero + out + HARNESS)


@pytest.fixture(scope="module", params=[(False, False), (True, False), (False, True)], ids=["int8", "fp8", "int8_y_zero0"])
def lib(request, tmp_path_factory):
    """The header compiled for INT8, FP8, and INT8 with Y_ZERO 0 (an output zero point that is a constant 0: the
    rounding by conversion)."""
    f8, y_zero0 = request.param
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    folder = tmp_path_factory.mktemp("int8_out")
    src, so = folder / "int8_out.cpp", folder / "int8_out.so"
    src.write_text(host_code(f8, y_zero0))
    subprocess.run([cxx, "-std=c++17", "-O1", "-w", "-ffp-contract=off", "-fPIC", "-shared", "-o", str(so), str(src)],
                   check=True)
    out = ctypes.CDLL(str(so))
    out.requantize_all.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_float, ctypes.c_ubyte, ctypes.c_int,
                                   ctypes.c_void_p]
    out.quotient_all.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_float, ctypes.c_void_p]
    out.store8_all.argtypes = out.requantize_all.argtypes
    out.rcp_ok.argtypes = [ctypes.c_float]
    out.transpose_all.argtypes = [ctypes.c_void_p]
    out.channel_pairs_all.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_int,
                                      ctypes.c_int, ctypes.c_void_p]
    if not f8:
        out.halves_all.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_long,
                                   ctypes.c_int, ctypes.c_int, ctypes.c_float, ctypes.c_ubyte, ctypes.c_int,
                                   ctypes.c_int, ctypes.c_void_p]
    out.f8, out.y_zero0 = f8, y_zero0
    return out


def y_scales() -> np.ndarray:
    """Scales over the quotient's whole range [2^-90, 2^90] and just outside it: powers of two, mantissas
    of all ones, the tests' 0.037, thirds, and random ones."""
    exps = np.arange(-92, 93, 7)
    special = np.float32([0.037, 1 / 3, 0.1, 2.0 ** -90, 2.0 ** 90, 2.0 ** -91, 2.0 ** 91, 1.0])
    all_ones = np.float32(np.nextafter(np.float32(2), np.float32(0))) * np.float32(2.0) ** exps.astype(np.float32)
    rand = (rng.uniform(1, 2, len(exps)) * 2.0 ** exps).astype(np.float32)
    return np.concatenate([special, all_ones, rand]).astype(np.float32)


def values(ys: np.float32, bound: float) -> np.ndarray:
    """v with v / ys on and next to every half-integer and integer up to `bound` (a few ulps of v either
    side), uniform ones, and the edges: tiny, huge, infinities, NaN."""
    halves = (np.arange(-2 * bound, 2 * bound + 1) / 2).astype(np.float64)
    centre = (halves * np.float64(ys)).astype(np.float32)
    near = [centre]
    for step in (1, 2, 3):
        up, down = centre.copy(), centre.copy()
        for _ in range(step):
            up, down = np.nextafter(up, np.float32(np.inf)), np.nextafter(down, np.float32(-np.inf))
        near += [up, down]
    uniform = (rng.uniform(-1.1 * bound, 1.1 * bound, 20000) * np.float64(ys)).astype(np.float32)
    edges = np.float32([0, -0.0, 1e-38, -1e-38, 1e-45, 3e38, -3e38, np.inf, -np.inf, np.nan])
    with np.errstate(over="ignore"):
        ends = np.float32([bound, -bound]) * ys
    return np.concatenate(near + [uniform, edges, ends])


def test_the_quotient_is_the_ieee_quotient_bit_for_bit(lib):
    """Every y_scale of the range, v / y_scale up to the clamp (1024; FP8: 512) and past it: quotient
    (INT8) equals np.float32(v) / ys exactly from 2^-11 up (below, within 2^-59); FP8's f8_quotient too,
    a NaN kept, past 512 clamped."""
    bound = 512 if lib.f8 else 1024
    checked = 0
    for ys in y_scales():
        if not lib.rcp_ok(ys):
            continue
        v = values(ys, bound + 8)
        got = np.empty_like(v)
        lib.quotient_all(v.ctypes.data, v.size, ys, got.ctypes.data)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            want = v / ys
        inside = np.abs(want) <= bound if lib.f8 else np.abs(v) <= np.float32(bound) * ys
        tiny = np.abs(want) < 2.0 ** -11  # may underflow: within 2^-59, no rounding that close to 0
        assert (inside & ~tiny).sum() > 1000
        bad = np.flatnonzero(inside & ~tiny & (got.view(np.int32) != want.view(np.int32)))
        assert bad.size == 0, f"ys {ys!r}: v {v[bad[:3]]} -> {got[bad[:3]]}, IEEE {want[bad[:3]]}"
        off = np.abs(got[tiny].astype(np.float64) - want[tiny])
        assert np.all(off <= 2.0 ** -59), f"ys {ys!r}: a tiny quotient off by {off.max()}"
        if lib.f8:  # clamped to +-512 past it (e4m3 saturates at 448 either way), NaN kept
            past = ~inside & ~np.isnan(v)
            assert np.all(np.abs(got[past]) >= 448) and np.all(np.sign(got[past]) == np.sign(want[past]))
            assert np.isnan(got[np.isnan(v)]).all()
        checked += inside.sum()
    assert checked > 1_000_000


@pytest.mark.parametrize("y_dtype,zero_point", [(np.int8, 0), (np.int8, -3), (np.uint8, 0), (np.uint8, 128), (np.uint8, 255)])
def test_requantize_gives_quantize_linears_bytes(lib, y_dtype, zero_point):
    """saturate(rint(v / ys) + zero point), NaN -> 0, over ties, near-ties, saturation and the edges,
    for y_scales inside the quotient's range and outside it (2^-91, 2^91: the IEEE division)."""
    if lib.f8:
        pytest.skip("the FP8 output rounds in the e4m3 conversion (PTX): test_fp8_sm90.py")
    if lib.y_zero0 and zero_point:
        pytest.skip("Y_ZERO 0 is compiled for a zero point of 0 only")
    flags = FLAG_Y_INT | (FLAG_Y_U8 if y_dtype == np.uint8 else 0)
    zp = np.array(zero_point, y_dtype)
    outside = 0
    for ys in y_scales():
        outside += not lib.rcp_ok(ys)
        v = values(ys, 300)
        got = np.empty(v.size, np.int32)
        lib.requantize_all(v.ctypes.data, v.size, ys, ctypes.c_ubyte(int(zp.view(np.uint8))), flags, got.ctypes.data)
        want = quantize_linear(SimpleNamespace(attrs={}), [v, np.float32(ys), zp])[0].astype(np.int32)
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, f"ys {ys!r}: v {v[bad[:3]]} -> {got[bad[:3]]}, reference {want[bad[:3]]}"
    assert outside >= 4, "no y_scale took the division"


@pytest.mark.parametrize("y_dtype,zero_point", [(np.int8, 0), (np.uint8, 0), (np.uint8, 3)])
def test_the_8_value_store_writes_quantize_linears_bytes(lib, y_dtype, zero_point):
    """store8 (the sm90 kernel's 16-byte path: requantize_rcp for 8 channels, one 8-byte store; vec_ok
    keeps it to y_scales in the quotient's range) writes the reference's bytes."""
    if lib.f8:
        pytest.skip("the FP8 store converts by PTX (cvt e4m3x2): test_fp8_sm90.py")
    if lib.y_zero0 and zero_point:
        pytest.skip("Y_ZERO 0 is compiled for a zero point of 0 only")
    flags = FLAG_Y_INT | (FLAG_Y_U8 if y_dtype == np.uint8 else 0)
    zp = np.array(zero_point, y_dtype)
    for ys in y_scales():
        if not lib.rcp_ok(ys):
            continue
        v = values(ys, 300)
        v = np.concatenate([v, np.zeros(-v.size % 8, np.float32)])
        got = np.zeros(v.size, np.uint8)
        lib.store8_all(v.ctypes.data, v.size, ys, ctypes.c_ubyte(int(zp.view(np.uint8))), flags, got.ctypes.data)
        want = quantize_linear(SimpleNamespace(attrs={}), [v, np.float32(ys), zp])[0]
        bad = np.flatnonzero(got.view(y_dtype) != want)
        assert bad.size == 0, f"ys {ys!r}: v {v[bad[:3]]} -> {got.view(y_dtype)[bad[:3]]}, reference {want[bad[:3]]}"


def test_the_quad_pair_transpose_moves_each_lanes_pairs_to_their_blocks(lib):
    """transpose_pairs (the sm90 INT8 epilogue in the accumulators' layout): lane q's 16-bit pair j (the
    output bytes of columns 8 j + 2 q, + 1) ends as lane j's pair q, so lane j holds block j's 8 bytes in
    column order; applied twice, every word is back (the residual's transpose is the same one)."""
    for _ in range(200):
        words = rng.integers(0, 2 ** 32, 8, dtype=np.uint64).astype(np.uint32)
        got = words.copy()
        lib.transpose_all(got.ctypes.data)
        pairs = words.view(np.uint16).reshape(4, 4)  # [lane, pair j]
        assert np.array_equal(got.view(np.uint16).reshape(4, 4), pairs.T)
        # the bytes: lane q's native bytes 2 j, 2 j + 1 are columns 8 j + 2 q, + 1; lane j's are block j's
        native = words.view(np.uint8).reshape(4, 4, 2)  # [q, j, e] = column 8 j + 2 q + e
        columns = np.transpose(native, (1, 0, 2)).reshape(32)  # by column
        assert np.array_equal(got.view(np.uint8), columns)
        lib.transpose_all(got.ctypes.data)
        assert np.array_equal(got, words)


@pytest.mark.parametrize("steps", [3, 1, 0], ids=["per_channel", "per_channel_scale_no_bias", "per_tensor"])
def test_the_channel_pairs_are_the_lanes_columns(lib, steps):
    """channel_pairs: lane q's scale / bias of columns n + 8 j + 2 q, + 1 (j = 0..3) with 8-byte loads, only
    the blocks of the `left` columns (a group at the end of a row of N % 32 != 0), per channel or per tensor,
    with a bias or none."""
    if lib.f8:
        pytest.skip("the same code for FP8 (the INT8 layout only uses it)")
    n_all = 200
    scale = rng.standard_normal(n_all).astype(np.float32)
    bias = rng.standard_normal(n_all).astype(np.float32) if steps != 1 else None
    for n in (0, 32, 168):
        for left in (32, 24, 8, 40):
            for q in range(4):
                sb = np.empty(16, np.float32)
                lib.channel_pairs_all(scale.ctypes.data, None if bias is None else bias.ctypes.data, steps, n, q,
                                      left, sb.ctypes.data)
                for j in range(4):
                    got_s, got_b = sb[2 * j:2 * j + 2], sb[8 + 2 * j:8 + 2 * j + 2]
                    if 8 * j >= left:
                        assert np.all(got_s == -7) and np.all(got_b == -7), "a block past N was read"
                        continue
                    cols = n + 8 * j + 2 * q + np.arange(2)
                    want_s = scale[cols] if steps & 1 else np.repeat(scale[0], 2)
                    assert np.array_equal(got_s, want_s)
                    if bias is not None:
                        assert np.array_equal(got_b, bias[cols] if steps >> 1 else np.repeat(bias[0], 2))


@pytest.mark.parametrize("y_dtype,zero_point", [(np.int8, 0), (np.int8, -5), (np.uint8, 0), (np.uint8, 3)])
@pytest.mark.parametrize("steps", [3, 1, 0], ids=["per_channel", "per_channel_scale_no_bias", "per_tensor"])
def test_a_rows_blocks_two_at_a_time_give_the_groups_bytes(lib, steps, y_dtype, zero_point):
    """finish_halves (the native int8 / uint8-out 64x128x2 kernel without a residual): a lane's row of a
    group requantized two blocks at a time (channel_pairs and dequantize8 of 4 values, bytes4) gives the
    bytes of the whole group at once (bytes8, finish_native's) and QuantizeLinear's of fl(fl(acc * s) + b),
    for groups cut short by N (left 8, 24, 40) and sums below 2^22 (small_sums) or past it."""
    if lib.f8:
        pytest.skip("INT8 only (bytes8 / bytes4 are not compiled for FP8)")
    if lib.y_zero0 and zero_point:
        pytest.skip("Y_ZERO 0 is compiled for a zero point of 0 only")
    flags = FLAG_Y_INT | (FLAG_Y_U8 if y_dtype == np.uint8 else 0)
    zp = np.array(zero_point, y_dtype)
    n_all = 200
    scale = (rng.uniform(0.5, 2, n_all) * 2.0 ** -12).astype(np.float32)
    bias = rng.uniform(-40, 40, n_all).astype(np.float32) if steps != 1 else None
    ys = np.float32(0.037)
    checked = 0
    for small in (1, 0):
        bound = 2 ** 21 if small else 2 ** 26
        for n in (0, 32, 168):
            for left in (32, 24, 8, 40):
                for q in range(4):
                    acc = rng.integers(-bound, bound, 8).astype(np.int32)
                    acc[:2] = rng.integers(-300, 300, 2)  # near the small values' rounding ties
                    words = np.zeros(4, np.uint32)
                    lib.halves_all(acc.ctypes.data, scale.ctypes.data, None if bias is None else bias.ctypes.data,
                                   steps, n, q, left, ys, ctypes.c_ubyte(int(zp.view(np.uint8))), flags, small,
                                   words.ctypes.data)
                    assert np.array_equal(words[:2], words[2:]), f"n {n} left {left} lane {q}: {words}"
                    got = words[:2].view(y_dtype)  # bytes: block j's columns 2 q, 2 q + 1 at 2 j, 2 j + 1
                    for j in range(4):
                        if 8 * j >= min(left, 32):
                            continue
                        cols = n + 8 * j + 2 * q + np.arange(2)
                        s = scale[cols] if steps & 1 else np.repeat(scale[0], 2)
                        v = acc[2 * j:2 * j + 2].astype(np.float32) * s
                        if bias is not None:
                            v = v + (bias[cols] if steps >> 1 else np.repeat(bias[0], 2))
                        want = quantize_linear(SimpleNamespace(attrs={}), [v.astype(np.float32), ys, zp])[0]
                        assert np.array_equal(got[2 * j:2 * j + 2], want), f"n {n} left {left} lane {q} block {j}"
                        checked += 2
    assert checked > 500

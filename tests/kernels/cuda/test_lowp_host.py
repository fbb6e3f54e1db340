"""lowp.cuh itself, compiled as host C++ (g++, no GPU): its encode / decode functions give the
reference Cast's bytes on a dense set of floats (4/2-bit integers: the bytes of polykit's float ->
integer rule, reference cast.py) and ml_dtypes' values on every code.

A shim stands in for dtypes.cuh (the real one holds PTX asm); lowp.cuh's code is used unchanged.
"""

from __future__ import annotations

import shutil
import subprocess

import ml_dtypes
import numpy as np
import pytest

from polykit.kernels.cuda.base import CUDA_DIR
from polykit.compiler.ops.tensor.cast_reference import convert
from tests.kernels.cuda.test_lowp import DENSE, E8M0, FLOAT_TYPES, INT_TYPES, rule_codes, same_bits

SHIM = r"""
#pragma once
#include <cstring>
#define __device__
#define __forceinline__ inline
typedef signed char i8; typedef unsigned char u8; typedef short i16; typedef unsigned short u16;
typedef int i32; typedef unsigned int u32; typedef long long i64; typedef unsigned long long u64;
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
template <class T> struct Compute { typedef T type; };
template <class T> inline typename Compute<T>::type ld(const T* p, i64 i) { return p[i]; }
template <class To, class From> struct Cvt { static To run(From x) { return (To)x; } };
template <class To, class From> inline To cvt(From x) { return Cvt<To, From>::run(x); }
template <class T, class V> inline void st(T* p, i64 i, V v) { p[i] = cvt<T>(v); }
"""

# stdin: float32 values; stdout: encodes (5 float types, sat 1 then 0, each followed by e8m0 in
# round modes up/down/nearest), intn_bits of the floats for int4, uint4, int2, uint2, then of
# them as double for the same four types, then the decode of all 256 codes of each float type (float32 bits) and of the 4 integer types (i32)
MAIN = r"""
#include "lowp.cuh"
#include <cstdio>
#include <vector>
template <class T> void enc(const std::vector<float>& x, bool sat, std::vector<u8>& out) {
  for (float f : x) out.push_back(LowpFmt<T>::F::encode(f, sat));
}
template <class T> void dec(std::vector<u8>& out) {
  for (unsigned c = 0; c < 256; ++c) {
    T t; t.x = (u8)c; float f = ld(&t, 0); u8 b[4]; std::memcpy(b, &f, 4); out.insert(out.end(), b, b + 4);
  }
}
int main() {
  std::vector<float> x; float f;
  while (fread(&f, 4, 1, stdin) == 1) x.push_back(f);
  std::vector<u8> out;
  for (int sat = 1; sat >= 0; --sat) {
    enc<f8e4m3fn_t>(x, sat, out); enc<f8e4m3fnuz_t>(x, sat, out); enc<f8e5m2_t>(x, sat, out);
    enc<f8e5m2fnuz_t>(x, sat, out); enc<f4e2m1_t>(x, sat, out);
    for (int mode = 0; mode < 3; ++mode) for (float v : x) out.push_back(e8m0_encode(v, sat, mode));
  }
  for (float v : x) out.push_back(intn_bits<4, true>(v));
  for (float v : x) out.push_back(intn_bits<4, false>(v));
  for (float v : x) out.push_back(intn_bits<2, true>(v));
  for (float v : x) out.push_back(intn_bits<2, false>(v));
  for (float v : x) out.push_back(intn_bits<4, true>((double)v));
  for (float v : x) out.push_back(intn_bits<4, false>((double)v));
  for (float v : x) out.push_back(intn_bits<2, true>((double)v));
  for (float v : x) out.push_back(intn_bits<2, false>((double)v));
  dec<f8e4m3fn_t>(out); dec<f8e4m3fnuz_t>(out); dec<f8e5m2_t>(out); dec<f8e5m2fnuz_t>(out);
  dec<f4e2m1_t>(out); dec<f8e8m0_t>(out);
  for (unsigned c = 0; c < 256; ++c) {
    i4_t a{(u8)c}; u4_t b{(u8)c}; i2_t d{(u8)c}; u2_t e{(u8)c};
    i32 v[4] = {ld(&a, 0), ld(&b, 0), ld(&d, 0), ld(&e, 0)}; u8 bb[16]; std::memcpy(bb, v, 16);
    out.insert(out.end(), bb, bb + 16);
  }
  fwrite(out.data(), 1, out.size(), stdout);
}
"""


@pytest.fixture(scope="module")
def host_results(tmp_path_factory):
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    d = tmp_path_factory.mktemp("lowp_host")
    shutil.copy(CUDA_DIR / "lowp.cuh", d / "lowp.cuh")
    (d / "dtypes.cuh").write_text(SHIM)
    (d / "main.cpp").write_text(MAIN)
    subprocess.run([cxx, "-std=c++17", "-O1", "-w", "-o", str(d / "lowp_host"), str(d / "main.cpp")], check=True)
    raw = subprocess.run([str(d / "lowp_host")], input=DENSE.tobytes(), capture_output=True, check=True).stdout
    raw, n, out = np.frombuffer(raw, np.uint8), len(DENSE), {}
    off = 0

    def take(k):
        nonlocal off
        off += k
        return raw[off - k:off]

    for sat in (True, False):
        for name in FLOAT_TYPES:
            out[name, sat] = take(n)
        for mode in ("up", "down", "nearest"):
            out["e8m0", mode, sat] = take(n)
    for source in ("float", "double"):
        for name, _, _ in INT_TYPES:
            out[name, source] = take(n)
    for name in FLOAT_TYPES + ["float8_e8m0fnu"]:
        out["decode", name] = take(1024).view(np.float32)
    out["decode_ints"] = take(256 * 16).view(np.int32).reshape(256, 4)
    assert off == len(raw)
    return out


@pytest.mark.parametrize("saturate", [True, False])
@pytest.mark.parametrize("name", FLOAT_TYPES)
def test_header_encode_gives_reference_cast_bytes(host_results, name, saturate):
    with np.errstate(all="ignore"):
        want = convert(DENSE, np.dtype(getattr(ml_dtypes, name)), saturate=saturate).view(np.uint8)
    np.testing.assert_array_equal(host_results[name, saturate], want)


@pytest.mark.parametrize("saturate", [True, False])
@pytest.mark.parametrize("mode", ["up", "down", "nearest"])
def test_header_e8m0_encode_gives_reference_cast_bytes(host_results, mode, saturate):
    np.testing.assert_array_equal(host_results["e8m0", mode, saturate], convert(DENSE, E8M0, saturate, mode).view(np.uint8))


@pytest.mark.parametrize("source", ["float", "double"])
@pytest.mark.parametrize("name,nbits,signed", INT_TYPES)
def test_header_int_encode_follows_polykits_float_to_integer_rule(host_results, name, nbits, signed, source):
    """NaN -> 0, truncated, saturated (Inf included): every byte, not only where ONNX defines it."""
    np.testing.assert_array_equal(host_results[name, source], rule_codes(DENSE, nbits, signed))


@pytest.mark.parametrize("name", FLOAT_TYPES + ["float8_e8m0fnu"])
def test_header_decode_matches_ml_dtypes_on_every_code(host_results, name):
    codes = np.arange(256, dtype=np.uint8)
    codes = codes & 0xF if name == "float4_e2m1fn" else codes
    assert same_bits(host_results["decode", name], codes.view(getattr(ml_dtypes, name)).astype(np.float32))


def test_header_int_decode_matches_ml_dtypes_on_every_code(host_results):
    codes = np.arange(256, dtype=np.uint8)
    for k, name in enumerate(("int4", "uint4", "int2", "uint2")):
        np.testing.assert_array_equal(host_results["decode_ints"][:, k], codes.view(getattr(ml_dtypes, name)).astype(np.int32))

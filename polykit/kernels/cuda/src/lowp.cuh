// Low-precision storage types: float8 (e4m3fn, e4m3fnuz, e5m2, e5m2fnuz, e8m0fnu), float4_e2m1fn,
// int4/uint4, int2/uint2 -- one byte per element holding exactly the byte of ml_dtypes' numpy
// array (float4/int4/int2: the low bits; decode ignores the rest).
//
// Floats load as float (compute type) and store with encode(): round to nearest even, the
// NaN / Inf / overflow rules of each type as ml_dtypes' astype (saturate = clip to the finite
// range first, ONNX Cast-19). The 4/2-bit integers load as i32 (sign-extended) and store the
// low bits: a float by polykit's float -> integer rule (reference cast.py: NaN -> 0, truncated,
// saturated to the type's range), an integer wraps. tests/kernels/cuda/test_lowp.py holds the
// numpy model of these functions, checked bit-exactly against ml_dtypes (float types: every code
// and a dense set of floats) and against an oracle of the written rule (integer types).
#pragma once
#include "dtypes.cuh"

struct f8e4m3fn_t { u8 x; };
struct f8e4m3fnuz_t { u8 x; };
struct f8e5m2_t { u8 x; };
struct f8e5m2fnuz_t { u8 x; };
struct f8e8m0_t { u8 x; };
struct f4e2m1_t { u8 x; };
struct i4_t { u8 x; };
struct u4_t { u8 x; };
struct i2_t { u8 x; };
struct u2_t { u8 x; };

// kind: 0 "fn" (no Inf, NaN = S.1111.111), 1 "fnuz" (NaN = 0x80, no -0), 2 IEEE-like (e5m2),
// 3 no Inf / NaN (float4: overflow and Inf saturate)
template <int M, int B, int MAXC, int KIND, int SB> struct LowpFloat {
  __device__ static __forceinline__ float decode(unsigned c) {
    if (KIND == 3) c &= 0xfu;
    const unsigned s = (c >> SB) & 1u, mag = c & ((1u << SB) - 1u);
    const unsigned ex = mag >> M, man = mag & ((1u << M) - 1u);
    unsigned bits;
    if (ex == 0) bits = __float_as_uint((float)man * __uint_as_float((unsigned)(127 + 1 - B - M) << 23));
    else bits = ((ex - B + 127u) << 23) | (man << (23 - M));
    bits |= s << 31;
    if (KIND == 0 && mag == 0x7fu) bits = (s << 31) | 0x7fc00000u;
    if (KIND == 1 && c == 0x80u) bits = 0xffc00000u;
    if (KIND == 2 && mag == 0x7cu) bits = (s << 31) | 0x7f800000u;
    if (KIND == 2 && mag > 0x7cu) bits = (s << 31) | 0x7fc00000u;
    return __uint_as_float(bits);
  }
  __device__ static __forceinline__ u8 encode(float f, bool sat) {
    const unsigned u = __float_as_uint(f), s = u >> 31, a = u & 0x7fffffffu;
    const int ovf = KIND == 0 ? 0x7f : (KIND == 1 ? -1 : (KIND == 2 ? 0x7c : MAXC));
    int code;
    if (a > 0x7f800000u) {  // NaN
      code = KIND == 0 ? 0x7f : (KIND == 1 ? -1 : (KIND == 2 ? 0x7e : -2));
    } else if (a == 0x7f800000u) {
      code = sat ? MAXC : ovf;
    } else {
      const int e = (int)(a >> 23);
      const int shift = 23 - M;
      if (e - 127 + B >= 1) {
        const unsigned r = (a + (1u << (shift - 1)) - 1u + ((a >> shift) & 1u)) >> shift;
        code = (int)r - ((127 - B) << M);
      } else {
        const unsigned m = (a & 0x7fffffu) | (e > 0 ? 0x800000u : 0u);
        const int rs = shift + 1 - ((e > 0 ? e : 1) - 127 + B);
        if (rs > 25) {
          code = 0;
        } else {
          unsigned q = m >> rs;
          const unsigned rem = m & ((1u << rs) - 1u), half = 1u << (rs - 1);
          q += (rem > half || (rem == half && (q & 1u))) ? 1u : 0u;
          code = (int)q;
        }
      }
      if (code > MAXC) code = sat ? MAXC : ovf;
    }
    if (KIND == 1 && code <= 0) return code == 0 ? 0 : 0x80;
    if (KIND == 3 && code == -2) return (u8)((1u - s) << 3);
    return (u8)((unsigned)code | (s << SB));
  }
};

// e4m3fn's decode by the conversion unit where there is one (sm_89+: cvt.rn.f16x2.e4m3x2, exact: every e4m3
// value is a float16, and float16 -> float32 is exact), 2 instructions and the NaN test where LowpFloat's bit
// assembly took ~15 (the FP8 epilogues' e4m3 residuals: 15.6 of 31.5 instructions an output, cuda_sass.py
// --fp8 e4m3 --fp8-family gemm_fast --fp8-residual e4m3). The NaN codes S.1111.111 keep decode's quiet NaN with
// their sign, whatever NaN the hardware gives. (One PTX instruction an asm: the host emulation's rule.)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
__device__ __forceinline__ u32 e4m3x2_f16x2(unsigned short codes) {  // byte 0 -> the low half
  u32 h;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(codes));
  return h;
}
__device__ __forceinline__ float f16_bits_float(unsigned short h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
#endif
__device__ __forceinline__ float e4m3_nan(unsigned c) { return __uint_as_float((c & 0x80u) << 24 | 0x7fc00000u); }
struct E4m3fnFloat : LowpFloat<3, 7, 0x7e, 0, 7> {
  __device__ static __forceinline__ float decode(unsigned c) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    const float f = f16_bits_float((unsigned short)e4m3x2_f16x2((unsigned short)(c & 0xffu)));
    return (c & 0x7fu) == 0x7fu ? e4m3_nan(c) : f;
#else
    return LowpFloat<3, 7, 0x7e, 0, 7>::decode(c);
#endif
  }
};

template <class T> struct LowpFmt;
template <> struct LowpFmt<f8e4m3fn_t> { typedef E4m3fnFloat F; };
// 8 e4m3fn codes (16-byte aligned: the epilogues' EpiIn8 fields) decoded at once: on sm_89+ four
// cvt.rn.f16x2.e4m3x2 and eight float16 -> float32 conversions, the NaN codes found a word at a time
// (rare: then decode's NaN, per element); elsewhere E4m3fnFloat::decode each
__device__ __forceinline__ void e4m3_decode8(const f8e4m3fn_t (&x)[8], float (&f)[8]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  const uint2 w = *(const uint2*)x;
  const u32 words[2] = {w.x, w.y};
#pragma unroll
  for (int k = 0; k < 2; ++k)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const u32 h = e4m3x2_f16x2((unsigned short)(words[k] >> 16 * j));
      f[4 * k + 2 * j] = f16_bits_float((unsigned short)h);
      f[4 * k + 2 * j + 1] = f16_bits_float((unsigned short)(h >> 16));
    }
  const u32 nan = __vcmpeq4(w.x & 0x7f7f7f7fu, 0x7f7f7f7fu) | __vcmpeq4(w.y & 0x7f7f7f7fu, 0x7f7f7f7fu);
  if (__builtin_expect(__any_sync(__activemask(), nan != 0), 0)) {  // (a warp's branch: kept apart, not predicated)
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if ((x[i].x & 0x7fu) == 0x7fu) f[i] = e4m3_nan(x[i].x);
  }
#else
#pragma unroll
  for (int i = 0; i < 8; ++i) f[i] = LowpFmt<f8e4m3fn_t>::F::decode(x[i].x);
#endif
}

template <> struct LowpFmt<f8e4m3fnuz_t> { typedef LowpFloat<3, 8, 0x7f, 1, 7> F; };
template <> struct LowpFmt<f8e5m2_t> { typedef LowpFloat<2, 15, 0x7b, 2, 7> F; };
template <> struct LowpFmt<f8e5m2fnuz_t> { typedef LowpFloat<2, 16, 0x7f, 1, 7> F; };
template <> struct LowpFmt<f4e2m1_t> { typedef LowpFloat<1, 1, 0x7, 3, 3> F; };

// float8e8m0 (a power-of-two exponent): round_mode 0 up, 1 down, 2 nearest (reference cast.py)
__device__ __forceinline__ float e8m0_decode(unsigned c) {
  c &= 0xffu;
  return __uint_as_float(c == 0xffu ? 0x7fc00000u : (c == 0 ? 0x00400000u : c << 23));
}
__device__ __forceinline__ u8 e8m0_encode(float f, bool sat, int mode) {
  const unsigned u = __float_as_uint(f), e = (u >> 23) & 0xffu;
  if (e == 0xffu) return 0xff;
  bool up = mode == 0 ? (u & 0x7fffffu) != 0
                      : (mode == 2 ? ((u & 0x400000u) != 0 && ((u & 0x3fffffu) != 0 || e > 0)) : false);
  if (sat && e == 0xfeu) up = false;
  return (u8)(e + (up ? 1u : 0u));
}

// 4/2-bit integers: an integer keeps its low NB bits (wraps, as ONNX casts between integers); a
// float goes by polykit's rule (reference cast.py): NaN -> 0, truncated toward zero, saturated
// to [LO, HI] -- compared before any conversion, so only in-range values are converted
template <int NB, bool SIGNED> __device__ __forceinline__ u8 intn_bits(double d) {
  const int LO = SIGNED ? -(1 << (NB - 1)) : 0, HI = SIGNED ? (1 << (NB - 1)) - 1 : (1 << NB) - 1;
  const i32 v = d != d ? 0 : (d <= (double)LO ? LO : (d >= (double)HI ? HI : (i32)d));
  return (u8)(v & ((1 << NB) - 1));
}
template <int NB, bool SIGNED> __device__ __forceinline__ u8 intn_bits(float f) { return intn_bits<NB, SIGNED>((double)f); }
template <int NB, bool SIGNED> __device__ __forceinline__ u8 intn_bits(i64 v) { return (u8)((u64)v & ((1u << NB) - 1u)); }
template <int NB, bool SIGNED> __device__ __forceinline__ u8 intn_bits(u64 v) { return (u8)(v & ((1u << NB) - 1u)); }
template <int NB, bool SIGNED> __device__ __forceinline__ u8 intn_bits(i32 v) { return (u8)((u32)v & ((1u << NB) - 1u)); }
template <int NB, bool SIGNED> __device__ __forceinline__ u8 intn_bits(u32 v) { return (u8)(v & ((1u << NB) - 1u)); }
template <int NB, bool SIGNED> __device__ __forceinline__ u8 intn_bits(i16 v) { return (u8)((u32)v & ((1u << NB) - 1u)); }
template <int NB, bool SIGNED> __device__ __forceinline__ u8 intn_bits(u16 v) { return (u8)(v & ((1u << NB) - 1u)); }
template <int NB, bool SIGNED> __device__ __forceinline__ u8 intn_bits(i8 v) { return (u8)((u32)v & ((1u << NB) - 1u)); }
template <int NB, bool SIGNED> __device__ __forceinline__ u8 intn_bits(u8 v) { return (u8)(v & ((1u << NB) - 1u)); }
template <int NB, bool SIGNED> __device__ __forceinline__ u8 intn_bits(bool v) { return v ? 1 : 0; }
template <int NB, bool SIGNED> __device__ __forceinline__ i32 intn_value(unsigned c) {
  c &= (1u << NB) - 1u;
  return SIGNED && c >= (1u << (NB - 1)) ? (i32)c - (1 << NB) : (i32)c;
}

template <class T> struct LowpInt;
template <> struct LowpInt<i4_t> { enum { NB = 4, SIGNED = 1 }; };
template <> struct LowpInt<u4_t> { enum { NB = 4, SIGNED = 0 }; };
template <> struct LowpInt<i2_t> { enum { NB = 2, SIGNED = 1 }; };
template <> struct LowpInt<u2_t> { enum { NB = 2, SIGNED = 0 }; };

// compute types, ld() and st() (st of a float type never saturates: a Cast has already
// rounded the value with its own `saturate`, so st only re-encodes an exact value)
#define LOWP_FLOAT(T)                                                                                      \
  template <> struct Compute<T> { typedef float type; };                                                  \
  template <> __device__ __forceinline__ float ld<T>(const T* p, i64 i) { return LowpFmt<T>::F::decode(p[i].x); } \
  template <class V> __device__ __forceinline__ void st(T* p, i64 i, V v) {                               \
    p[i].x = LowpFmt<T>::F::encode(cvt<float>(v), false);                                                 \
  }
LOWP_FLOAT(f8e4m3fn_t)
LOWP_FLOAT(f8e4m3fnuz_t)
LOWP_FLOAT(f8e5m2_t)
LOWP_FLOAT(f8e5m2fnuz_t)
LOWP_FLOAT(f4e2m1_t)
#undef LOWP_FLOAT

template <> struct Compute<f8e8m0_t> { typedef float type; };
template <> __device__ __forceinline__ float ld<f8e8m0_t>(const f8e8m0_t* p, i64 i) { return e8m0_decode(p[i].x); }
template <class V> __device__ __forceinline__ void st(f8e8m0_t* p, i64 i, V v) {
  p[i].x = e8m0_encode(cvt<float>(v), false, 1);  // exact powers of two (and 2^-127) keep their code
}

#define LOWP_INT(T)                                                                                         \
  template <> struct Compute<T> { typedef i32 type; };                                                     \
  template <> __device__ __forceinline__ i32 ld<T>(const T* p, i64 i) {                                    \
    return intn_value<LowpInt<T>::NB, (bool)LowpInt<T>::SIGNED>(p[i].x);                                   \
  }                                                                                                         \
  template <class V> __device__ __forceinline__ void st(T* p, i64 i, V v) {                                \
    p[i].x = intn_bits<LowpInt<T>::NB, (bool)LowpInt<T>::SIGNED>(v);                                       \
  }
LOWP_INT(i4_t)
LOWP_INT(u4_t)
LOWP_INT(i2_t)
LOWP_INT(u2_t)
#undef LOWP_INT

// Cast's conversion kept in the compute type: the value `x` becomes once stored as T
template <class T, class V> __device__ __forceinline__ float pk_to_lowp(V x, bool sat) {
  return LowpFmt<T>::F::decode(LowpFmt<T>::F::encode(cvt<float>(x), sat));
}
template <class V> __device__ __forceinline__ float pk_to_e8m0(V x, bool sat, int mode) {
  return e8m0_decode(e8m0_encode(cvt<float>(x), sat, mode));
}
template <class T, class V> __device__ __forceinline__ i32 pk_to_intn(V x) {
  return intn_value<LowpInt<T>::NB, (bool)LowpInt<T>::SIGNED>(intn_bits<LowpInt<T>::NB, (bool)LowpInt<T>::SIGNED>(x));
}

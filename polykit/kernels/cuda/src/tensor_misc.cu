// Small tensor kernels: constant writers (Constant, ConstantOfShape, Shape, Size, Dropout's
// mask), EyeLike, OneHot, Range, ReverseSequence and CastLike's conversion.
//
// Every kernel is a 1-D grid-stride loop over its output (one thread per element, block
// 256). Values known when the plan is built travel as kernel arguments (raw bits in u64):
//   fill_<es>(out, n, bits)               out[i] = low es bytes of bits
//   write_words(out, nbytes, w0..w63)     byte i of out = byte i of the 64 argument words
//                                          (out already offset by the host to a 512 B chunk)
//   eye_<es>(out, rows, cols, k, one)     out[r, c] = (c - r == k) ? one : 0
// Values that live on the device (Range's start/delta, OneHot's values) are read there.
#include "lowp.cuh"

#define GRID_LOOP(i, n) for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)
#define W8(p) u64 p##0, u64 p##1, u64 p##2, u64 p##3, u64 p##4, u64 p##5, u64 p##6, u64 p##7
#define W64(p) W8(p##0), W8(p##1), W8(p##2), W8(p##3), W8(p##4), W8(p##5), W8(p##6), W8(p##7)
#define L8(p) p##0, p##1, p##2, p##3, p##4, p##5, p##6, p##7
#define L64(p) L8(p##0), L8(p##1), L8(p##2), L8(p##3), L8(p##4), L8(p##5), L8(p##6), L8(p##7)

extern "C" __global__ void write_words(u8* out, i64 nbytes, W64(w)) {
  const u64 words[64] = {L64(w)};
  GRID_LOOP(i, nbytes) out[i] = (u8)(words[i >> 3] >> (8 * (i & 7)));
}

// OneHot indices may be of any numeric type: code = index into this switch (see tensor_misc.py)
__device__ __forceinline__ i64 load_any_index(const void* p, i64 i, int code) {
  switch (code) {
    case 0: return ((const i64*)p)[i];
    case 1: return ((const i32*)p)[i];
    case 2: return ((const i16*)p)[i];
    case 3: return ((const i8*)p)[i];
    case 4: return ((const u8*)p)[i];
    case 5: return ((const u16*)p)[i];
    case 6: return ((const u32*)p)[i];
    case 7: return (i64)((const u64*)p)[i];
    case 8: return cvt<i64>(((const float*)p)[i]);
    case 9: return cvt<i64>(((const double*)p)[i]);
    default: return cvt<i64>(h2f(((const half_t*)p)[i]));
  }
}

// onehot: output viewed as [outer, depth, inner] (axis = the depth dim), indices as [outer, inner];
// an index k (wrapped once if negative) selects values[1] at depth k, values[0] elsewhere.
template <class E>
__device__ void onehot(const void* idx, int code, const E* values, E* out, i64 outer, i64 depth, i64 inner) {
  const E off = values[0], on = values[1];
  GRID_LOOP(i, outer * depth * inner) {
    const i64 in_ = i % inner, t = i / inner, d = t % depth, o = t / depth;
    i64 k = load_any_index(idx, o * inner + in_, code);
    if (k < 0) k += depth;
    out[i] = k == d ? on : off;
  }
}

// reverse_sequence: element i has time coordinate (i / st_t) % T and batch coordinate
// (i / st_b) % B; the first lengths[b] time steps of each batch entry are reversed.
template <class E>
__device__ void reverse_sequence(const E* x, const void* lengths, E* out, i64 is64, i64 n, i64 st_t, i64 T,
                                 i64 st_b, i64 B) {
  GRID_LOOP(i, n) {
    const i64 t = (i / st_t) % T, b = (i / st_b) % B;
    i64 len = is64 ? ((const i64*)lengths)[b] : (i64)((const i32*)lengths)[b];
    len = len < 0 ? 0 : (len > T ? T : len);
    out[i] = t < len ? x[i + (len - 1 - 2 * t) * st_t] : x[i];
  }
}

#define BY_SIZE(E, es)                                                                                        \
  extern "C" __global__ void fill_##es(E* out, i64 n, u64 bits) { GRID_LOOP(i, n) out[i] = (E)bits; }        \
  extern "C" __global__ void eye_##es(E* out, i64 rows, i64 cols, i64 k, u64 one) {                           \
    GRID_LOOP(i, rows * cols) out[i] = (i % cols) - (i / cols) == k ? (E)one : (E)0;                          \
  }                                                                                                           \
  extern "C" __global__ void onehot_##es(const void* idx, int code, const E* values, E* out, i64 outer,       \
                                         i64 depth, i64 inner) {                                              \
    onehot<E>(idx, code, values, out, outer, depth, inner);                                                   \
  }                                                                                                           \
  extern "C" __global__ void reverse_sequence_##es(const E* x, const void* lengths, E* out, i64 is64, i64 n,  \
                                                   i64 st_t, i64 T, i64 st_b, i64 B) {                        \
    reverse_sequence<E>(x, lengths, out, is64, n, st_t, T, st_b, B);                                          \
  }
BY_SIZE(u8, 1)
BY_SIZE(u16, 2)
BY_SIZE(u32, 4)
BY_SIZE(u64, 8)

// range: out[i] = start + i * delta in the wide type W (double / i64), rounded once to T
// (the _rn intrinsics keep the compiler from contracting into an fma numpy does not do).
__device__ __forceinline__ double range_at(double s, double d, i64 i) { return __dadd_rn(s, __dmul_rn((double)i, d)); }
__device__ __forceinline__ i64 range_at(i64 s, i64 d, i64 i) { return s + i * d; }

#define RANGE(T, W, code)                                                                                   \
  extern "C" __global__ void range_##code(const T* start, const T* delta, T* out, i64 n) {                  \
    const W s = (W)start[0], d = (W)delta[0];                                                               \
    GRID_LOOP(i, n) out[i] = (T)range_at(s, d, i);                                                          \
  }
RANGE(float, double, f32)
RANGE(double, double, f64)
RANGE(i16, i64, i16)
RANGE(i32, i64, i32)
RANGE(i64, i64, i64)

// 16-bit floats: computed in double like the others, rounded once to half (bf16 via float)
__device__ __forceinline__ bf16_t d2b(double x) { return f2b((float)x); }
#define RANGE_NARROW(T, code, CVT)                                                                          \
  extern "C" __global__ void range_##code(const T* start, const T* delta, T* out, i64 n) {                  \
    const double s = (double)ld(start, 0), d = (double)ld(delta, 0);                                        \
    GRID_LOOP(i, n) out[i] = CVT(range_at(s, d, i));                                                        \
  }
RANGE_NARROW(half_t, f16, d2h)
RANGE_NARROW(bf16_t, bf16, d2b)

// cast_any: CastLike's conversion (ONNX Cast semantics) with both dtypes chosen at run time
// by code (see tensor_misc.py: f32 f16 f64 i8 u8 i16 u16 i32 u32 i64 u64 bool bf16 = 0..12, then
// the lowp.cuh types f8e4m3fn f8e4m3fnuz f8e5m2 f8e5m2fnuz f8e8m0 f4e2m1 i4 u4 i2 u2 = 13..22).
// `sat` (float8 saturate) and `rmode` (float8e8m0 round_mode: 0 up, 1 down, 2 nearest) are
// CastLike's attributes; floats reach the 8/4-bit float types through float, as ml_dtypes does.
// The source is loaded exactly as double (floats), i64 (signed ints, bool) or u64, then
// converted once to the destination, so no value is rounded twice. A float becomes an integer
// by polykit's rule (cvt, intn_bits: NaN -> 0, truncated, saturated); integers wrap.
struct Scalar { double f; i64 s; u64 u; int kind; };  // kind 0: f, 1: s, 2: u

__device__ __forceinline__ Scalar load_scalar(const void* x, i64 i, int code) {
  Scalar v = {0.0, 0, 0, 1};
  switch (code) {
    case 0: v.f = ((const float*)x)[i]; v.kind = 0; break;
    case 1: v.f = h2f(((const half_t*)x)[i]); v.kind = 0; break;
    case 2: v.f = ((const double*)x)[i]; v.kind = 0; break;
    case 3: v.s = ((const i8*)x)[i]; break;
    case 4: v.s = ((const u8*)x)[i]; break;
    case 5: v.s = ((const i16*)x)[i]; break;
    case 6: v.s = ((const u16*)x)[i]; break;
    case 7: v.s = ((const i32*)x)[i]; break;
    case 8: v.s = ((const u32*)x)[i]; break;
    case 9: v.s = ((const i64*)x)[i]; break;
    case 10: v.u = ((const u64*)x)[i]; v.kind = 2; break;
    case 12: v.f = b2f(((const bf16_t*)x)[i]); v.kind = 0; break;
    case 13: v.f = ld((const f8e4m3fn_t*)x, i); v.kind = 0; break;
    case 14: v.f = ld((const f8e4m3fnuz_t*)x, i); v.kind = 0; break;
    case 15: v.f = ld((const f8e5m2_t*)x, i); v.kind = 0; break;
    case 16: v.f = ld((const f8e5m2fnuz_t*)x, i); v.kind = 0; break;
    case 17: v.f = ld((const f8e8m0_t*)x, i); v.kind = 0; break;
    case 18: v.f = ld((const f4e2m1_t*)x, i); v.kind = 0; break;
    case 19: v.s = ld((const i4_t*)x, i); break;
    case 20: v.s = ld((const u4_t*)x, i); break;
    case 21: v.s = ld((const i2_t*)x, i); break;
    case 22: v.s = ld((const u2_t*)x, i); break;
    default: v.s = ((const bool*)x)[i] ? 1 : 0; break;
  }
  return v;
}

template <class T> __device__ __forceinline__ u8 lowp_store(float f, bool sat) { return LowpFmt<T>::F::encode(f, sat); }

template <class D, class V>
__device__ __forceinline__ void store_as(void* y, i64 i, int code, V v, bool sat, int rmode) {
  switch (code) {
    case 0: ((float*)y)[i] = (float)v; break;
    case 1: ((half_t*)y)[i] = d2h((double)v); break;
    case 2: ((double*)y)[i] = (double)v; break;
    case 3: ((i8*)y)[i] = cvt<i8>(v); break;
    case 4: ((u8*)y)[i] = cvt<u8>(v); break;
    case 5: ((i16*)y)[i] = cvt<i16>(v); break;
    case 6: ((u16*)y)[i] = cvt<u16>(v); break;
    case 7: ((i32*)y)[i] = cvt<i32>(v); break;
    case 8: ((u32*)y)[i] = cvt<u32>(v); break;
    case 9: ((i64*)y)[i] = cvt<i64>(v); break;
    case 10: ((u64*)y)[i] = cvt<u64>(v); break;
    case 12: ((bf16_t*)y)[i] = f2b((float)v); break;
    case 13: ((u8*)y)[i] = lowp_store<f8e4m3fn_t>((float)v, sat); break;
    case 14: ((u8*)y)[i] = lowp_store<f8e4m3fnuz_t>((float)v, sat); break;
    case 15: ((u8*)y)[i] = lowp_store<f8e5m2_t>((float)v, sat); break;
    case 16: ((u8*)y)[i] = lowp_store<f8e5m2fnuz_t>((float)v, sat); break;
    case 17: ((u8*)y)[i] = e8m0_encode((float)v, sat, rmode); break;
    case 18: ((u8*)y)[i] = lowp_store<f4e2m1_t>((float)v, sat); break;
    case 19: ((u8*)y)[i] = intn_bits<4, true>(v); break;
    case 20: ((u8*)y)[i] = intn_bits<4, false>(v); break;
    case 21: ((u8*)y)[i] = intn_bits<2, true>(v); break;
    case 22: ((u8*)y)[i] = intn_bits<2, false>(v); break;
    default: ((bool*)y)[i] = v != (V)0; break;
  }
}

extern "C" __global__ void cast_any(const void* x, int scode, void* y, int dcode, i64 n, int sat, int rmode) {
  GRID_LOOP(i, n) {
    const Scalar v = load_scalar(x, i, scode);
    if (v.kind == 0) store_as<void, double>(y, i, dcode, v.f, sat != 0, rmode);
    else if (v.kind == 1) store_as<void, i64>(y, i, dcode, v.s, sat != 0, rmode);
    else store_as<void, u64>(y, i, dcode, v.u, sat != 0, rmode);
  }
}

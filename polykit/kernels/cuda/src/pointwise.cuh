// Device functions of the ONNX elementwise ops, on compute types (float for fp16/fp32
// storage, double, integers, bool). The pointwise code generator (pointwise.py) and GEMM/conv
// epilogues chain these; arithmetic keeps the type of its first operand, as ONNX does.
#pragma once
#include "dtypes.cuh"
#include "lowp.cuh"

// one-argument math: float overload, double overload, integer fallback through double
#define PK_MATH1(name, ffn, dfn)                                                     \
  __device__ __forceinline__ float name(float x) { return ffn(x); }                   \
  __device__ __forceinline__ double name(double x) { return dfn(x); }                \
  template <class T> __device__ __forceinline__ T name(T x) { return (T)dfn((double)x); }

PK_MATH1(pk_sqrt, sqrtf, sqrt)
PK_MATH1(pk_exp, expf, exp)
PK_MATH1(pk_log, logf, log)
PK_MATH1(pk_log1p, log1pf, log1p)
PK_MATH1(pk_erf, erff, erf)
PK_MATH1(pk_floor, floorf, floor)
PK_MATH1(pk_ceil, ceilf, ceil)
PK_MATH1(pk_round, rintf, rint)
PK_MATH1(pk_sin, sinf, sin)
PK_MATH1(pk_cos, cosf, cos)
PK_MATH1(pk_tan, tanf, tan)
PK_MATH1(pk_asin, asinf, asin)
PK_MATH1(pk_acos, acosf, acos)
PK_MATH1(pk_atan, atanf, atan)
PK_MATH1(pk_sinh, sinhf, sinh)
PK_MATH1(pk_cosh, coshf, cosh)
PK_MATH1(pk_asinh, asinhf, asinh)
PK_MATH1(pk_acosh, acoshf, acosh)
PK_MATH1(pk_atanh, atanhf, atanh)
PK_MATH1(pk_tanh, tanhf, tanh)

template <class T> __device__ __forceinline__ T pk_abs(T x) { return x < (T)0 ? (T)(-x) : x; }
__device__ __forceinline__ u8 pk_abs(u8 x) { return x; }
__device__ __forceinline__ u16 pk_abs(u16 x) { return x; }
__device__ __forceinline__ u32 pk_abs(u32 x) { return x; }
__device__ __forceinline__ u64 pk_abs(u64 x) { return x; }
template <class T> __device__ __forceinline__ T pk_neg(T x) { return (T)(-x); }
template <class T> __device__ __forceinline__ T pk_reciprocal(T x) { return (T)((T)1 / x); }
template <class T> __device__ __forceinline__ T pk_sign(T x) { return (T)((x > (T)0) - (x < (T)0)); }
template <class T> __device__ __forceinline__ bool pk_not(T x) { return !x; }
template <class T> __device__ __forceinline__ T pk_bitnot(T x) { return (T)(~x); }
template <class T> __device__ __forceinline__ bool pk_isnan(T x) { return x != x; }
template <class T> __device__ __forceinline__ bool pk_isinf(T x, bool pos, bool neg) {
  return x == x && (x - x) != (x - x) && ((x > (T)0 && pos) || (x < (T)0 && neg));
}

// binary arithmetic (result has the first operand's type)
template <class A, class B> __device__ __forceinline__ A pk_add(A a, B b) { return (A)(a + b); }
template <class A, class B> __device__ __forceinline__ A pk_sub(A a, B b) { return (A)(a - b); }
template <class A, class B> __device__ __forceinline__ A pk_mul(A a, B b) { return (A)(a * b); }
#ifdef __CUDA_ARCH__
// float / double: each op rounded on its own, as ONNX's Mul then Add are (and the cpu reference): NVRTC contracts
// a plain a * b + c into one fma by default (--fmad=true), one rounding fewer, which moved a requantized INT8
// output by one at a near-tie (test_int8.py's 8-bit residual, 2026-12-08, H100). (The host emulations compile
// these at -O1, which contracts nothing.)
__device__ __forceinline__ float pk_add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float pk_sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ float pk_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double pk_add(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ double pk_sub(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ double pk_mul(double a, double b) { return __dmul_rn(a, b); }
#endif
template <class A, class B> __device__ __forceinline__ A pk_div(A a, B b) { return (A)(a / b); }
template <class A, class B> __device__ __forceinline__ A pk_fmod(A a, B b) {
  if (IsFloat<A>::value) return (A)fmod((double)a, (double)b);
  return b == (B)0 ? (A)0 : (A)(a - (A)(a / b) * b);
}
__device__ __forceinline__ float pk_fmod(float a, float b) { return fmodf(a, b); }
template <class A, class B> __device__ __forceinline__ A pk_mod(A a, B b) {  // floor mod (sign of divisor)
  A r = pk_fmod(a, b);
  if (r != (A)0 && ((r < (A)0) != (b < (B)0))) r = (A)(r + b);
  return r;
}
template <class A, class B> __device__ __forceinline__ A pk_pow(A a, B b) {
  if (IsFloat<A>::value) return (A)pow((double)a, (double)b);
  i64 e = cvt<i64>(b), r = 1, base = (i64)a;
  if (e < 0) return (A)(base == 1 ? 1 : (base == -1 ? ((e & 1) ? -1 : 1) : 0));
  while (e) { if (e & 1) r *= base; base *= base; e >>= 1; }
  return (A)r;
}
__device__ __forceinline__ float pk_pow(float a, float b) { return powf(a, b); }
__device__ __forceinline__ float pk_pow(float a, double b) { return powf(a, (float)b); }
template <class B> __device__ __forceinline__ float pk_powf_int(float a, B b) { return powf(a, (float)b); }
__device__ __forceinline__ float pk_pow(float a, i32 b) { return powf(a, (float)b); }
__device__ __forceinline__ float pk_pow(float a, i64 b) { return powf(a, (float)b); }
template <class A, class B> __device__ __forceinline__ A pk_band(A a, B b) { return (A)(a & b); }
template <class A, class B> __device__ __forceinline__ A pk_bor(A a, B b) { return (A)(a | b); }
template <class A, class B> __device__ __forceinline__ A pk_bxor(A a, B b) { return (A)(a ^ b); }
template <class A, class B> __device__ __forceinline__ A pk_shl(A a, B b) { return (A)(a << b); }
template <class A, class B> __device__ __forceinline__ A pk_shr(A a, B b) { return (A)(a >> b); }

// numpy minimum/maximum: NaN propagates
template <class A, class B> __device__ __forceinline__ A pk_min(A a, B b) {
  return a != a ? a : ((A)b != (A)b ? (A)b : (a < (A)b ? a : (A)b));
}
template <class A, class B> __device__ __forceinline__ A pk_max(A a, B b) {
  return a != a ? a : ((A)b != (A)b ? (A)b : (a > (A)b ? a : (A)b));
}

// activations (float math on float compute types; integers where ONNX allows them)
template <class T> __device__ __forceinline__ T pk_relu(T x) { return x > (T)0 ? x : (T)0; }
template <class T> __device__ __forceinline__ T pk_leaky_relu(T x, double alpha) { return x < (T)0 ? (T)(x * (T)alpha) : x; }
template <class T, class S> __device__ __forceinline__ T pk_prelu(T x, S slope) { return x < (T)0 ? (T)(x * (T)slope) : x; }
template <class T> __device__ __forceinline__ T pk_sigmoid(T x) {
  return x >= (T)0 ? (T)1 / ((T)1 + pk_exp(-x)) : pk_exp(x) / ((T)1 + pk_exp(x));
}
template <class T> __device__ __forceinline__ T pk_hard_sigmoid(T x, double alpha, double beta) {
  T y = (T)alpha * x + (T)beta;
  return y < (T)0 ? (T)0 : (y > (T)1 ? (T)1 : y);
}
template <class T> __device__ __forceinline__ T pk_hard_swish(T x) { return x * pk_hard_sigmoid(x, 1.0 / 6.0, 0.5); }
template <class T> __device__ __forceinline__ T pk_elu(T x, double alpha) { return x < (T)0 ? (T)alpha * (pk_exp(x) - (T)1) : x; }
template <class T> __device__ __forceinline__ T pk_selu(T x, double alpha, double gamma) {
  return (T)gamma * (x <= (T)0 ? (T)alpha * (pk_exp(x) - (T)1) : x);
}
template <class T> __device__ __forceinline__ T pk_celu(T x, double alpha) {
  T e = (T)alpha * (pk_exp(x / (T)alpha) - (T)1);
  return (x > (T)0 ? x : (T)0) + (e < (T)0 ? e : (T)0);
}
template <class T> __device__ __forceinline__ T pk_gelu(T x) { return (T)0.5 * x * ((T)1 + pk_erf(x * (T)0.70710678118654752440)); }
// GELU of a value whose result is stored in 16 bits (fp16 / bf16 GEMM and conv epilogues: epilogue.py
// defines PK_GELU16): x Phi(x) = relu(x) - t Q(t), t = |x|, Q(t) = Phi(-t) = erfc(t / sqrt 2) / 2, with
// 2 Q(t) = 2^P(t), P a degree-9 fit of log2 erfc(t / sqrt 2) on [0, 13.3] (2Q's relative error under 6e-6
// for t <= 5.5, where t Q(t) is a normal fp16 number; beyond, 2^P flushes towards 0: ex2.approx.ftz).
// 13 instructions and one MUFU against erff's form's ~22. Over every finite fp16 input the fp16 result is
// within 1 ulp of the float64 GELU rounded to fp16 (erff's form: 2 ulp) and differs from it as rarely
// (tests/kernels/cuda/test_gemm_sm90.py). NaN stays NaN; +inf gives inf, -inf NaN, as erff's form does.
__device__ __forceinline__ float pk_gelu16(float x) {
  const float t = fminf(fabsf(x), 13.3f);
  float p = -1.6974855965301572e-09f;
  p = fmaf(p, t, 1.3358908290683758e-07f);
  p = fmaf(p, t, -4.486095804168144e-06f);
  p = fmaf(p, t, 8.561765571357682e-05f);
  p = fmaf(p, t, -0.0010467658285051584f);
  p = fmaf(p, t, 0.008820289745926857f);
  p = fmaf(p, t, -0.054412297904491425f);
  p = fmaf(p, t, -0.45814797282218933f);
  p = fmaf(p, t, -1.1513333320617676f);
  p = fmaf(p, t, 8.10409528639866e-06f);
  float q2;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(q2) : "f"(p));
  return 0.5f * fmaf(-t, q2, x + fabsf(x));
}
// Sigmoid of a value whose result is stored in 16 bits (the same PK_GELU16 units: fp16 / bf16 GEMM, conv,
// SE and norm epilogues, where SiLU = x sigmoid(x) follows most of EfficientNet's convolutions):
// 1 / (1 + 2^(-x log2 e)) with ex2.approx and rcp.approx, 4 instructions and two MUFU against the
// float form's two expf and an IEEE division (~40 with its branch). Relative error under 2^-18 for |x| <= 24
// (the product's rounding, scaled by |x| log2 e), far inside fp16's 2^-11; large negative x gives
// 2^(+inf) = inf and rcp 0, large positive 1; NaN stays NaN (tests/kernels/cuda/test_gemm_sm90.py).
__device__ __forceinline__ float pk_sigmoid16(float x) {
  const float t = x * -1.4426950408889634f;
  float e, r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(t));
  const float d = 1.0f + e;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
  return r;
}
#if PK_GELU16
__device__ __forceinline__ float pk_gelu(float x) { return pk_gelu16(x); }
template <> __device__ __forceinline__ float pk_sigmoid<float>(float x) { return pk_sigmoid16(x); }
#endif
template <class T> __device__ __forceinline__ T pk_gelu_tanh(T x) {
  return (T)0.5 * x * ((T)1 + pk_tanh((T)0.79788456080286535588 * (x + (T)0.044715 * x * x * x)));
}
template <class T> __device__ __forceinline__ T pk_softplus(T x) { return x > (T)20 ? x : pk_log1p(pk_exp(x)); }
template <class T> __device__ __forceinline__ T pk_softsign(T x) { return x / ((T)1 + pk_abs(x)); }
template <class T> __device__ __forceinline__ T pk_mish(T x) { return x * pk_tanh(pk_softplus(x)); }
template <class T> __device__ __forceinline__ T pk_thresholded_relu(T x, double alpha) { return x > (T)alpha ? x : (T)0; }
template <class T> __device__ __forceinline__ T pk_shrink(T x, double bias, double lambd) {
  return x < (T)(-lambd) ? (T)(x + (T)bias) : (x > (T)lambd ? (T)(x - (T)bias) : (T)0);
}
template <class T> __device__ __forceinline__ T pk_swish(T x, double alpha) { return x * pk_sigmoid((T)alpha * x); }
template <class T, class L, class H> __device__ __forceinline__ T pk_clip(T x, L lo, H hi) {
  T y = x < (T)lo ? (T)lo : x;
  return y > (T)hi ? (T)hi : y;
}
template <class T, class L> __device__ __forceinline__ T pk_clip_lo(T x, L lo) { return x < (T)lo ? (T)lo : x; }
template <class T, class H> __device__ __forceinline__ T pk_clip_hi(T x, H hi) { return x > (T)hi ? (T)hi : x; }

// Cast to fp16 rounds to half precision but stays in the float compute type
template <class T> __device__ __forceinline__ float pk_to_half(T x) { return h2f(f2h(cvt<float>(x))); }
__device__ __forceinline__ float pk_to_half(double x) { return h2f(d2h(x)); }
template <class T> __device__ __forceinline__ float pk_to_bf16(T x) { return b2f(f2b(cvt<float>(x))); }

// fixed-size vector for aligned vector loads/stores of contiguous tensors
template <class T, int V> struct __align__(sizeof(T) * V) Vec { T v[V]; };

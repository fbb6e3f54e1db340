// The output side of every INT8 kernel (int8.cu on mma.sync, conv_sm90.cu's I8 variant on wgmma):
// the exact int32 centered sum of output (m, n) -> per output channel n
//   v = float(acc) * scale[n] + bias[n]           (float32, each step rounded, no fma: the cpu reference's
//                                                  arithmetic, reference/int8.py's dequantize)
//   v = epilogue(v)                               (float32, epilogue.py, when HAS_EPILOGUE)
//   Y = v, or saturate(rint(v / y_scale) + y_zero_point) as int8 / uint8 (QuantizeLinear's rounding,
//       computed as v * (1 / y_scale) where that provably rounds to the same integer: requantize)
// Out::put stores one element; Out::channels8 / dequantize8 / store8 eight consecutive channels of
// one row with the same arithmetic per element (the sm90 kernel's 16-byte epilogue, finish_rows in
// gemm_sm90_epilogue.cuh, which runs the epilogue between them, where Out::vec_ok allows it).
// F8 1 (conv_sm90.cu's FP8 variant): the sum is the float32 one of e4m3 products, v = acc * scale[n]
// + bias[n] (each step rounded), and a requantized output is float8_e4m3fn: v / y_scale (IEEE
// division) rounded to nearest even and saturated to +-448 (QuantizeLinear with saturate 1).
// Include after HAS_EPILOGUE is defined (and the epilogue prelude, when it is 1).
#pragma once
#include "dtypes.cuh"

enum { FLAG_X_U8 = 1, FLAG_W_U8 = 2, FLAG_Y_INT = 4, FLAG_Y_U8 = 8, FLAG_VEC_X = 16, FLAG_VEC_W = 32 };

// acc rounded to float (to nearest even, as numpy's astype): for |acc| < 2^22 exactly and without the
// conversion pipe's I2F, the float 1.5 * 2^23 with acc added to its bits is 1.5 * 2^23 + acc (the
// mantissa holds acc + 2^22 in [0, 2^23)), and the subtraction is exact; larger sums take I2F
__device__ __forceinline__ float acc_float(int acc) {
  if ((u32)acc + 0x400000u < 0x800000u) return __fsub_rn(__int_as_float(0x4B400000 + acc), 0x1.8p23f);
  return __int2float_rn(acc);
}

// 4 per-channel values from channel n (step 1: one 16-byte load, p + n 16-byte aligned) or one
// value for all (step 0)
__device__ __forceinline__ float4 channels4(const float* p, i64 n, int step) {
  return step ? *(const float4*)(p + n) : make_float4(p[0], p[0], p[0], p[0]);
}

// what every problem stores through: dequantize, epilogue, requantize
struct Out {
  const float *scale, *bias;
  void* Y;
  int scale_step, bias_step;
  bool yint, yu8;
  bool rcp_ok;  // 1 / ys is a normal float (ys in [2^-125, 2^125]): requantize's product bound holds
  float ys, rys;
  int yz, lo, hi;
#if HAS_EPILOGUE
  EpiState epi;
#endif
  // the arithmetic of one element (put and dequantize8 alike): the float32 dequantization, product and
  // sum rounded separately (never contracted to an fma), then QuantizeLinear's rounding and saturation
  __device__ __forceinline__ float dequantize(int acc, float s, float b) const {
    const float v = __fmul_rn(acc_float(acc), s);
    return bias ? __fadd_rn(v, b) : v;
  }
#if F8
  __device__ __forceinline__ float dequantize(float acc, float s, float b) const {
    const float v = __fmul_rn(acc, s);
    return bias ? __fadd_rn(v, b) : v;
  }
  // two values as e4m3 bytes (lo in the low byte): round to nearest even, saturated to +-448
  __device__ __forceinline__ unsigned short e4m3x2(float lo, float hi) const {
    unsigned short d;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(d) : "f"(__fdiv_rn(hi, ys)), "f"(__fdiv_rn(lo, ys)));
    return d;
  }
#endif
  // saturate(rint(v / ys) + yz), exactly, without the division where it cannot matter: t = v * rys
  // is within 3 * 2^-24 |t| of v / ys rounded (rys = 1 / ys rounded: two roundings, plus the
  // quotient's own), so rint(t) is rint(v / ys) unless t lies within that of a half-integer; there
  // (about 2^-19 of uniform values) the IEEE division decides. |t| is clamped to 1024 first: past
  // it every result saturates (|yz| <= 255); NaN gives 0 (QuantizeLinear by polykit's float ->
  // integer rule, reference cast.py). rint by the 1.5 * 2^23 shifter: t + 1.5 * 2^23 rounds t to
  // an integer (half to even) and holds it in its low mantissa bits.
  __device__ __forceinline__ int requantize(float v) const {
    const float t = fminf(fmaxf(__fmul_rn(v, rys), -1024.f), 1024.f);
    const float shifted = __fadd_rn(t, 0x1.8p23f);
    int q = __float_as_int(shifted) - 0x4B400000;
    const float off = fabsf(__fsub_rn(t, __fsub_rn(shifted, 0x1.8p23f)));  // |t - rint(t)|, exact
    if (!rcp_ok || fabsf(off - 0.5f) <= fabsf(t) * 0x1p-20f) {
      const float d = __fdiv_rn(v, ys);
      if (d != d) return 0;
      q = __float2int_rn(fminf(fmaxf(d, -1024.f), 1024.f));
    }
    return v != v ? 0 : min(max(q + yz, lo), hi);  // (with rcp_ok, v * rys is NaN only for a NaN v)
  }
  template <class A>  // int (the INT8 sums) or float (F8)
  __device__ __forceinline__ void put(i64 oi, i64 col, i64 n, A acc) const {
    float v = dequantize(acc, scale[n * scale_step], bias ? bias[n * bias_step] : 0.f);
#if HAS_EPILOGUE
    v = apply_epilogue(epi, v, oi, col);
#endif
    if (!yint) {
      ((float*)Y)[oi] = v;
      return;
    }
#if F8
    ((u8*)Y)[oi] = (u8)e4m3x2(v, 0.f);
#else
    const int q = requantize(v);
    if (yu8)
      ((u8*)Y)[oi] = (u8)q;
    else
      ((i8*)Y)[oi] = (i8)q;
#endif
  }
  // whether dequantize8 / store8 may serve (with oi, n multiples of 8): Y, a per-channel scale / bias and the
  // epilogue's inputs 16-byte aligned, an epilogue with apply_epilogue8
  __device__ __forceinline__ bool vec_ok() const {
    bool ok = ((u64)Y & 15) == 0 && (!scale_step || ((u64)scale & 15) == 0) &&
              (!bias || !bias_step || ((u64)bias & 15) == 0);
#if HAS_EPILOGUE && EPI_VEC
    ok = ok && epi_vec_ok(epi);
#elif HAS_EPILOGUE
    ok = false;
#endif
    return ok;
  }
  // outputs oi..oi + 7 = channels n..n + 7 of one row (vec_ok): put's arithmetic per element,
  // scale / bias read with 16-byte loads (channels8: rows of the same channels share them), then one
  // 8-byte store (int8 / uint8) or two 16-byte ones (float: store8). Split so a caller can have
  // several rows' loads in flight at once.
  __device__ __forceinline__ void channels8(i64 n, float (&s)[8], float (&b)[8]) const {
#pragma unroll
    for (int h = 0; h < 8; h += 4) {
      const float4 s4 = channels4(scale, n + h, scale_step);
      const float4 b4 = bias ? channels4(bias, n + h, bias_step) : make_float4(0.f, 0.f, 0.f, 0.f);
      s[h] = s4.x; s[h + 1] = s4.y; s[h + 2] = s4.z; s[h + 3] = s4.w;
      b[h] = b4.x; b[h + 1] = b4.y; b[h + 2] = b4.z; b[h + 3] = b4.w;
    }
  }
  template <class A>
  __device__ __forceinline__ void dequantize8(const A (&acc)[8], const float (&s)[8], const float (&b)[8],
                                              float (&v)[8]) const {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = dequantize(acc[i], s[i], b[i]);
  }
  __device__ __forceinline__ void store8(i64 oi, const float (&v)[8]) const {
    if (!yint) {
      float4* y = (float4*)((float*)Y + oi);
      y[0] = make_float4(v[0], v[1], v[2], v[3]);
      y[1] = make_float4(v[4], v[5], v[6], v[7]);
      return;
    }
#if F8
    *(uint2*)((u8*)Y + oi) = make_uint2(e4m3x2(v[0], v[1]) | (u32)e4m3x2(v[2], v[3]) << 16,
                                        e4m3x2(v[4], v[5]) | (u32)e4m3x2(v[6], v[7]) << 16);
#else
    struct __align__(8) Bytes { u8 b[8]; } q;  // (u8) keeps an int8's two's-complement byte
#pragma unroll
    for (int i = 0; i < 8; ++i) q.b[i] = (u8)requantize(v[i]);
    *(Bytes*)((u8*)Y + oi) = q;
#endif
  }
};

// Out from the kernel arguments (flags: FLAG_Y_INT / FLAG_Y_U8; steps 0 per tensor, 1 per channel);
// the epilogue state is the caller's to set
__device__ __forceinline__ Out int8_out(const float* Scale, const float* Bias, const float* YScale, const u8* YZ,
                                        void* Y, int flags, int scale_step, int bias_step) {
  Out o;
  o.scale = Scale; o.bias = Bias; o.Y = Y; o.scale_step = scale_step; o.bias_step = bias_step;
  o.yint = flags & FLAG_Y_INT;
  o.yu8 = flags & FLAG_Y_U8;
  o.ys = o.yint ? YScale[0] : 1.f;
  o.rys = __frcp_rn(o.ys);
  o.rcp_ok = o.ys >= 0x1p-125f && o.ys <= 0x1p125f;
  o.yz = !o.yint ? 0 : o.yu8 ? (int)YZ[0] : (int)(i8)YZ[0];
  o.lo = o.yu8 ? 0 : -128;
  o.hi = o.yu8 ? 255 : 127;
  return o;
}

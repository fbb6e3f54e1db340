// The output side of every INT8 kernel (int8.cu on mma.sync, conv_sm90.cu's I8 variant on wgmma):
// the exact int32 centered sum of output (m, n) -> per output channel n
//   v = float(acc) * scale[n] + bias[n]           (float32, each step rounded, no fma: the cpu reference's
//                                                  arithmetic, reference/int8.py's dequantize)
//   v = epilogue(v)                               (float32, epilogue.py, when HAS_EPILOGUE)
//   Y = v, or saturate(rint(v / y_scale) + y_zero_point) as int8 / uint8 (QuantizeLinear's rounding;
//       v / y_scale rounded as IEEE division rounds it, but computed without one: quotient)
// Out::put stores one element; Out::channels8 / dequantize8 / store8 eight consecutive channels of
// one row with the same arithmetic per element (the sm90 kernel's 16-byte epilogue, finish_rows in
// gemm_sm90_epilogue.cuh, which runs the epilogue between them, where Out::vec_ok allows it).
// F8 1 (conv_sm90.cu's FP8 variant): the sum is the float32 one of e4m3 products, v = acc * scale[n]
// + bias[n] (each step rounded), and a requantized output is float8_e4m3fn: v / y_scale (the IEEE
// quotient, as quotient computes it) rounded to nearest even and saturated to +-448 (QuantizeLinear
// with saturate 1).
// Y_OUT (define, optional; int8_sm90.py / fp8_sm90.py set it from the layer): the output type compiled
// in, 0 float32, 1 int8 (F8: e4m3), 2 uint8, 3 float16 (an epilogue that ends in a Cast to float16,
// passes/absorb_quantized_casts.py, so v is a float16 value already: stored exactly); without it (int8.cu)
// the flags say it at run time, but for a float16 output, which int8.py compiles in (Y_OUT 3) there too.
// SCALE_STEP, BIAS_STEP (defines, optional, set with Y_OUT): the scale's and the bias's step compiled
// in (0 one value, 1 one a channel; BIAS_STEP 2: no bias); without them the arguments say.
// Y_ZERO (define, optional): 0 when an int8 / uint8 output's zero point is a constant 0 (int8.out_defines, from the
// layer's y_symmetric); the kernel then ignores YZ and rounds each quotient to an integer by one conversion
// (cvt.rni.s32.f32, F2I: half to even, NaN -> 0, as polykit's float -> integer rule) before the packing's saturation
// (cvt.pack.sat, I2IP: two outputs an instruction), where the zero point's path costs ~4.4 instructions an output
// (cuda_sass.py --int8 int8 --int8-zero const|runtime: 15.6 against 18.6 an output on conv 128x256, no residual).
// Include after HAS_EPILOGUE is defined (and the epilogue prelude, when it is 1).
#pragma once
#include "dtypes.cuh"
// (quotient.cuh: clamp_nan, markstein_quotient, e4m3x2_cvt)
#include "quotient.cuh"

#ifndef Y_OUT
#define Y_OUT -1
#endif
#ifndef SCALE_STEP
#define SCALE_STEP -1
#endif
#ifndef BIAS_STEP
#define BIAS_STEP -1
#endif
#ifndef Y_ZERO
#define Y_ZERO -1
#endif
#ifndef F8
#define F8 0
#endif

enum { FLAG_X_U8 = 1, FLAG_W_U8 = 2, FLAG_Y_INT = 4, FLAG_Y_U8 = 8, FLAG_VEC_X = 16, FLAG_VEC_W = 32 };

// acc rounded to float (to nearest even, as numpy's astype): one conversion (ptxas emits I2FP.F32.S32 on sm_90).
// Sums known below 2^22 in magnitude (Out::small_sums) take dequantize8's shifter instead. (Before 2026-12-07 every
// sum took a range test, the shifter or I2F, and a select: ~5 instructions where this is one. ESTIMATE, not
// measured alone: even if the conversion ran at the CUDA guide's 16 a clock an SM beside Y_ZERO 0's F2I, two
// conversions an output allow 8 outputs a clock an SM, more than the ~6.7 that ~19 instructions an output issue.)
__device__ __forceinline__ float acc_float(int acc) { return __int2float_rn(acc); }

// 4 per-channel values from channel n (step 1: one 16-byte load, p + n 16-byte aligned) or one
// value for all (step 0)
__device__ __forceinline__ float4 channels4(const float* p, i64 n, int step) {
  return step ? *(const float4*)(p + n) : make_float4(p[0], p[0], p[0], p[0]);
}

// x from lane ^ mask of the same quad (every lane of the warp calls it); the host emulation of the
// tests brings its own quad_xor
#ifdef __CUDA_ARCH__
__device__ __forceinline__ u32 quad_xor(u32 x, int mask) { return __shfl_xor_sync(0xffffffffu, x, mask); }
#endif
// A 4 x 4 transpose of 16-bit pairs across each quad of lanes: lane q's pair j (w0: j = 0, 1 in its low,
// high half; w1: j = 2, 3) becomes lane j's pair q. The sm90 INT8 epilogue's bytes (I8_NATIVE in
// gemm_sm90_epilogue.cuh): a lane's accumulators are columns 2q, 2q + 1 of 4 blocks of 8, its 8 output
// bytes 4 such pairs; transposed, lane q holds block q's 8 bytes in column order (one 8-byte store), and
// the same transpose turns 8-byte residual loads into the accumulators' layout. Two exchanges: the pairs
// 2, 3 of lanes 0, 1 with the pairs 0, 1 of lanes 2, 3 (a word each, SEL), then within each pair of
// lanes the halves (PRMT): 2 shuffles, 4 SEL, 3 PRMT for 8 bytes, where 8 4-byte values took 8 shuffles
// and 24 SEL (transpose_quad).
// (a lane's selectors, computed once: quad_pairs(lane))
struct QuadPairs {
  u32 send, lo, hi;  // the halves lane ^ 1 wants; the halves of w0, w1 from the pair (a, r), (b, r)
  bool b1;
};
__device__ __forceinline__ QuadPairs quad_pairs(int lane) {
  const bool b0 = lane & 1;
  return QuadPairs{b0 ? 0x5410u : 0x7632u, b0 ? 0x3254u : 0x5410u, b0 ? 0x3276u : 0x7610u, (lane & 2) != 0};
}
__device__ __forceinline__ void transpose_pairs(u32& w0, u32& w1, const QuadPairs& p) {
  const u32 got = quad_xor(p.b1 ? w0 : w1, 2);
  const u32 a = p.b1 ? got : w0, b = p.b1 ? w1 : got;  // pairs 2 b1, 2 b1 + 1 of lanes b0 (a) and b0 + 2 (b)
  const u32 r = quad_xor(__byte_perm(a, b, p.send), 1);  // the halves lane ^ 1 wants
  w0 = __byte_perm(a, r, p.lo);
  w1 = __byte_perm(b, r, p.hi);
}

// what every problem stores through: dequantize, epilogue, requantize
struct Out {
  const float *scale, *bias;
  void* Y;
  int scale_step, bias_step;
  bool yint_, yu8_;  // the flags' output type (Y_OUT -1)
  bool rcp_ok;  // ys in [2^-90, 2^90]: quotient is exact (its proof's bounds)
  bool small_sums;  // every |acc| < 2^22 (the kernel's to set from K): dequantize8 by the shifter alone
  float ys, rys;  // rys = 1 / ys rounded
  int lo, hi, zmagic;  // zmagic: the zero point less the 1.5 * 2^23 shifter's bits (requantize_rcp)
#if HAS_EPILOGUE
  EpiState epi;
#endif
  __device__ __forceinline__ bool yint() const { return Y_OUT < 0 ? yint_ : Y_OUT == 1 || Y_OUT == 2; }
  __device__ __forceinline__ bool yu8() const { return Y_OUT < 0 ? yu8_ : Y_OUT == 2; }
  __device__ __forceinline__ int sstep() const { return SCALE_STEP < 0 ? scale_step : SCALE_STEP; }
  __device__ __forceinline__ int bstep() const { return BIAS_STEP < 0 ? bias_step : BIAS_STEP; }
  __device__ __forceinline__ bool has_bias() const { return BIAS_STEP < 0 ? bias != nullptr : BIAS_STEP < 2; }
  // the arithmetic of one element (put and dequantize8 alike): the float32 dequantization, product and
  // sum rounded separately (never contracted to an fma), then QuantizeLinear's rounding and saturation
  __device__ __forceinline__ float dequantize(int acc, float s, float b) const {
    const float v = __fmul_rn(acc_float(acc), s);
    return has_bias() ? __fadd_rn(v, b) : v;
  }
#if F8
  __device__ __forceinline__ float dequantize(float acc, float s, float b) const {
    const float v = __fmul_rn(acc, s);
    return has_bias() ? __fadd_rn(v, b) : v;
  }
  // two values as e4m3 bytes (lo in the low byte) from their quotients by ys: round to nearest even,
  // saturated to +-448 (NaN stays NaN)
  __device__ __forceinline__ unsigned short e4m3x2(float lo, float hi) const { return e4m3x2_cvt(lo, hi); }
  // v / ys as the IEEE division rounds it (rcp_ok): quotient of v clamped to +-512 ys (past it e4m3
  // saturates either way), NaN kept
  __device__ __forceinline__ float f8_quotient(float v) const { return quotient(clamp_nan(v, ys * 512.f)); }
#endif
  // RN(v / ys), the IEEE quotient, without the division, for rcp_ok and |v| <= 1024 ys: quotient.cuh's
  // markstein_quotient (Markstein's refinement by rys; the proof is there)
  __device__ __forceinline__ float quotient(float v) const { return markstein_quotient(v, ys, rys); }
  // saturate(rint(v / ys) + yz) as QuantizeLinear (round half to even; NaN gives 0: polykit's float ->
  // integer rule, reference cast.py), for rcp_ok: v clamped to +-1024 ys (past it every result
  // saturates, |yz| <= 255; NaN kept), its quotient (|d| <= 1025), rint by the 1.5 * 2^23 shifter (d + 1.5 * 2^23
  // rounds d to an integer, half to even, and holds it in its low mantissa bits), yz added with the
  // shifter's bits taken off (zmagic), then saturated
  __device__ __forceinline__ int requantize_rcp(float v) const { return min(max(unsaturated(v), lo), hi); }
  // requantize_rcp before the saturation: rint(v / ys) + yz (|v| clamped as there), 0 for a NaN v (which the
  // saturation keeps: lo <= 0 <= hi)
  // (Y_ZERO 0: the quotient's rint by the conversion, NaN -> 0 there; |quotient| <= 1025, so no int32 saturation)
  __device__ __forceinline__ int unsaturated(float v) const {
    if (Y_ZERO == 0) return __float2int_rn(quotient(clamp_nan(v, ys * 1024.f)));
    const float shifted = __fadd_rn(quotient(clamp_nan(v, ys * 1024.f)), 0x1.8p23f);  // NaN for a NaN v
    return shifted != shifted ? 0 : __float_as_int(shifted) + zmagic;
  }
  // the same by the IEEE division (ys outside rcp_ok's range)
  __device__ __forceinline__ int requantize_div(float v) const {
    const float d = __fdiv_rn(v, ys);
    if (d != d) return 0;
    return min(max(__float2int_rn(fminf(fmaxf(d, -1024.f), 1024.f)) + (zmagic + 0x4B400000), lo), hi);
  }
  __device__ __forceinline__ int requantize(float v) const { return rcp_ok ? requantize_rcp(v) : requantize_div(v); }
  template <class A>  // int (the INT8 sums) or float (F8)
  __device__ __forceinline__ void put(i64 oi, i64 col, i64 n, A acc) const {
    float v = dequantize(acc, scale[n * sstep()], has_bias() ? bias[n * bstep()] : 0.f);
#if HAS_EPILOGUE
    v = apply_epilogue(epi, v, oi, col);
#endif
    if (Y_OUT == 3) {
      ((half_t*)Y)[oi] = f2h(v);
      return;
    }
    if (!yint()) {
      ((float*)Y)[oi] = v;
      return;
    }
#if F8
    ((u8*)Y)[oi] = (u8)e4m3x2(rcp_ok ? f8_quotient(v) : __fdiv_rn(v, ys), 0.f);
#else
    const int q = requantize(v);
    if (yu8())
      ((u8*)Y)[oi] = (u8)q;
    else
      ((i8*)Y)[oi] = (i8)q;
#endif
  }
  // whether dequantize8 / store8 may serve (with oi, n multiples of 8): Y, a per-channel scale / bias and the
  // epilogue's inputs 16-byte aligned, an epilogue with apply_epilogue8, a float output or rcp_ok (store8
  // requantizes by quotient only; put keeps the division for a y_scale outside its range)
  __device__ __forceinline__ bool vec_ok() const {
    bool ok = ((u64)Y & 15) == 0 && (!sstep() || ((u64)scale & 15) == 0) &&
              (!has_bias() || !bstep() || ((u64)bias & 15) == 0) && (!yint() || rcp_ok);
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
      const float4 s4 = channels4(scale, n + h, sstep());
      const float4 b4 = has_bias() ? channels4(bias, n + h, bstep()) : make_float4(0.f, 0.f, 0.f, 0.f);
      s[h] = s4.x; s[h + 1] = s4.y; s[h + 2] = s4.z; s[h + 3] = s4.w;
      b[h] = b4.x; b[h + 1] = b4.y; b[h + 2] = b4.z; b[h + 3] = b4.w;
    }
  }
  // (P values: 8, or 4 where the native 64x128x2 kernel takes a row's blocks two at a time)
  template <class A, int P>
  __device__ __forceinline__ void dequantize8(const A (&acc)[P], const float (&s)[P], const float (&b)[P],
                                              float (&v)[P]) const {
#if !F8
    if (small_sums) {  // every |acc| < 2^22: the float 1.5 * 2^23 with acc added to its bits is 1.5 * 2^23 + acc (its
      // mantissa holds acc + 2^22 in [0, 2^23)), and the subtraction is exact (2 instructions, no conversion)
#pragma unroll
      for (int i = 0; i < P; ++i) {
        const float x = __fmul_rn(__fsub_rn(__int_as_float(0x4B400000 + acc[i]), 0x1.8p23f), s[i]);
        v[i] = has_bias() ? __fadd_rn(x, b[i]) : x;
      }
      return;
    }
#endif
#pragma unroll
    for (int i = 0; i < P; ++i) v[i] = dequantize(acc[i], s[i], b[i]);
  }
  __device__ __forceinline__ void store8(i64 oi, const float (&v)[8]) const {
    if (Y_OUT == 3) {  // 8 float16 values, one 16-byte store
      struct __align__(16) Halves { half_t h[8]; } q;
#pragma unroll
      for (int i = 0; i < 8; ++i) q.h[i] = f2h(v[i]);
      *(Halves*)((half_t*)Y + oi) = q;
      return;
    }
    if (!yint()) {
      float4* y = (float4*)((float*)Y + oi);
      y[0] = make_float4(v[0], v[1], v[2], v[3]);
      y[1] = make_float4(v[4], v[5], v[6], v[7]);
      return;
    }
    // (vec_ok: rcp_ok, the division-free quotient)
    *(uint2*)((u8*)Y + oi) = bytes8(v);
  }
#if F8
  // 8 values as their e4m3 bytes (v[0] in the low byte of x): the quotients by ys (rcp_ok), two at a time
  __device__ __forceinline__ uint2 bytes8(const float (&v)[8]) const {
    return make_uint2(
        e4m3x2(f8_quotient(v[0]), f8_quotient(v[1])) | (u32)e4m3x2(f8_quotient(v[2]), f8_quotient(v[3])) << 16,
        e4m3x2(f8_quotient(v[4]), f8_quotient(v[5])) | (u32)e4m3x2(f8_quotient(v[6]), f8_quotient(v[7])) << 16);
  }
  // bytes8's half (gemm_sm90_epilogue.cuh's ROW_HALVES, which F8 does not take: there for its one definition)
  __device__ __forceinline__ u32 bytes4(const float (&v)[4]) const {
    return e4m3x2(f8_quotient(v[0]), f8_quotient(v[1])) | (u32)e4m3x2(f8_quotient(v[2]), f8_quotient(v[3])) << 16;
  }
#else
  // requantize_rcp of 8 values as 8 bytes, v[0] in the low byte of x (an int8's two's-complement byte):
  // unsaturated, then saturated and packed two at a time (sat_pack)
  __device__ __forceinline__ uint2 bytes8(const float (&v)[8]) const {
    u32 w[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int q0 = unsaturated(v[4 * h]), q1 = unsaturated(v[4 * h + 1]);
      const int q2 = unsaturated(v[4 * h + 2]), q3 = unsaturated(v[4 * h + 3]);
      w[h] = sat_pack(q1, q0, sat_pack(q3, q2, 0));
    }
    return make_uint2(w[0], w[1]);
  }
  // bytes8's half: requantize_rcp of 4 values as 4 bytes, v[0] in the low byte
  __device__ __forceinline__ u32 bytes4(const float (&v)[4]) const {
    const int q0 = unsaturated(v[0]), q1 = unsaturated(v[1]), q2 = unsaturated(v[2]), q3 = unsaturated(v[3]);
    return sat_pack(q1, q0, sat_pack(q3, q2, 0));
  }
  // a and b saturated to [lo, hi] (int8 or uint8) as bytes 1 and 0, c's low 16 bits above them (PTX
  // cvt.pack.sat: one I2IP for two values, where a clamp was 2 integer min / max a value and the packing
  // ~1 PRMT)
  __device__ __forceinline__ u32 sat_pack(int a, int b, u32 c) const {
#ifdef __CUDA_ARCH__
    u32 d;
    if (yu8())
      asm("cvt.pack.sat.u8.s32.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    else
      asm("cvt.pack.sat.s8.s32.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
#else  // the host emulation of the tests
    return (u32)(u8)min(max(b, lo), hi) | (u32)(u8)min(max(a, lo), hi) << 8 | c << 16;
#endif
  }
#endif
  // the scale and bias of channels n + 8 j + c, n + 8 j + c + 1 (j = 0..3: the accumulators' layout, a
  // lane's column pair c = 2 (lane % 4) in each of 4 blocks of 8) as s[2 j], s[2 j + 1] (b alike), with
  // 8-byte loads (p + n + c 8-byte aligned); only the blocks of the `left` columns from n that exist (the
  // others left as they are). P 4: the first two blocks alone (s[0..3], b[0..3])
  template <int P>
  __device__ __forceinline__ void channel_pairs(i64 n, int c, int left, float (&s)[P], float (&b)[P]) const {
#pragma unroll
    for (int j = 0; j < P / 2; ++j) {
      if (8 * j >= left) continue;
      const float2 s2 = sstep() ? *(const float2*)(scale + n + 8 * j + c) : make_float2(scale[0], scale[0]);
      s[2 * j] = s2.x; s[2 * j + 1] = s2.y;
      if (has_bias()) {
        const float2 b2 = bstep() ? *(const float2*)(bias + n + 8 * j + c) : make_float2(bias[0], bias[0]);
        b[2 * j] = b2.x; b[2 * j + 1] = b2.y;
      }
    }
  }
};

// Out from the kernel arguments (flags: FLAG_Y_INT / FLAG_Y_U8; steps 0 per tensor, 1 per channel);
// the epilogue state is the caller's to set
__device__ __forceinline__ Out int8_out(const float* Scale, const float* Bias, const float* YScale, const u8* YZ,
                                        void* Y, int flags, int scale_step, int bias_step) {
  Out o;
  o.scale = Scale; o.bias = Bias; o.Y = Y; o.scale_step = scale_step; o.bias_step = bias_step;
  o.yint_ = flags & FLAG_Y_INT;
  o.yu8_ = flags & FLAG_Y_U8;
  o.ys = o.yint() ? YScale[0] : 1.f;
  o.rys = __frcp_rn(o.ys);
  o.rcp_ok = o.ys >= 0x1p-90f && o.ys <= 0x1p90f;
  o.small_sums = false;
  o.zmagic = (!o.yint() || Y_ZERO == 0 ? 0 : o.yu8() ? (int)YZ[0] : (int)(i8)YZ[0]) - 0x4B400000;
  o.lo = o.yu8() ? 0 : -128;
  o.hi = o.yu8() ? 255 : 127;
  return o;
}

// QuantizeLinear to float8_e4m3fn with one float32 scale, a +0 zero point and saturate 1, as the fused output
// stages store it (norm_warp.cu NW_Q8, flash_attention.cu / flash_attention_sm90.cu FLASH_Q8): the byte of
// e4m3(RN(v / ys)) rounded to nearest even and saturated to +-448, i.e. lowp.cuh's
// LowpFmt<f8e4m3fn_t>::F::encode(__fdiv_rn(v, ys), true), two values at a time and without the division:
// - the quotient (rcp_ok: ys in [2^-90, 2^90]) is int8_out.cuh's Out::quotient, Markstein's refinement by
//   rys = RN(1 / ys) (the proof is there: RN(v / ys) bit for bit for |v| <= 1024 ys, its error below 2^-59
//   where |v / ys| < 2^-11, which no e4m3 rounding is that close to), of v clamped to +-512 ys first (past
//   448 + 16 every value saturates alike; NaN kept); a scale outside that range divides (__fdiv_rn);
// - the conversion is `cvt.rn.satfinite.e4m3x2.f32` (sm_89+: two values an instruction, the same rounding,
//   saturation of +-inf and of finite values to +-448) where the target has it, lowp.cuh's software encode
//   of each value elsewhere (sm_80, and the host emulation of the tests).
// A NaN v gives a NaN byte: 0x7f from the hardware conversion, and from the software encode too on the
// division-free path (max.NaN returns the canonical NaN); the division's NaN keeps the sign the division gives it.
// tests/kernels/cuda/test_e4m3_quantize_emulated.py runs this header on the host against the division.
#pragma once
#include "lowp.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define E4M3_CVT 1  // the hardware conversion
#else
#define E4M3_CVT 0
#endif

struct E4m3Quantizer {
  float ys, rys, lim;  // the scale, RN(1 / ys), 512 ys
  bool rcp_ok;         // ys in [2^-90, 2^90]: the division-free quotient is exact
  // v clamped to [-lim, lim], a NaN kept (PTX min / max .NaN, sm_80+; one instruction each)
  __device__ __forceinline__ float clamp(float v) const {
    asm("max.NaN.f32 %0, %0, %1;" : "+f"(v) : "f"(-lim));
    asm("min.NaN.f32 %0, %0, %1;" : "+f"(v) : "f"(lim));
    return v;
  }
  // RN(v / ys) (rcp_ok, |v| <= 1024 ys): int8_out.cuh's Out::quotient, each step written -fma(-r, rys, -q) so
  // that a zero keeps v's sign
  __device__ __forceinline__ float markstein(float v) const {
    const float q0 = __fmul_rn(v, rys);
    const float q1 = -__fmaf_rn(-__fmaf_rn(-ys, q0, v), rys, -q0);
    return -__fmaf_rn(-__fmaf_rn(-ys, q1, v), rys, -q1);
  }
  // what e4m3 stores for v / ys: the quotient, or for a large |v| one that saturates the same way
  __device__ __forceinline__ float quotient(float v) const {
    return rcp_ok ? markstein(clamp(v)) : __fdiv_rn(v, ys);
  }
  // the e4m3 bytes of quotients lo, hi (lo in the low byte)
  __device__ __forceinline__ unsigned short bytes2(float lo, float hi) const {
#if E4M3_CVT
    unsigned short d;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(d) : "f"(hi), "f"(lo));
    return d;
#else
    return (unsigned short)(LowpFmt<f8e4m3fn_t>::F::encode(lo, true) |
                            (unsigned)LowpFmt<f8e4m3fn_t>::F::encode(hi, true) << 8);
#endif
  }
  // QuantizeLinear of v0, v1 as two bytes (v0 in the low one)
  __device__ __forceinline__ unsigned short pair(float v0, float v1) const {
    return bytes2(quotient(v0), quotient(v1));
  }
};

// the quantizer of scale ys (each thread once, before its loop: one reciprocal)
__device__ __forceinline__ E4m3Quantizer e4m3_quantizer(float ys) {
  E4m3Quantizer q;
  q.ys = ys;
  q.rys = __frcp_rn(ys);
  q.lim = ys * 512.f;
  q.rcp_ok = ys >= 0x1p-90f && ys <= 0x1p90f;
  return q;
}

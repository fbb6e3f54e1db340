// QuantizeLinear to float8_e4m3fn with one float32 scale, a +0 zero point and saturate 1, as the fused output
// stages store it (norm_warp.cu NW_Q8, flash_attention.cu / flash_attention_sm90.cu FLASH_Q8): the byte of
// e4m3(RN(v / ys)) rounded to nearest even and saturated to +-448, i.e. lowp.cuh's
// LowpFmt<f8e4m3fn_t>::F::encode(__fdiv_rn(v, ys), true), two values at a time and without the division:
// - the quotient (rcp_ok: ys in [2^-90, 2^90]) is quotient.cuh's markstein_quotient (int8_out.cuh's
//   Out::quotient calls it too), Markstein's refinement by rys = RN(1 / ys) (the proof is there: RN(v / ys) bit
//   for bit for |v| <= 1024 ys, its error below 2^-59 where |v / ys| < 2^-11, which no e4m3 rounding is that
//   close to), of v clamped to +-512 ys first (quotient.cuh's clamp_nan: past 448 + 16 every value saturates
//   alike; NaN kept); a scale outside that range divides (__fdiv_rn);
// - the conversion is `cvt.rn.satfinite.e4m3x2.f32` (quotient.cuh's e4m3x2_cvt; sm_89+: two values an
//   instruction, the same rounding, saturation of +-inf and of finite values to +-448) where the target has it,
//   lowp.cuh's software encode of each value elsewhere (sm_80, and the host emulation of the tests).
// A NaN v gives a NaN byte: 0x7f from the hardware conversion, and from the software encode too on the
// division-free path (max.NaN returns the canonical NaN); the division's NaN keeps the sign the division gives it.
// tests/kernels/cuda/test_e4m3_quantize_emulated.py runs this header on the host against the division.
#pragma once
#include "lowp.cuh"
// (quotient.cuh: clamp_nan, markstein_quotient, e4m3x2_cvt, E4M3_CVT 1 where the hardware conversion exists)
#include "quotient.cuh"

struct E4m3Quantizer {
  float ys, rys, lim;  // the scale, RN(1 / ys), 512 ys
  bool rcp_ok;         // ys in [2^-90, 2^90]: the division-free quotient is exact
  // v clamped to [-lim, lim], a NaN kept (quotient.cuh's clamp_nan)
  __device__ __forceinline__ float clamp(float v) const { return clamp_nan(v, lim); }
  // RN(v / ys) (rcp_ok, |v| <= 1024 ys): quotient.cuh's markstein_quotient (int8_out.cuh's Out::quotient too)
  __device__ __forceinline__ float markstein(float v) const { return markstein_quotient(v, ys, rys); }
  // what e4m3 stores for v / ys: the quotient, or for a large |v| one that saturates the same way
  __device__ __forceinline__ float quotient(float v) const {
    return rcp_ok ? markstein(clamp(v)) : __fdiv_rn(v, ys);
  }
  // the e4m3 bytes of quotients lo, hi (lo in the low byte)
  __device__ __forceinline__ unsigned short bytes2(float lo, float hi) const {
#if E4M3_CVT
    return e4m3x2_cvt(lo, hi);
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

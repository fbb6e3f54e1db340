// The division-free quotient RN(v / ys) and the e4m3 conversion that the requantizing stores share: int8_out.cuh's
// Out (the INT8 requantize: quotient, then rint by the 1.5 * 2^23 shifter; the FP8 e4m3 store: f8_quotient, then
// e4m3x2) and e4m3_quantize.cuh's E4m3Quantizer (norm_warp.cu NW_Q8, the flash kernels' FLASH_Q8). One copy of the
// arithmetic, free functions of the scale ys and its reciprocal rys = RN(1 / ys) (each caller computes rys once).
// tests/kernels/cuda/test_int8_out_emulated.py and test_e4m3_quantize_emulated.py run it on the host.
#pragma once

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define E4M3_CVT 1  // the hardware conversion (cvt.rn.satfinite.e4m3x2.f32)
#else
#define E4M3_CVT 0
#endif

// v clamped to [-m, m], a NaN kept (PTX min / max .NaN, sm_80+; one instruction each)
__device__ __forceinline__ float clamp_nan(float v, float m) {
#ifdef __CUDA_ARCH__
  asm("max.NaN.f32 %0, %0, %1;\n\tmin.NaN.f32 %0, %0, %2;" : "+f"(v) : "f"(-m), "f"(m));
  return v;
#else  // the host emulation of the tests (a NaN gives the canonical NaN, as max.NaN does)
  return v != v ? __builtin_nanf("") : fminf(fmaxf(v, -m), m);
#endif
}

// RN(v / ys), the IEEE quotient, without the division, for ys in [2^-90, 2^90] (the callers' rcp_ok), rys = RN(1 / ys)
// and |v| <= 1024 ys (Markstein's refinement; fma throughout): q0 = RN(v * rys) is within 2^-23 |v / ys| (1.5 ulps)
// of the quotient; q1 = RN(q0 + RN(v - ys q0) * rys) then within about 2^-46 |v / ys| of it, so q1 is a faithful
// rounding of v / ys (one of the two floats around it); and for a faithful q1 and rys within relative 2^-24 of
// 1 / ys, r = v - ys q1 is exact and RN(q1 + r * rys) = RN(v / ys) (Markstein's theorem), given no underflow: ys in
// [2^-90, 2^90] (rcp_ok) keeps r normal (or 0) wherever |v / ys| >= 2^-11, and below that the quotient is off by at
// most 2^-59 (no rounding of INT8's rint or of e4m3, whose smallest step is 2^-9, is that close to 0).
// |v| <= 1024 ys <= 2^100: no overflow.
// Each step is written -fma(-r, rys, -q) = fma(r, rys, q) so that a zero keeps v's sign (fma(+0, rys, -0) is +0;
// the e4m3 output has a -0).
// ys and rys by reference (the callers' members): each step reads them where it uses them, as the member functions
// this replaced did, so the kernels' PTX stays what it was (by value, NVVM orders the loads differently in kernels
// whose Out lives on the stack, e.g. int8.cu's int8_splitk_reduce and int8_conv_nhwc with an epilogue).
__device__ __forceinline__ float markstein_quotient(float v, const float& ys, const float& rys) {
  const float q0 = __fmul_rn(v, rys);
  const float q1 = -__fmaf_rn(-__fmaf_rn(-ys, q0, v), rys, -q0);
  return -__fmaf_rn(-__fmaf_rn(-ys, q1, v), rys, -q1);
}

// two quotients as e4m3 bytes (lo in the low byte): round to nearest even, saturated to +-448 (+-inf too), NaN
// stays NaN (0x7f). The PTX conversion, sm_89+ only (E4M3_CVT); e4m3_quantize.cuh falls back to lowp.cuh's software
// encode elsewhere (the FP8 GEMM / conv kernels that use int8_out.cuh's e4m3x2 are sm_90a only).
__device__ __forceinline__ unsigned short e4m3x2_cvt(float lo, float hi) {
  unsigned short d;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(d) : "f"(hi), "f"(lo));
  return d;
}

// The output side of every INT8 kernel (int8.cu on mma.sync, gemm_sm90.cu's I8 variant on wgmma):
// the exact int32 centered sum of output (m, n) -> per output channel n
//   v = float(double(acc) * scale[n] + bias[n])   (float64, rounded once: the cpu reference's arithmetic)
//   v = epilogue(v)                               (float32, epilogue.py, when HAS_EPILOGUE)
//   Y = v, or saturate(rint(v / y_scale) + y_zero_point) as int8 / uint8 (QuantizeLinear's rounding)
// Include after HAS_EPILOGUE is defined (and the epilogue prelude, when it is 1).
#pragma once
#include "dtypes.cuh"

enum { FLAG_X_U8 = 1, FLAG_W_U8 = 2, FLAG_Y_INT = 4, FLAG_Y_U8 = 8, FLAG_VEC_X = 16, FLAG_VEC_W = 32 };

// what every problem stores through: dequantize, epilogue, requantize
struct Out {
  const float *scale, *bias;
  void* Y;
  int scale_step, bias_step;
  bool yint, yu8;
  float ys, yz, lo, hi;
#if HAS_EPILOGUE
  EpiState epi;
#endif
  __device__ __forceinline__ void put(i64 oi, i64 col, i64 n, int acc) const {
    double d = __dmul_rn((double)acc, (double)scale[n * scale_step]);
    if (bias) d = __dadd_rn(d, (double)bias[n * bias_step]);
    float v = __double2float_rn(d);
#if HAS_EPILOGUE
    v = apply_epilogue(epi, v, oi, col);
#endif
    if (!yint) {
      ((float*)Y)[oi] = v;
      return;
    }
    const float q = fminf(fmaxf(rintf(__fdiv_rn(v, ys)) + yz, lo), hi);
    if (yu8)
      ((u8*)Y)[oi] = (u8)(int)q;
    else
      ((i8*)Y)[oi] = (i8)(int)q;
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
  o.yz = !o.yint ? 0.f : o.yu8 ? (float)YZ[0] : (float)(i8)YZ[0];
  o.lo = o.yu8 ? 0.f : -128.f;
  o.hi = o.yu8 ? 255.f : 127.f;
  return o;
}

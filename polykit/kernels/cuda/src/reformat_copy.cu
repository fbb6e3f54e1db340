// ai.polykit Reformat (polykit.compiler.ops.tensor.reformat): the entry or exit of a channels-last
// chain in one pass: NCHW <-> NHWC of a few-channel tensor, converting the element type (fp16 /
// fp32 / bf16, as Cast does) and, on the way in, zero-filling the channels past C. One thread per
// pixel, as reformat.cu's transposes: the warp's threads touch consecutive pixels on the planar
// side (coalesced) and each moves its pixel's channels on the packed side. 32-bit pixel indices
// (the host checks N * P < 2^31), 64-bit element offsets.
//
// reformat_in_<in>_<out>:  X [N, C, P] -> Y [N, P, Cout], Y[n, p, c] = X[n, c, p] (c < C), else 0
// reformat_out_<in>_<out>: X [N, P, C] -> Y [N, C, P]
#include "dtypes.cuh"

#define GRID_LOOP32(i, n) for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += gridDim.x * blockDim.x)

template <class Ti, class To>
__device__ __forceinline__ void reformat_in(const Ti* __restrict__ x, To* __restrict__ y, int N, int C, int P,
                                            int Cout) {
  GRID_LOOP32(i, N * P) {
    const int n = i / P, p = i - n * P;
    const Ti* src = x + (i64)n * C * P + p;
    To* dst = y + (i64)i * Cout;
    for (int c = 0; c < Cout; ++c) {
      if (c < C) st(dst, c, ld(src, (i64)c * P));
      else st(dst, c, 0.0f);
    }
  }
}

template <class Ti, class To>
__device__ __forceinline__ void reformat_out(const Ti* __restrict__ x, To* __restrict__ y, int N, int C, int P) {
  GRID_LOOP32(i, N * P) {
    const int n = i / P, p = i - n * P;
    const Ti* src = x + (i64)i * C;
    To* dst = y + (i64)n * C * P + p;
    for (int c = 0; c < C; ++c) st(dst, (i64)c * P, ld(src, c));
  }
}

#define REFORMAT_COPY(Ti, Tn, To, Tm)                                                                          \
  extern "C" __global__ void reformat_in_##Tn##_##Tm(const Ti* x, To* y, int N, int C, int P, int Cout) {     \
    reformat_in<Ti, To>(x, y, N, C, P, Cout);                                                                 \
  }                                                                                                           \
  extern "C" __global__ void reformat_out_##Tn##_##Tm(const Ti* x, To* y, int N, int C, int P) {              \
    reformat_out<Ti, To>(x, y, N, C, P);                                                                      \
  }
#define REFORMAT_FROM(Ti, Tn)            \
  REFORMAT_COPY(Ti, Tn, half_t, f16)     \
  REFORMAT_COPY(Ti, Tn, float, f32)      \
  REFORMAT_COPY(Ti, Tn, bf16_t, bf16)
REFORMAT_FROM(half_t, f16)
REFORMAT_FROM(float, f32)
REFORMAT_FROM(bf16_t, bf16)

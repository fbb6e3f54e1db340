// ai.polykit Reformat (polykit.compiler.ops.tensor.reformat): the entry or exit of a channels-last
// chain in one pass: NCHW <-> NHWC of a few-channel tensor, converting the element type (fp16 /
// fp32 / bf16, as Cast does) and, on the way in, zero-filling the channels past C. One thread per
// pixel, as reformat.cu's transposes: the warp's threads touch consecutive pixels on the planar
// side (coalesced) and each moves its pixel's channels on the packed side. 32-bit pixel indices
// (the host checks N * P < 2^31), 64-bit element offsets.
//
// reformat_in_<in>_<out>:  X [N, C, P] -> Y [N, P, Cout], Y[n, p, c] = X[n, c, p] (c < C), else 0
// reformat_in_chunks_<in>_<out>: the same with one thread per W-byte chunk of an output pixel (W = 4,
//            8 or 16, a divisor of the pixel's bytes, y aligned to W), built in registers and stored
//            once: a padded fp16 stem pixel (3 -> 8 channels) is one 16-byte store (as pad_chunks in
//            reformat.cu: element stores ran 7x slower there). grid-stride over N * P * Cout / V.
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

template <class E, int V> struct alignas(sizeof(E) * V) PixelChunk { E e[V]; };

template <class Ti, class To, int V>
__device__ __forceinline__ void reformat_in_chunks(const Ti* __restrict__ x, To* __restrict__ y, int N, int C, int P,
                                                   int Cout) {
  const int per_pixel = Cout / V;
  GRID_LOOP32(k, N * P * per_pixel) {
    const int i = k / per_pixel, c0 = (k - i * per_pixel) * V;
    const int n = i / P, p = i - n * P;
    const Ti* src = x + (i64)n * C * P + p;
    PixelChunk<To, V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int c = c0 + j;
      st(out.e, j, c < C ? ld(src, (i64)c * P) : typename Compute<Ti>::type(0));
    }
    *(PixelChunk<To, V>*)(y + (i64)k * V) = out;
  }
}

// reformat_in_chunks with W bytes a chunk (a runtime choice among the widths To divides)
template <class Ti, class To>
__device__ __forceinline__ void reformat_in_chunks_w(const Ti* x, To* y, int N, int C, int P, int Cout, int W) {
  if constexpr (sizeof(To) <= 2) {
    if (W == 4) { reformat_in_chunks<Ti, To, 4 / sizeof(To)>(x, y, N, C, P, Cout); return; }
  }
  if (W == 8) reformat_in_chunks<Ti, To, 8 / sizeof(To)>(x, y, N, C, P, Cout);
  else reformat_in_chunks<Ti, To, 16 / sizeof(To)>(x, y, N, C, P, Cout);
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
  extern "C" __global__ void reformat_in_chunks_##Tn##_##Tm(const Ti* x, To* y, int N, int C, int P, int Cout, \
                                                            int W) {                                          \
    reformat_in_chunks_w<Ti, To>(x, y, N, C, P, Cout, W);                                                     \
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

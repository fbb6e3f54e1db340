// LRN (local response normalization across channels) on an (N, C, ...) tensor:
//   y = x / (bias + alpha / size * sum_{c' in window(c)} x[c']^2) ^ beta,
//   window(c) = [c - (size-1)/2, c + size-1 - (size-1)/2] clipped to [0, C).
// One thread per output element (1-D grid-stride, block 256); consecutive threads take
// consecutive spatial positions of one channel, so every load of the window is coalesced.
// Computed in float for fp16/fp32 (double for fp64), stored rounded to the element type.
#include "dtypes.cuh"

template <class E, class C>
__device__ void lrn(const E* __restrict__ x, E* __restrict__ y, i64 n, i64 channels, i64 spatial, i64 size,
                    C alpha, C beta, C bias) {
  const i64 before = (size - 1) / 2, after = size - 1 - before;
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
    const i64 s = i % spatial, c = (i / spatial) % channels, base = i - (c * spatial + s) + s;
    const i64 lo = c - before < 0 ? 0 : c - before, hi = c + after >= channels ? channels - 1 : c + after;
    C sum = 0;
    for (i64 k = lo; k <= hi; ++k) {
      const C v = ld(x, base + k * spatial);
      sum += v * v;
    }
    st(y, i, ld(x, i) / pow(bias + alpha / (C)size * sum, beta));
  }
}

#define LRN(E, C, code)                                                                                   \
  extern "C" __global__ void __launch_bounds__(256) lrn_##code(const E* x, E* y, i64 n, i64 channels,    \
                                                               i64 spatial, i64 size, C alpha, C beta,    \
                                                               C bias) {                                  \
    lrn<E, C>(x, y, n, channels, spatial, size, alpha, beta, bias);                                       \
  }
LRN(float, float, f32)
LRN(half_t, float, f16)
LRN(double, double, f64)

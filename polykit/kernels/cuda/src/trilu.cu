// Trilu: keep the upper (upper != 0: col - row >= k) or lower (col - row <= k) triangle of
// the last two dims [N, M] of a contiguous tensor, zero elsewhere. The kernels move raw
// element bits (1/2/4/8 bytes), so one entry point serves every dtype of that size (zero
// is all-zero bits for all of them). k is read on the device from the optional int64
// input (k_ptr == 0: k = 0), so plans need no host copy of it.
// Geometry: one thread per element, grid-stride, blockDim.x = 256.
#include "dtypes.cuh"

template <class E>
__device__ void trilu_impl(const E* __restrict__ x, E* __restrict__ y, const i64* k_ptr, i64 n, i64 N, i64 M,
                           i64 upper) {
  const i64 k = k_ptr ? *k_ptr : 0;
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
    const i64 q = i / M, col = i - q * M, row = q % N;
    const bool keep = upper ? col - row >= k : col - row <= k;
    y[i] = keep ? x[i] : (E)0;
  }
}

#define TRILU(E, bytes) \
  extern "C" __global__ void trilu_##bytes(const E* x, E* y, const i64* k, i64 n, i64 N, i64 M, i64 upper) { \
    trilu_impl<E>(x, y, k, n, N, M, upper);                                                                 \
  }

TRILU(u8, b1)
TRILU(u16, b2)
TRILU(u32, b4)
TRILU(u64, b8)

// TopK along one axis of a contiguous tensor viewed as [outer, R, inner]; rows = outer * inner.
//
// Order (the reference's): largest -> descending values, smallest -> ascending; equal values
// keep ascending index order; NaN counts as the largest value (numpy's sort order). Outputs
// are always sorted (sorted=0 allows any order, so sorted output is valid for it too).
// values y and int64 indices ind are [outer, K, inner].
//
// topk_shared_<T>: one block per row (grid-stride), the row padded to P = 2^p >= R elements
//   (padding sorts last) and bitonic-sorted in dynamic shared memory: P * (sizeof(C) + 4)
//   bytes, P <= 4096 (<= 48 KiB). blockDim.x = min(max(P/2, 32), 512); threads loop over the
//   P/2 compare-exchange pairs of each step.
// topk_init_<T> / topk_step_<T> / topk_emit_<T>: the same bitonic network in global memory
//   (workspace: rows * P keys and int32 indices) for rows longer than 4096: init pads and
//   copies (thread per element), one step launch per (size, stride) stage (thread per pair),
//   emit writes the first K of each row. Simple and exact; O(P log^2 P) per row.
#include "dtypes.cuh"

template <class C>
__device__ __forceinline__ bool tk_before(C va, int ia, C vb, int ib, int largest) {
  if (ia < 0) return false;  // padding sorts last
  if (ib < 0) return true;
  const bool an = va != va, bn = vb != vb;
  if (an || bn) return (an && bn) ? ia < ib : (largest ? an : bn);
  if (va == vb) return ia < ib;
  return largest ? va > vb : va < vb;
}

// compare-exchange of pair t at stage (size, stride) of a bitonic sort in `keys`/`ids`
template <class C>
__device__ __forceinline__ void tk_exchange(C* keys, int* ids, i64 t, i64 size, i64 stride, int largest) {
  const i64 i = 2 * t - (t & (stride - 1)), l = i + stride;
  const bool up = (i & size) == 0;
  const C ki = keys[i], kl = keys[l];
  const int ii = ids[i], il = ids[l];
  if (up ? tk_before(kl, il, ki, ii, largest) : tk_before(ki, ii, kl, il, largest)) {
    keys[i] = kl; keys[l] = ki;
    ids[i] = il; ids[l] = ii;
  }
}

template <class T>
__device__ void topk_shared(const T* __restrict__ x, T* __restrict__ y, i64* __restrict__ ind, i64 rows,
                            i64 R, i64 inner, i64 K, i64 P, i64 largest) {
  typedef typename Compute<T>::type C;
  extern __shared__ __align__(16) unsigned char tk_smem[];
  C* keys = (C*)tk_smem;
  int* ids = (int*)(tk_smem + P * sizeof(C));
  for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {
    const i64 o = row / inner, in = row - o * inner;
    const i64 src = o * R * inner + in, dst = o * K * inner + in;
    for (i64 j = threadIdx.x; j < P; j += blockDim.x) {
      keys[j] = j < R ? ld(x, src + j * inner) : (C)0;
      ids[j] = j < R ? (int)j : -1;
    }
    __syncthreads();
    for (i64 size = 2; size <= P; size <<= 1)
      for (i64 stride = size >> 1; stride > 0; stride >>= 1) {
        for (i64 t = threadIdx.x; t < P / 2; t += blockDim.x) tk_exchange(keys, ids, t, size, stride, (int)largest);
        __syncthreads();
      }
    for (i64 j = threadIdx.x; j < K; j += blockDim.x) {
      st(y, dst + j * inner, keys[j]);
      ind[dst + j * inner] = ids[j];
    }
    __syncthreads();
  }
}

template <class T>
__device__ void topk_init(const T* __restrict__ x, typename Compute<T>::type* keys, int* ids, i64 rows, i64 R,
                          i64 inner, i64 P) {
  typedef typename Compute<T>::type C;
  const i64 n = rows * P;
  for (i64 e = blockIdx.x * (i64)blockDim.x + threadIdx.x; e < n; e += (i64)gridDim.x * blockDim.x) {
    const i64 row = e / P, j = e - row * P;
    const i64 o = row / inner, in = row - o * inner;
    keys[e] = j < R ? ld(x, o * R * inner + in + j * inner) : (C)0;
    ids[e] = j < R ? (int)j : -1;
  }
}

template <class T>
__device__ void topk_step(typename Compute<T>::type* keys, int* ids, i64 rows, i64 P, i64 size, i64 stride,
                          i64 largest) {
  const i64 half = P / 2, n = rows * half;
  for (i64 e = blockIdx.x * (i64)blockDim.x + threadIdx.x; e < n; e += (i64)gridDim.x * blockDim.x) {
    const i64 row = e / half, t = e - row * half;
    tk_exchange(keys + row * P, ids + row * P, t, size, stride, (int)largest);
  }
}

template <class T>
__device__ void topk_emit(const typename Compute<T>::type* keys, const int* ids, T* __restrict__ y,
                          i64* __restrict__ ind, i64 rows, i64 inner, i64 K, i64 P) {
  const i64 n = rows * K;
  for (i64 e = blockIdx.x * (i64)blockDim.x + threadIdx.x; e < n; e += (i64)gridDim.x * blockDim.x) {
    const i64 row = e / K, j = e - row * K;
    const i64 o = row / inner, in = row - o * inner;
    const i64 dst = o * K * inner + in + j * inner;
    st(y, dst, keys[row * P + j]);
    ind[dst] = ids[row * P + j];
  }
}

#define TOPK(T, code)                                                                                      \
  extern "C" __global__ void topk_shared_##code(const T* x, T* y, i64* ind, i64 rows, i64 R, i64 inner,  \
                                                i64 K, i64 P, i64 largest) {                               \
    topk_shared<T>(x, y, ind, rows, R, inner, K, P, largest);                                              \
  }                                                                                                        \
  extern "C" __global__ void topk_init_##code(const T* x, Compute<T>::type* keys, int* ids, i64 rows,      \
                                              i64 R, i64 inner, i64 P) {                                   \
    topk_init<T>(x, keys, ids, rows, R, inner, P);                                                         \
  }                                                                                                        \
  extern "C" __global__ void topk_step_##code(Compute<T>::type* keys, int* ids, i64 rows, i64 P, i64 size, \
                                              i64 stride, i64 largest) {                                   \
    topk_step<T>(keys, ids, rows, P, size, stride, largest);                                               \
  }                                                                                                        \
  extern "C" __global__ void topk_emit_##code(const Compute<T>::type* keys, const int* ids, T* y, i64* ind, \
                                              i64 rows, i64 inner, i64 K, i64 P) {                         \
    topk_emit<T>(keys, ids, y, ind, rows, inner, K, P);                                                    \
  }

TOPK(float, f32)
TOPK(half_t, f16)
TOPK(double, f64)
TOPK(i32, i32)
TOPK(i64, i64)
TOPK(u64, u64)
TOPK(u32, u32)
TOPK(i16, i16)
TOPK(u16, u16)
TOPK(i8, i8)
TOPK(u8, u8)

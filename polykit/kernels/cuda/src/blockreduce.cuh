// Deterministic block-level reductions: warp shuffles in a fixed butterfly order, then one
// warp over the per-warp partials in shared memory. No atomics: the same inputs and launch
// geometry always give the same bits. blockDim.x must be a multiple of 32 (<= 1024).
#pragma once
#include "dtypes.cuh"

struct OpSum { template <class T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; } };
struct OpProd { template <class T> __device__ __forceinline__ T operator()(T a, T b) const { return a * b; } };
struct OpMax {
  template <class T> __device__ __forceinline__ T operator()(T a, T b) const { return (a != a || a > b) ? a : b; }
};
struct OpMin {
  template <class T> __device__ __forceinline__ T operator()(T a, T b) const { return (a != a || a < b) ? a : b; }
};

template <class T> __device__ __forceinline__ T shfl_xor(T v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }

// reduce `v` over the block; every thread gets the result. `smem` holds >= 32 T.
template <class T, class Op>
__device__ __forceinline__ T block_reduce(T v, Op op, T identity, T* smem) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v = op(v, shfl_xor(v, m));
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  __syncthreads();
  if (lane == 0) smem[wid] = v;
  __syncthreads();
  if (wid == 0) {
    v = lane < nw ? smem[lane] : identity;
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) v = op(v, shfl_xor(v, m));
    if (lane == 0) smem[0] = v;
  }
  __syncthreads();
  return smem[0];
}

// v[0] + v[1] + ... + v[n-1], one addition at a time in index order, each rounded to storage
// type T (numpy's order for bfloat16, SumRoundsEachStep): thread 0 adds, every thread gets it
template <class T, class A>
__device__ __forceinline__ A serial_sum_as(const A* v, i64 n, A* smem) {
  __syncthreads();
  if (threadIdx.x == 0) {
    A s = 0;
    for (i64 j = 0; j < n; ++j) s = round_as<T>(s + v[j]);
    smem[0] = s;
  }
  __syncthreads();
  const A s = smem[0];
  __syncthreads();
  return s;
}

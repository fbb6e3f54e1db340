// load8(x, p): 8 consecutive elements of 1, 2 or 4 bytes from p (aligned to 8 * sizeof(T) or 16
// bytes, whichever is less) with one 8- or 16-byte load, or two 16-byte loads. The 16-byte
// epilogues (epilogue.py's apply_epilogue8) read their inputs with it.
#pragma once
#include "dtypes.cuh"

template <class T> __device__ __forceinline__ void load8(T (&x)[8], const T* p) {
  static_assert(sizeof(T) == 1 || sizeof(T) == 2 || sizeof(T) == 4, "load8 takes 1-, 2- or 4-byte elements");
  if constexpr (sizeof(T) == 1) {
    *(uint2*)x = *(const uint2*)p;
  } else if constexpr (sizeof(T) == 2) {
    *(uint4*)x = *(const uint4*)p;
  } else {
    ((uint4*)x)[0] = ((const uint4*)p)[0];
    ((uint4*)x)[1] = ((const uint4*)p)[1];
  }
}

// prefetch_span(p, bytes): bring the 128-byte lines of [p, p + bytes) into L2 (prefetch.global.L2:
// no register is written, nothing waits on it). The sm90 epilogues issue it for a tile's residual
// rows before the tile's K loop (gemm_sm90_epilogue.cuh's prefetch_tile), so the epilogue's loads,
// which cannot pass the stores before them, find their lines in L2 instead of waiting on DRAM.
__device__ __forceinline__ void prefetch_line(const void* p) {
#ifdef __CUDA_ARCH__
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#else
  (void)p;
#endif
}
__device__ __forceinline__ void prefetch_span(const void* p, i64 bytes) {
  if (bytes <= 0) return;
  const char* c = static_cast<const char*>(p);
  for (i64 b = 0; b < bytes; b += 128) prefetch_line(c + b);
  prefetch_line(c + bytes - 1);  // the last line, which the steps miss when p is not on a line boundary
}

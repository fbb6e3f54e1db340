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

// Gather and GatherElements by element size; indices int32 or int64 (is64), negative
// indices wrap, out-of-range indices are clamped (the device cannot raise; the reference
// rejects them, so tests never feed them).
//
// gather: data viewed as [outer, axis_dim, inner], indices flat [m]; output [outer, m, inner];
//   one thread per output element, output written contiguously; consecutive threads read
//   consecutive inner elements of one gathered row (coalesced for embedding lookups).
// concat_gather: ai.polykit ConcatGather, a gather of the concatenation of up to 4 sources along
//   the axis without the concatenation: source s viewed as [outer, e_s, inner] (e_s = 0 for an
//   absent one), int64 indices flat [m] into the e_0 + ... + e_3 positions; output [outer, m, inner],
//   one thread per output element as gather.
// concat_gather_table: the same gather with 32-bit index math (the host checks every size is below
//   2^30) and each output position's (source s, offset k) found once per block: the block first
//   writes a shared table of m entries k * 4 + s (dynamic shared memory, 4 * m bytes), then
//   - inner == 1 (a gather along the last axis: the channels-last shuffle): rows of m. Thread t
//     owns columns j = t % m (+ blockDim, ... when m > blockDim) of rows t / m + P * r, P =
//     blockDim / m rows a pass (1 when m >= blockDim; threads t >= P * m idle): a column's source
//     pointer once, then per element one multiply-add and the copy, no division;
//   - inner > 1: one thread per output element, two 32-bit divisions and a table read.
//   grid-stride over rows (inner == 1) or elements, CG_UNROLL strides loaded before they are
//   stored; a few blocks an SM, each building its table once.
// gather_elements: output has the indices' shape (dims d0..d7); the data offset is the output
//   coordinate with the axis coordinate replaced by the index.
#include "dtypes.cuh"

#define STR8(p) i64 p##0, i64 p##1, i64 p##2, i64 p##3, i64 p##4, i64 p##5, i64 p##6, i64 p##7
#define ARR8(name, p) const i64 name[8] = {p##0, p##1, p##2, p##3, p##4, p##5, p##6, p##7}
#define GRID_LOOP(i, n) for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

__device__ __forceinline__ i64 fix_index(i64 k, i64 dim) {
  if (k < 0) k += dim;
  return k < 0 ? 0 : (k >= dim ? dim - 1 : k);
}

template <class E>
__device__ void gather(const E* __restrict__ data, const void* __restrict__ idx, E* __restrict__ out, i64 is64,
                       i64 outer, i64 dim, i64 m, i64 inner) {
  GRID_LOOP(i, outer * m * inner) {
    const i64 in_ = i % inner, t = i / inner, j = t % m, o = t / m;
    const i64 k = fix_index(is64 ? ((const i64*)idx)[j] : (i64)((const i32*)idx)[j], dim);
    out[i] = data[(o * dim + k) * inner + in_];
  }
}

template <class E>
__device__ void gather_elements(const E* __restrict__ data, const void* __restrict__ idx, E* __restrict__ out,
                                i64 is64, i64 n, i64 rank, i64 axis, const i64* idims, const i64* ddims) {
  i64 dst[8];
  i64 acc = 1;
  for (int d = (int)rank - 1; d >= 0; --d) { dst[d] = acc; acc *= ddims[d]; }
  GRID_LOOP(i, n) {
    i64 r = i, off = 0;
    const i64 k = fix_index(is64 ? ((const i64*)idx)[i] : (i64)((const i32*)idx)[i], ddims[axis]);
    for (int d = (int)rank - 1; d >= 0; --d) {
      i64 q = d ? r / idims[d] : 0, c = r - q * idims[d];
      off += (d == axis ? k : c) * dst[d];
      r = q;
    }
    out[i] = data[off];
  }
}

template <class E>
__device__ void concat_gather(const i64* __restrict__ idx, E* __restrict__ out, i64 outer, i64 m, i64 inner,
                              const E* x0, const E* x1, const E* x2, const E* x3, i64 e0, i64 e1, i64 e2, i64 e3) {
  const E* src[4] = {x0, x1, x2, x3};
  const i64 ext[4] = {e0, e1, e2, e3};
  const i64 dim = e0 + e1 + e2 + e3;
  GRID_LOOP(i, outer * m * inner) {
    const i64 in_ = i % inner, t = i / inner, j = t % m, o = t / m;
    i64 k = fix_index(idx[j], dim);
    int s = 0;
    while (s < 3 && k >= ext[s]) k -= ext[s++];
    out[i] = src[s][(o * ext[s] + k) * inner + in_];
  }
}

template <class E>
__device__ __forceinline__ const E* cg_pick(int s, const E* x0, const E* x1, const E* x2, const E* x3) {
  return s == 0 ? x0 : (s == 1 ? x1 : (s == 2 ? x2 : x3));
}
__device__ __forceinline__ int cg_extent(int s, int e0, int e1, int e2, int e3) {
  return s == 0 ? e0 : (s == 1 ? e1 : (s == 2 ? e2 : e3));
}

#define CG_UNROLL 4  // elements a thread loads before it stores them (bytes in flight)

template <class E>
__device__ void concat_gather_table(const i64* __restrict__ idx, E* __restrict__ out, int outer, int m, int inner,
                                    const E* x0, const E* x1, const E* x2, const E* x3, int e0, int e1, int e2,
                                    int e3) {
  extern __shared__ __align__(16) unsigned char cg_smem[];
  int* cg_table = (int*)cg_smem;
  for (int j = threadIdx.x; j < m; j += blockDim.x) {
    int k = (int)fix_index(idx[j], (i64)e0 + e1 + e2 + e3), s = 0;
    if (k >= e0) {
      k -= e0, s = 1;
      if (k >= e1) {
        k -= e1, s = 2;
        if (k >= e2) k -= e2, s = 3;
      }
    }
    cg_table[j] = k * 4 + s;
  }
  __syncthreads();
  if (inner == 1) {
    const int P = m < (int)blockDim.x ? (int)blockDim.x / m : 1;
    const int r0 = (int)threadIdx.x / m;
    if (r0 >= P) return;
    const int stride = (int)gridDim.x * P;
    for (int j = (int)threadIdx.x - r0 * m; j < m; j += blockDim.x) {
      const int t = cg_table[j], s = t & 3, ext = cg_extent(s, e0, e1, e2, e3);
      const E* src = cg_pick(s, x0, x1, x2, x3) + (t >> 2);
      for (int row = (int)blockIdx.x * P + r0; row < outer; row += CG_UNROLL * stride) {
        E v[CG_UNROLL];
#pragma unroll
        for (int u = 0; u < CG_UNROLL; ++u)
          if (row + u * stride < outer) v[u] = src[(row + u * stride) * ext];
#pragma unroll
        for (int u = 0; u < CG_UNROLL; ++u)
          if (row + u * stride < outer) out[(row + u * stride) * m + j] = v[u];
      }
    }
    return;
  }
  const int n = outer * m * inner, stride = (int)(gridDim.x * blockDim.x);
  for (int i0 = (int)(blockIdx.x * blockDim.x + threadIdx.x); i0 < n; i0 += CG_UNROLL * stride) {
    E v[CG_UNROLL];
#pragma unroll
    for (int u = 0; u < CG_UNROLL; ++u) {
      const int i = i0 + u * stride;
      if (i < n) {
        const int r = i / inner, in_ = i - r * inner, o = r / m, j = r - o * m;
        const int t = cg_table[j], s = t & 3;
        v[u] = cg_pick(s, x0, x1, x2, x3)[(o * cg_extent(s, e0, e1, e2, e3) + (t >> 2)) * inner + in_];
      }
    }
#pragma unroll
    for (int u = 0; u < CG_UNROLL; ++u)
      if (i0 + u * stride < n) out[i0 + u * stride] = v[u];
  }
}

#define CG_TABLE_PARAMS(E)                                                                                       \
  const i64 *idx, E *out, int outer, int m, int inner, const E *x0, const E *x1, const E *x2, const E *x3, int e0, \
      int e1, int e2, int e3
#define CG_TABLE_ARGS idx, out, outer, m, inner, x0, x1, x2, x3, e0, e1, e2, e3

#define GATHER(E, code)                                                                                        \
  extern "C" __global__ void gather_##code(const E* data, const void* idx, E* out, i64 is64, i64 outer, i64 dim, \
                                           i64 m, i64 inner) {                                                   \
    gather<E>(data, idx, out, is64, outer, dim, m, inner);                                                      \
  }                                                                                                             \
  extern "C" __global__ void gather_elements_##code(const E* data, const void* idx, E* out, i64 is64, i64 n,    \
                                                    i64 rank, i64 axis, STR8(a), STR8(b)) {                     \
    ARR8(idims, a); ARR8(ddims, b);                                                                             \
    gather_elements<E>(data, idx, out, is64, n, rank, axis, idims, ddims);                                      \
  }                                                                                                             \
  extern "C" __global__ void concat_gather_##code(const i64* idx, E* out, i64 outer, i64 m, i64 inner,          \
                                                  const E* x0, const E* x1, const E* x2, const E* x3, i64 e0,   \
                                                  i64 e1, i64 e2, i64 e3) {                                     \
    concat_gather<E>(idx, out, outer, m, inner, x0, x1, x2, x3, e0, e1, e2, e3);                                \
  }                                                                                                             \
  extern "C" __global__ void concat_gather_table_##code(CG_TABLE_PARAMS(E)) {                                   \
    concat_gather_table<E>(CG_TABLE_ARGS);                                                                      \
  }
GATHER(u8, 1)
GATHER(u16, 2)
GATHER(u32, 4)
GATHER(u64, 8)

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
  }
GATHER(u8, 1)
GATHER(u16, 2)
GATHER(u32, 4)
GATHER(u64, 8)

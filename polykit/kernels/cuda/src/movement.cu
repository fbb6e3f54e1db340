// Data movement with no arithmetic, by element size (the dtype does not matter): one thread
// per output element (grid-stride), output written contiguously (coalesced), source read
// through strides. `E` is the element type: u8/u16/u32/u64 for 1/2/4/8-byte elements and
// Vec16 for contiguous copies moved 16 bytes at a time.
//
// copy_strided: dst[dst_base + sum c_d*dst_st_d] = src[src_base + sum c_d*src_st_d] over dims
//   d0..d7 (rank used, innermost last). Transpose (permuted strides), Expand (0 strides),
//   Concat/Split (sub-boxes through bases), DepthToSpace/SpaceToDepth (6-D views),
//   Reshape-family copies (rank 1).
// slice: output coordinate c on axis a reads start_a + c*step_a; starts/axes/steps are the
//   op's int32/int64 inputs read on the device (ONNX clamping), ends follow from the output shape.
// pad: constant/reflect/edge/wrap; pads (+ optional axes) read on the device; constant value
//   from an optional device scalar.
// tile: input coordinate = output coordinate mod input dim.
// transpose_tiled: see below (shared-memory tiles when the output's inner dim is strided in the source).
#include "dtypes.cuh"

struct __align__(16) Vec16 { u32 v[4]; };

#define STR8(p) i64 p##0, i64 p##1, i64 p##2, i64 p##3, i64 p##4, i64 p##5, i64 p##6, i64 p##7
#define ARR8(name, p) const i64 name[8] = {p##0, p##1, p##2, p##3, p##4, p##5, p##6, p##7}
#define GRID_LOOP(i, n) for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

__device__ __forceinline__ i64 rd_index(const void* p, i64 k, i64 is64) {
  return is64 ? ((const i64*)p)[k] : (i64)((const i32*)p)[k];
}

template <class E>
__device__ void copy_strided(const E* __restrict__ src, E* __restrict__ dst, i64 n, i64 rank, const i64* dims,
                             const i64* sst, const i64* dst_st, i64 src_base, i64 dst_base) {
  GRID_LOOP(i, n) {
    i64 r = i, so = src_base, doff = dst_base;
    for (int d = (int)rank - 1; d >= 0; --d) {
      i64 q = d ? r / dims[d] : 0, c = r - q * dims[d];
      so += c * sst[d];
      doff += c * dst_st[d];
      r = q;
    }
    dst[doff] = src[so];
  }
}

// transpose_tiled: the copy's innermost output dim `b` is strided in the source while source
// dim `a` is contiguous: 32x32 tiles through shared memory (+1 column against bank conflicts)
// so both the loads (along a) and the stores (along b) are coalesced. Block (32, 8); grid.x
// walks tiles of (a, b), grid.y (grid-stride) the remaining batch dims (<= 6).
template <class E>
__device__ void transpose_tiled(const E* __restrict__ src, E* __restrict__ dst, i64 nbatch, i64 nbd,
                                const i64* bd, const i64* bs, const i64* bt, i64 A, i64 B, i64 sb, i64 ta) {
  __shared__ E tile[32][33];
  const i64 tiles_a = (A + 31) / 32;
  const i64 a0 = (blockIdx.x % tiles_a) * 32, b0 = (blockIdx.x / tiles_a) * 32;
  for (i64 bi = blockIdx.y; bi < nbatch; bi += gridDim.y) {
    i64 r = bi, so = 0, to = 0;
    for (int d = (int)nbd - 1; d >= 0; --d) {
      const i64 q = d ? r / bd[d] : 0, c = r - q * bd[d];
      so += c * bs[d];
      to += c * bt[d];
      r = q;
    }
    __syncthreads();
    for (int k = threadIdx.y; k < 32; k += 8) {
      const i64 a = a0 + threadIdx.x, b = b0 + k;
      if (a < A && b < B) tile[k][threadIdx.x] = src[so + a + b * sb];
    }
    __syncthreads();
    for (int k = threadIdx.y; k < 32; k += 8) {
      const i64 b = b0 + threadIdx.x, a = a0 + k;
      if (a < A && b < B) dst[to + b + a * ta] = tile[threadIdx.x][k];
    }
  }
}

// per-axis start and step of a Slice, from its device inputs (ONNX semantics)
__device__ void slice_params(i64 rank, const i64* in_dims, const void* starts, i64 n_starts, const void* axes,
                             const void* steps, i64 is64, i64* start, i64* step) {
  for (int d = 0; d < 8; ++d) { start[d] = 0; step[d] = 1; }
  for (i64 k = 0; k < n_starts; ++k) {
    i64 a = axes ? rd_index(axes, k, is64) : k;
    if (a < 0) a += rank;
    i64 st = steps ? rd_index(steps, k, is64) : 1, s = rd_index(starts, k, is64), dim = in_dims[a];
    if (s < 0) s += dim;
    if (st > 0) s = s < 0 ? 0 : (s > dim ? dim : s);
    else s = s < 0 ? 0 : (s > dim - 1 ? dim - 1 : s);
    start[a] = s;
    step[a] = st;
  }
}

template <class E>
__device__ void slice(const E* __restrict__ src, E* __restrict__ dst, i64 n, i64 rank, const i64* in_dims,
                      const i64* out_dims, const void* starts, i64 n_starts, const void* axes, const void* steps,
                      i64 is64) {
  i64 start[8], step[8], st[8];
  slice_params(rank, in_dims, starts, n_starts, axes, steps, is64, start, step);
  i64 acc = 1;
  for (int d = (int)rank - 1; d >= 0; --d) { st[d] = acc; acc *= in_dims[d]; }
  GRID_LOOP(i, n) {
    i64 r = i, so = 0;
    for (int d = (int)rank - 1; d >= 0; --d) {
      i64 q = d ? r / out_dims[d] : 0, c = r - q * out_dims[d];
      so += (start[d] + c * step[d]) * st[d];
      r = q;
    }
    dst[i] = src[so];
  }
}

// mode: 0 constant, 1 reflect, 2 edge, 3 wrap
template <class E>
__device__ void pad(const E* __restrict__ src, E* __restrict__ dst, const E* cval, i64 n, i64 rank,
                    const i64* in_dims, const i64* out_dims, const void* pads, i64 n_axes, const void* axes,
                    i64 is64, i64 mode) {
  i64 begin[8], st[8];
  for (int d = 0; d < 8; ++d) begin[d] = 0;
  for (i64 k = 0; k < n_axes; ++k) {
    i64 a = axes ? rd_index(axes, k, is64) : k;
    if (a < 0) a += rank;
    begin[a] = rd_index(pads, k, 1);
  }
  i64 acc = 1;
  for (int d = (int)rank - 1; d >= 0; --d) { st[d] = acc; acc *= in_dims[d]; }
  E fill;
  if (cval) fill = *cval; else { unsigned char* b = (unsigned char*)&fill; for (int k = 0; k < (int)sizeof(E); ++k) b[k] = 0; }
  GRID_LOOP(i, n) {
    i64 r = i, so = 0;
    bool outside = false;
    for (int d = (int)rank - 1; d >= 0; --d) {
      i64 q = d ? r / out_dims[d] : 0, c = r - q * out_dims[d] - begin[d], m = in_dims[d];
      r = q;
      if (c < 0 || c >= m) {
        if (mode == 0) { outside = true; continue; }
        if (mode == 2) c = c < 0 ? 0 : m - 1;
        else if (mode == 3) { c %= m; if (c < 0) c += m; }
        else if (m == 1) c = 0;
        else { i64 p = 2 * (m - 1); c %= p; if (c < 0) c += p; if (c >= m) c = p - c; }
      }
      so += c * st[d];
    }
    dst[i] = outside ? fill : src[so];
  }
}

template <class E>
__device__ void tile(const E* __restrict__ src, E* __restrict__ dst, i64 n, i64 rank, const i64* in_dims,
                     const i64* out_dims) {
  GRID_LOOP(i, n) {
    i64 r = i, so = 0, acc = 1;
    for (int d = (int)rank - 1; d >= 0; --d) {
      i64 q = d ? r / out_dims[d] : 0, c = r - q * out_dims[d];
      so += (c % in_dims[d]) * acc;
      acc *= in_dims[d];
      r = q;
    }
    dst[i] = src[so];
  }
}

#define MOVE(E, code)                                                                                             \
  extern "C" __global__ void copy_strided_##code(const E* src, E* dst, i64 n, i64 rank, STR8(d), STR8(s), STR8(t), \
                                                 i64 src_base, i64 dst_base) {                                    \
    ARR8(dims, d); ARR8(ss, s); ARR8(ts, t);                                                                      \
    copy_strided<E>(src, dst, n, rank, dims, ss, ts, src_base, dst_base);                                         \
  }                                                                                                               \
  extern "C" __global__ void transpose_tiled_##code(const E* src, E* dst, i64 nbatch, i64 nbd, STR8(d), STR8(s),  \
                                                    STR8(t), i64 A, i64 B, i64 sb, i64 ta) {                      \
    ARR8(bd, d); ARR8(bs, s); ARR8(bt, t);                                                                        \
    transpose_tiled<E>(src, dst, nbatch, nbd, bd, bs, bt, A, B, sb, ta);                                          \
  }
#define SHAPED(E, code)                                                                                           \
  extern "C" __global__ void slice_##code(const E* src, E* dst, i64 n, i64 rank, STR8(a), STR8(b),               \
                                          const void* starts, i64 n_starts, const void* axes, const void* steps,  \
                                          i64 is64) {                                                             \
    ARR8(in_dims, a); ARR8(out_dims, b);                                                                          \
    slice<E>(src, dst, n, rank, in_dims, out_dims, starts, n_starts, axes, steps, is64);                          \
  }                                                                                                               \
  extern "C" __global__ void pad_##code(const E* src, E* dst, const E* cval, i64 n, i64 rank, STR8(a), STR8(b),  \
                                        const void* pads, i64 n_axes, const void* axes, i64 is64, i64 mode) {      \
    ARR8(in_dims, a); ARR8(out_dims, b);                                                                          \
    pad<E>(src, dst, cval, n, rank, in_dims, out_dims, pads, n_axes, axes, is64, mode);                           \
  }                                                                                                               \
  extern "C" __global__ void tile_##code(const E* src, E* dst, i64 n, i64 rank, STR8(a), STR8(b)) {              \
    ARR8(in_dims, a); ARR8(out_dims, b);                                                                          \
    tile<E>(src, dst, n, rank, in_dims, out_dims);                                                                \
  }
// one compile unit per element size when PK_SPLIT is defined (compiled in parallel)
#if !defined(PK_SPLIT) || defined(PK_ONLY_1)
MOVE(u8, 1)
SHAPED(u8, 1)
#endif
#if !defined(PK_SPLIT) || defined(PK_ONLY_2)
MOVE(u16, 2)
SHAPED(u16, 2)
#endif
#if !defined(PK_SPLIT) || defined(PK_ONLY_4)
MOVE(u32, 4)
SHAPED(u32, 4)
#endif
#if !defined(PK_SPLIT) || defined(PK_ONLY_8)
MOVE(u64, 8)
SHAPED(u64, 8)
#endif
#if !defined(PK_SPLIT) || defined(PK_ONLY_16)
MOVE(Vec16, 16)
#endif

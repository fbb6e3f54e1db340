// Data-dependent selection: NonZero, Compress, Unique. An output's size is decided here: the
// plan reserves its bound, the kernels write the real count to a device word (`total`, null when
// the caller knows the size) and the later kernels read it back from there (`live`, null: use
// the size argument); the host reads the word after the layer (polykit.runtime.output_alloc).
// Simple and exact over fast: the sizes these ops see in models are small.
//
// Raw element types R (u8/u16/u32/u64 by itemsize) serve everything that only tests for zero
// or copies; Unique orders and compares by value through typed kernels (T = storage type,
// loaded as its compute type with ld(): fp16/bf16 as float). Value order is numpy's sort
// order: NaN after everything else, NaNs equal to each other, -0.0 equal to 0.0.
//
// select_flags_<R>: ONE block of SF_THREADS threads. pos[j] = number of non-zero elements
//   before j (exclusive prefix count) if element j is non-zero, else -1; *total = the count. An element is
//   non-zero when (bits & keep) != 0 (keep clears the sign bit of float types, so -0.0 is
//   zero and NaN is not). Each thread counts one contiguous chunk, thread 0 scans the
//   SF_THREADS chunk counts serially in shared memory, then each thread writes its chunk.
// select_compress_<R>: grid-stride, one thread per element of x viewed as [outer, n, inner];
//   x[o, j, in] with j < c and pos[j] >= 0 goes to y[o, pos[j], in] (y is [outer, m, inner]).
// select_nonzero_emit: grid-stride, one thread per element e of x (rank <= 8, dims d0..d7
//   innermost last): a non-zero element writes its coordinates to out[d, pos[e]] ([rank, nnz]).
// unique_match_<T>: grid-stride, one thread per item i (n items of x viewed as [outer, n,
//   inner]; an item is the slice x[:, i, :] compared lexicographically): first[i] = the first
//   item equal to i, count[i] = how many items equal i. O(n^2 * outer * inner). NaNs are equal
//   for elements (nan_equal = 1) but not inside slices of an N-D tensor (numpy's rule).
// unique_rank_<T>: grid-stride, one thread per item i with first[i] == i: rank[i] = number of
//   distinct items before it (sorted: smaller by value; unsorted: earlier first occurrence).
// unique_emit_<R>: grid-stride over x's elements: the first occurrence of each distinct item
//   copies it into y[:, rank, :]; then over items: inverse[i] = rank[first[i]], and the
//   first occurrences write indices[rank] = i, counts[rank] = count[i]. A null (0) pointer
//   skips an omitted output.
//
// A position past an output's size (the size argument when no live count is given) is dropped
// rather than written out of bounds.
#include "dtypes.cuh"

#define SF_THREADS 1024

template <class R>
__device__ void select_flags(const R* __restrict__ x, i64 n, u64 keep, i64* __restrict__ pos, i64* __restrict__ total) {
  __shared__ i64 sf_sums[SF_THREADS];
  const i64 chunk = (n + SF_THREADS - 1) / SF_THREADS;
  const i64 lo = threadIdx.x * chunk, hi = lo + chunk < n ? lo + chunk : n;
  i64 cnt = 0;
  for (i64 j = lo; j < hi; ++j) cnt += (((u64)x[j]) & keep) != 0;
  sf_sums[threadIdx.x] = cnt;
  __syncthreads();
  if (threadIdx.x == 0) {
    i64 run = 0;
    for (int t = 0; t < SF_THREADS; ++t) {
      const i64 c = sf_sums[t];
      sf_sums[t] = run;
      run += c;
    }
    if (total) *total = run;
  }
  __syncthreads();
  i64 run = sf_sums[threadIdx.x];
  for (i64 j = lo; j < hi; ++j) {
    if ((((u64)x[j]) & keep) != 0) pos[j] = run++;
    else pos[j] = -1;
  }
}

template <class R>
__device__ void select_compress(const R* __restrict__ x, R* __restrict__ y, const i64* __restrict__ pos, i64 total,
                                i64 n, i64 c, i64 inner, i64 m, const i64* __restrict__ live) {
  if (live) m = *live;
  for (i64 e = blockIdx.x * (i64)blockDim.x + threadIdx.x; e < total; e += (i64)gridDim.x * blockDim.x) {
    const i64 t = e / inner, in = e - t * inner;
    const i64 o = t / n, j = t - o * n;
    if (j < c) {
      const i64 p = pos[j];
      if (p >= 0 && p < m) y[(o * m + p) * inner + in] = x[e];
    }
  }
}

extern "C" __global__ void select_nonzero_emit(const i64* __restrict__ pos, i64 n, i64 nnz,
                                               const i64* __restrict__ live, i64 rank,
                                               i64 d0, i64 d1, i64 d2, i64 d3, i64 d4, i64 d5, i64 d6, i64 d7,
                                               i64* __restrict__ out) {
  const i64 dims[8] = {d0, d1, d2, d3, d4, d5, d6, d7};
  if (live) nnz = *live;
  for (i64 e = blockIdx.x * (i64)blockDim.x + threadIdx.x; e < n; e += (i64)gridDim.x * blockDim.x) {
    const i64 p = pos[e];
    if (p < 0 || p >= nnz) continue;
    i64 rest = e;
    for (int d = (int)rank - 1; d >= 0; --d) {
      const i64 q = rest / dims[d];
      out[d * nnz + p] = rest - q * dims[d];
      rest = q;
    }
  }
}

// -1 / 0 / 1 in numpy's sort order (NaN last, NaNs equal)
template <class C>
__device__ __forceinline__ int un_cmp(C a, C b) {
  const bool an = a != a, bn = b != b;
  if (an || bn) return an == bn ? 0 : (an ? 1 : -1);
  return a < b ? -1 : (b < a ? 1 : 0);
}

// lexicographic comparison of items i and j of x viewed as [outer, n, inner]: -1 / 1 by order,
// 0 equal, 2 when they tie in order only through NaN pairs and NaNs are not equal (nan_equal = 0:
// numpy's unique along an axis of an N-D tensor compares slices field by field, NaN != NaN)
template <class T>
__device__ int un_items(const T* __restrict__ x, i64 i, i64 j, i64 n, i64 outer, i64 inner, i64 nan_equal) {
  if (i == j) return 0;
  int tie = 0;
  for (i64 o = 0; o < outer; ++o) {
    const i64 bi = (o * n + i) * inner, bj = (o * n + j) * inner;
    for (i64 in = 0; in < inner; ++in) {
      const typename Compute<T>::type a = ld(x, bi + in), b = ld(x, bj + in);
      const int c = un_cmp(a, b);
      if (c) return c;
      if (!nan_equal && a != a) tie = 2;
    }
  }
  return tie;
}

template <class T>
__device__ void unique_match(const T* __restrict__ x, i64 n, i64 outer, i64 inner, i64 nan_equal,
                             i64* __restrict__ first, i64* __restrict__ count) {
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
    i64 f = -1, cnt = 0;
    for (i64 j = 0; j < n; ++j) {
      if (un_items(x, i, j, n, outer, inner, nan_equal) == 0) {
        if (f < 0) f = j;
        ++cnt;
      }
    }
    first[i] = f;
    count[i] = cnt;
  }
}

template <class T>
__device__ void unique_rank(const T* __restrict__ x, i64 n, i64 outer, i64 inner, i64 nan_equal, i64 sorted,
                            const i64* __restrict__ first, i64* __restrict__ rank) {
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
    if (first[i] != i) continue;
    i64 r = 0;
    if (sorted) {
      for (i64 j = 0; j < n; ++j) {
        if (first[j] != j) continue;
        const int c = un_items(x, j, i, n, outer, inner, nan_equal);
        r += c < 0 || (c == 2 && j < i);  // distinct items that tie in order keep first-occurrence order
      }
    } else {
      for (i64 j = 0; j < i; ++j) r += first[j] == j;
    }
    rank[i] = r;
  }
}

template <class R>
__device__ void unique_emit(const R* __restrict__ x, R* __restrict__ y, const i64* __restrict__ first,
                            const i64* __restrict__ count, const i64* __restrict__ rank, i64 n, i64 inner, i64 total,
                            i64 u, const i64* __restrict__ live, i64* __restrict__ indices, i64* __restrict__ inverse,
                            i64* __restrict__ counts) {
  if (live) u = *live;
  const i64 stride = (i64)gridDim.x * blockDim.x, start = blockIdx.x * (i64)blockDim.x + threadIdx.x;
  if (y)
    for (i64 e = start; e < total; e += stride) {
      const i64 t = e / inner, in = e - t * inner;
      const i64 o = t / n, j = t - o * n;
      if (first[j] == j && rank[j] < u) y[(o * u + rank[j]) * inner + in] = x[e];
    }
  for (i64 j = start; j < n; j += stride) {
    const i64 f = first[j], r = rank[f];
    if (inverse) inverse[j] = r;
    if (f == j && r < u) {
      if (indices) indices[r] = j;
      if (counts) counts[r] = count[j];
    }
  }
}

// unique_count: one thread: *total = number of distinct items (first[i] == i).
extern "C" __global__ void unique_count(const i64* __restrict__ first, i64 n, i64* __restrict__ total) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  i64 u = 0;
  for (i64 i = 0; i < n; ++i) u += first[i] == i;
  *total = u;
}

#define SELECT_RAW(R)                                                                                          \
  extern "C" __global__ void select_flags_##R(const R* x, i64 n, u64 keep, i64* pos, i64* total) {            \
    select_flags<R>(x, n, keep, pos, total);                                                                   \
  }                                                                                                            \
  extern "C" __global__ void select_compress_##R(const R* x, R* y, const i64* pos, i64 total, i64 n, i64 c,   \
                                                 i64 inner, i64 m, const i64* live) {                          \
    select_compress<R>(x, y, pos, total, n, c, inner, m, live);                                                \
  }                                                                                                            \
  extern "C" __global__ void unique_emit_##R(const R* x, R* y, const i64* first, const i64* count,            \
                                             const i64* rank, i64 n, i64 inner, i64 total, i64 u,             \
                                             const i64* live, i64* indices, i64* inverse, i64* counts) {       \
    unique_emit<R>(x, y, first, count, rank, n, inner, total, u, live, indices, inverse, counts);              \
  }

SELECT_RAW(u8)
SELECT_RAW(u16)
SELECT_RAW(u32)
SELECT_RAW(u64)

#define UNIQUE_TYPED(T, code)                                                                                  \
  extern "C" __global__ void unique_match_##code(const T* x, i64 n, i64 outer, i64 inner, i64 nan_equal,     \
                                                 i64* first, i64* count) {                                     \
    unique_match<T>(x, n, outer, inner, nan_equal, first, count);                                              \
  }                                                                                                            \
  extern "C" __global__ void unique_rank_##code(const T* x, i64 n, i64 outer, i64 inner, i64 nan_equal,      \
                                                i64 sorted, const i64* first, i64* rank) {                     \
    unique_rank<T>(x, n, outer, inner, nan_equal, sorted, first, rank);                                        \
  }

UNIQUE_TYPED(float, f32)
UNIQUE_TYPED(double, f64)
UNIQUE_TYPED(half_t, f16)
UNIQUE_TYPED(bf16_t, bf16)
UNIQUE_TYPED(i8, i8)
UNIQUE_TYPED(u8, u8)
UNIQUE_TYPED(i16, i16)
UNIQUE_TYPED(u16, u16)
UNIQUE_TYPED(i32, i32)
UNIQUE_TYPED(u32, u32)
UNIQUE_TYPED(i64, i64)
UNIQUE_TYPED(u64, u64)

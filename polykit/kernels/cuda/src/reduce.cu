// Reduce* and ArgMax/ArgMin over any set of axes of a contiguous tensor (rank <= 8); and the
// span kernels (reduce_rows / reduce_cols, further down) for axes that form one run.
//
// Layout: x contiguous with dims d0..d7 (rank used); the reduced set is `mask` (bit k =
// axis k) or, when mask < 0, read on the device from the int64 `axes` tensor (negative
// axes allowed), so plans need no host copy of constant inputs.
// Geometry: one block per output element (grid-stride over outputs), blockDim.x in
// {32..256} chosen from the reduction length R; threads stride over the R reduced elements
// (consecutive threads -> consecutive innermost reduced offsets: coalesced when the last
// axis is reduced), then a deterministic block reduction (blockreduce.cuh). Float sums
// accumulate in fp32 (fp64 for double), integer sums in 64 bits. bfloat16 accumulates in fp64:
// sums of its 8-bit significands are then exact in any order, so the result is the reference's
// (a float64 sum rounded once, through float as ml_dtypes rounds) bit for bit.
#include "blockreduce.cuh"

template <class T> struct Acc { typedef i64 type; };
template <> struct Acc<half_t> { typedef float type; };
template <> struct Acc<bf16_t> { typedef double type; };
template <> struct Acc<float> { typedef float type; };
template <> struct Acc<double> { typedef double type; };
template <> struct Acc<u8> { typedef u64 type; };
template <> struct Acc<u32> { typedef u64 type; };
template <> struct Acc<u64> { typedef u64 type; };


template <class A> struct IsFloatAcc { enum { value = 0 }; };
template <> struct IsFloatAcc<float> { enum { value = 1 }; };
template <> struct IsFloatAcc<double> { enum { value = 1 }; };
template <class T> struct LimOf : Lim<T> {};
template <> struct LimOf<half_t> : Lim<float> {};
template <> struct LimOf<bf16_t> : Lim<float> {};
template <class T, class A> __device__ __forceinline__ A lo_of() { return (A)LimOf<T>::lo(); }
template <class T, class A> __device__ __forceinline__ A hi_of() { return (A)LimOf<T>::hi(); }
__device__ __forceinline__ float acc_exp(float v) { return expf(v); }
__device__ __forceinline__ float acc_sqrt(float v) { return sqrtf(v); }
__device__ __forceinline__ float acc_log(float v) { return logf(v); }
template <class A> __device__ __forceinline__ double acc_exp(A v) { return exp((double)v); }
template <class A> __device__ __forceinline__ double acc_sqrt(A v) { return sqrt((double)v); }
template <class A> __device__ __forceinline__ double acc_log(A v) { return log((double)v); }

template <class C, int MAX>
__device__ __forceinline__ bool arg_better(C v, C best, i64 vi, i64 bi, i64 select_last) {
  const bool vn = v != v, bn = best != best;
  if (vn || bn) return (vn && bn) ? (select_last ? vi > bi : vi < bi) : vn;
  if (v == best) return select_last ? vi > bi : vi < bi;
  return MAX ? v > best : v < best;
}

enum { R_SUM, R_MEAN, R_MAX, R_MIN, R_PROD, R_L1, R_L2, R_SUMSQ, R_LOGSUM, R_LOGSUMEXP };

struct Geo {
  int nk, nr;          // kept / reduced dim counts
  i64 kd[8], ks[8];    // kept dims and input strides
  i64 rd[8], rs[8];    // reduced dims and input strides
};

__device__ void make_geo(Geo& g, const i64* axes, i64 n_axes, i64 mask, int rank, const i64* dims) {
  if (mask < 0) {
    mask = 0;
    for (i64 k = 0; k < n_axes; ++k) {
      i64 a = axes[k];
      if (a < 0) a += rank;
      mask |= (i64)1 << a;
    }
  }
  i64 stride = 1, ks[8], rs[8], kd[8], rd[8];
  int nk = 0, nr = 0;
  for (int d = rank - 1; d >= 0; --d) {
    if ((mask >> d) & 1) { rd[nr] = dims[d]; rs[nr++] = stride; }
    else { kd[nk] = dims[d]; ks[nk++] = stride; }
    stride *= dims[d];
  }
  g.nk = nk; g.nr = nr;
  for (int k = 0; k < nk; ++k) { g.kd[k] = kd[k]; g.ks[k] = ks[k]; }  // innermost first
  for (int k = 0; k < nr; ++k) { g.rd[k] = rd[k]; g.rs[k] = rs[k]; }
}

__device__ __noinline__ i64 offset_of(i64 i, int n, const i64* dims, const i64* strides) {
  i64 off = 0;
  for (int k = 0; k < n; ++k) {  // innermost first
    i64 q = i / dims[k];
    off += (i - q * dims[k]) * strides[k];
    i = q;
  }
  return off;
}

#define GEO_ARGS const i64* axes, i64 n_axes, i64 mask, i64 rank, i64 d0, i64 d1, i64 d2, i64 d3, i64 d4, i64 d5, i64 d6, i64 d7, i64 n_out, i64 R
#define GEO_SETUP                                                              \
  __shared__ Geo g;                                                            \
  if (threadIdx.x == 0) {                                                      \
    const i64 dims[8] = {d0, d1, d2, d3, d4, d5, d6, d7};                      \
    make_geo(g, axes, n_axes, mask, (int)rank, dims);                          \
  }                                                                            \
  __syncthreads();

// one reduction step, the join of two partials, the final transform (every op but LogSumExp,
// whose shift by the peak reduce_impl adds)
template <class T, class A> __device__ __forceinline__ A reduce_init(int OP) {
  return (OP == R_MAX) ? lo_of<T, A>() : (OP == R_MIN) ? hi_of<T, A>() : (OP == R_PROD) ? (A)1 : (A)0;
}
template <class A> __device__ __forceinline__ A reduce_step(int OP, A acc, A v) {
  if (OP == R_MAX) return OpMax()(acc, v);
  if (OP == R_MIN) return OpMin()(acc, v);
  if (OP == R_PROD) return acc * v;
  if (OP == R_L1) return acc + (v < (A)0 ? (A)(-v) : v);
  if (OP == R_L2 || OP == R_SUMSQ) return acc + v * v;
  return acc + v;
}
template <class A> __device__ __forceinline__ A reduce_join(int OP, A a, A b) {
  return (OP == R_MAX) ? OpMax()(a, b) : (OP == R_MIN) ? OpMin()(a, b) : (OP == R_PROD) ? a * b : a + b;
}
template <class A> __device__ __forceinline__ A reduce_finish(int OP, A total, i64 R) {
  if (OP == R_MEAN) return IsFloatAcc<A>::value ? total / (A)R : (A)(total / (A)R);
  if (OP == R_L2) return (A)acc_sqrt(total);
  if (OP == R_LOGSUM) return (A)acc_log(total);
  return total;
}

template <class T>
__device__ void reduce_impl(const T* __restrict__ x, T* __restrict__ y, const int OP, GEO_ARGS) {
  typedef typename Acc<T>::type A;
  typedef typename Compute<T>::type C;
  __shared__ A smem[32];
  GEO_SETUP
  for (i64 o = blockIdx.x; o < n_out; o += gridDim.x) {
    const i64 base = offset_of(o, g.nk, g.kd, g.ks);
    A peak = 0;
    if (OP == R_LOGSUMEXP) {
      A m = (A)Lim<A>::lo();
      for (i64 r = threadIdx.x; r < R; r += blockDim.x) m = OpMax()(m, (A)ld(x, base + offset_of(r, g.nr, g.rd, g.rs)));
      peak = block_reduce(m, OpMax(), (A)Lim<A>::lo(), smem);
      if (!(peak - peak == 0)) peak = 0;  // +-inf or NaN peak: reduce without shifting
    }
    const A init = reduce_init<T, A>(OP);
    A acc = init;
    for (i64 r = threadIdx.x; r < R; r += blockDim.x) {
      A v = (A)ld(x, base + offset_of(r, g.nr, g.rd, g.rs));
      acc = OP == R_LOGSUMEXP ? acc + (A)acc_exp(v - peak) : reduce_step(OP, acc, v);
    }
    A total;
    if (OP == R_MAX) total = block_reduce(acc, OpMax(), init, smem);
    else if (OP == R_MIN) total = block_reduce(acc, OpMin(), init, smem);
    else if (OP == R_PROD) total = block_reduce(acc, OpProd(), init, smem);
    else total = block_reduce(acc, OpSum(), init, smem);
    if (threadIdx.x == 0) {
      total = OP == R_LOGSUMEXP ? peak + (A)acc_log(total) : reduce_finish(OP, total, R);
      st(y, o, (C)total);
    }
    __syncthreads();
  }
}

// ArgMax (MAX=1) / ArgMin (MAX=0) over the one axis in `mask`; ties -> first index, or last
// with select_last_index; NaN counts as the extreme (numpy's behaviour).
template <class T, int MAX>
__device__ void arg_impl(const T* __restrict__ x, i64* __restrict__ y, i64 select_last, GEO_ARGS) {
  typedef typename Compute<T>::type C;
  __shared__ C sv[32];
  __shared__ i64 si[32];
  GEO_SETUP
  for (i64 o = blockIdx.x; o < n_out; o += gridDim.x) {
    const i64 base = offset_of(o, g.nk, g.kd, g.ks);
    C best = 0;
    i64 bi = -1;
    for (i64 r = threadIdx.x; r < R; r += blockDim.x) {
      C v = ld(x, base + offset_of(r, g.nr, g.rd, g.rs));
      if (bi < 0 || arg_better<C, MAX>(v, best, r, bi, select_last)) { best = v; bi = r; }
    }
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) {
      C ov = shfl_xor(best, m);
      i64 oi = shfl_xor(bi, m);
      if (oi >= 0 && (bi < 0 || arg_better<C, MAX>(ov, best, oi, bi, select_last))) { best = ov; bi = oi; }
    }
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    __syncthreads();
    if (lane == 0) { sv[wid] = best; si[wid] = bi; }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < nw; ++w)
        if (si[w] >= 0 && (bi < 0 || arg_better<C, MAX>(sv[w], best, si[w], bi, select_last))) { best = sv[w]; bi = si[w]; }
      y[o] = bi < 0 ? 0 : bi;
    }
    __syncthreads();
  }
}

// ---- span reductions (reduce_span.py): the reduced axes are one run of adjacent axes, so x
// is [O, R, I] (O kept outer, R reduced, I kept inner; sizes from the host). Deterministic: the
// order of every sum depends only on (O, R, I) and the launch geometry the host derives from them.
// V elements a thread load: 16 bytes at once when the host passes vec (I or R a multiple of V,
// 16-byte aligned x and y), else V = 1.
template <class T, int V> struct alignas(sizeof(T) * V) Pack { T e[V]; };

// rows (I == 1): one warp per output row, 8 rows a block (grid-stride); lane l reads chunks
// l, l + 32, ... of V elements, then a fixed butterfly over the lanes.
template <class T, int V>
__device__ void span_rows(const T* __restrict__ x, T* __restrict__ y, const int OP, i64 O, i64 R) {
  typedef typename Acc<T>::type A;
  typedef typename Compute<T>::type C;
  const int lane = threadIdx.x & 31, per_block = blockDim.x >> 5;
  for (i64 o = (i64)blockIdx.x * per_block + (threadIdx.x >> 5); o < O; o += (i64)gridDim.x * per_block) {
    const T* row = x + o * R;
    A acc = reduce_init<T, A>(OP);
    for (i64 r = (i64)lane * V; r < R; r += 32 * V) {
      const Pack<T, V> p = *(const Pack<T, V>*)(row + r);
#pragma unroll
      for (int j = 0; j < V; ++j) acc = reduce_step(OP, acc, (A)ld(p.e, j));
    }
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) acc = reduce_join(OP, acc, shfl_xor(acc, m));
    if (lane == 0) st(y, o, (C)reduce_finish(OP, acc, R));
  }
}

// columns (I > 1): block (TX, TY, TZ), TY a power of two; thread (tx, ty, tz) owns the V outputs
// (o, i0 .. i0 + V) with i0 = (blockIdx.x * TX + tx) * V, o = TZ * og + tz, and reduces rows
// r = ty, ty + TY, ...; the TY partials meet in a fixed tree in shared memory (TX*TY*TZ*V accs).
// Split (part != 0, tactic cuda.reduce.span.split): block z reduces only rows [z * chunk,
// z * chunk + chunk) and stores its unfinished partials at part[(z * O + o) * I + i], which
// reduce_cols_join then joins in the order of z (R split over gridDim.z blocks: short grids of
// long columns, the NHWC global pool of a squeeze-excitation block, fill the device).
template <class T, int V>
__device__ void span_cols(const T* __restrict__ x, T* __restrict__ y, const int OP, i64 O, i64 R, i64 I,
                          typename Acc<T>::type* __restrict__ part = nullptr, i64 chunk = 0) {
  typedef typename Acc<T>::type A;
  typedef typename Compute<T>::type C;
  extern __shared__ __align__(16) unsigned char span_smem[];
  A* tree = (A*)span_smem;
  const int TX = blockDim.x, TY = blockDim.y, TZ = blockDim.z;
  const int tx = threadIdx.x, ty = threadIdx.y, tz = threadIdx.z;
  const i64 i0 = ((i64)blockIdx.x * TX + tx) * V;
  A* mine = tree + ((i64)(tz * TY + ty) * TX + tx) * V;
  for (i64 og = blockIdx.y; og * TZ < O; og += gridDim.y) {  // uniform over the block
    const i64 o = og * TZ + tz;
    const bool live = o < O && i0 < I;
    A acc[V];
#pragma unroll
    for (int j = 0; j < V; ++j) acc[j] = reduce_init<T, A>(OP);
    if (live) {
      const T* col = x + o * R * I + i0;
      const i64 r0 = part ? blockIdx.z * chunk : 0, r1 = part && r0 + chunk < R ? r0 + chunk : R;
      for (i64 r = r0 + ty; r < r1; r += TY) {
        const Pack<T, V> p = *(const Pack<T, V>*)(col + r * I);
#pragma unroll
        for (int j = 0; j < V; ++j) acc[j] = reduce_step(OP, acc[j], (A)ld(p.e, j));
      }
    }
    for (int half = TY >> 1; half > 0; half >>= 1) {
      if (ty >= half && ty < 2 * half) {
#pragma unroll
        for (int j = 0; j < V; ++j) mine[j] = acc[j];
      }
      __syncthreads();
      if (ty < half) {
        const A* other = mine + (i64)half * TX * V;
#pragma unroll
        for (int j = 0; j < V; ++j) acc[j] = reduce_join(OP, acc[j], other[j]);
      }
      __syncthreads();
    }
    if (ty == 0 && live && part) {
      A* out = part + ((i64)blockIdx.z * O + o) * I + i0;
#pragma unroll
      for (int j = 0; j < V; ++j) out[j] = acc[j];
    } else if (ty == 0 && live) {
#pragma unroll
      for (int j = 0; j < V; ++j) st(y, o * I + i0 + j, (C)reduce_finish(OP, acc[j], R));
    }
  }
}

// the split's second pass: output k = o * I + i joins its S partials (z = 0 .. S-1, fixed order)
template <class T>
__device__ void span_cols_join(const typename Acc<T>::type* __restrict__ part, T* __restrict__ y, const int OP,
                               i64 n, i64 R, i64 S) {
  typedef typename Acc<T>::type A;
  typedef typename Compute<T>::type C;
  for (i64 k = blockIdx.x * (i64)blockDim.x + threadIdx.x; k < n; k += (i64)gridDim.x * blockDim.x) {
    A acc = part[k];
    for (i64 z = 1; z < S; ++z) acc = reduce_join(OP, acc, part[z * n + k]);
    st(y, k, (C)reduce_finish(OP, acc, R));
  }
}

// V for 16-byte loads of T
template <class T> struct Wide { enum { value = 16 / sizeof(T) }; };

#define GEO_NAMES axes, n_axes, mask, rank, d0, d1, d2, d3, d4, d5, d6, d7, n_out, R
#define REDUCE(T, code)                                                                                      \
  extern "C" __global__ void reduce_##code(const T* x, T* y, i64 op, GEO_ARGS) { reduce_impl<T>(x, y, (int)op, GEO_NAMES); } \
  extern "C" __global__ void reduce_rows_##code(const T* x, T* y, i64 op, i64 O, i64 R, i64 vec) {            \
    if (vec) span_rows<T, Wide<T>::value>(x, y, (int)op, O, R); else span_rows<T, 1>(x, y, (int)op, O, R);    \
  }                                                                                                            \
  extern "C" __global__ void reduce_cols_##code(const T* x, T* y, i64 op, i64 O, i64 R, i64 I, i64 vec) {     \
    if (vec) span_cols<T, Wide<T>::value>(x, y, (int)op, O, R, I); else span_cols<T, 1>(x, y, (int)op, O, R, I); \
  }                                                                                                            \
  extern "C" __global__ void reduce_cols_part_##code(const T* x, Acc<T>::type* part, i64 op, i64 O, i64 R, i64 I, \
                                                     i64 vec, i64 chunk) {                                     \
    if (vec) span_cols<T, Wide<T>::value>(x, nullptr, (int)op, O, R, I, part, chunk);                          \
    else span_cols<T, 1>(x, nullptr, (int)op, O, R, I, part, chunk);                                           \
  }                                                                                                            \
  extern "C" __global__ void reduce_cols_join_##code(const Acc<T>::type* part, T* y, i64 op, i64 n, i64 R, i64 S) { \
    span_cols_join<T>(part, y, (int)op, n, R, S);                                                              \
  }
#define ARG(T, code) \
  extern "C" __global__ void argmax_##code(const T* x, i64* y, i64 select_last, GEO_ARGS) { arg_impl<T, 1>(x, y, select_last, GEO_NAMES); } \
  extern "C" __global__ void argmin_##code(const T* x, i64* y, i64 select_last, GEO_ARGS) { arg_impl<T, 0>(x, y, select_last, GEO_NAMES); }

// one compile unit per dtype when PK_SPLIT is defined (the tactics compile them in parallel)
#if !defined(PK_SPLIT) || defined(PK_ONLY_f32)
REDUCE(float, f32)
ARG(float, f32)
#endif
#if !defined(PK_SPLIT) || defined(PK_ONLY_f16)
REDUCE(half_t, f16)
ARG(half_t, f16)
#endif
#if !defined(PK_SPLIT) || defined(PK_ONLY_bf16)
REDUCE(bf16_t, bf16)
ARG(bf16_t, bf16)
#endif
#if !defined(PK_SPLIT) || defined(PK_ONLY_f64)
REDUCE(double, f64)
ARG(double, f64)
#endif
#if !defined(PK_SPLIT) || defined(PK_ONLY_i32)
REDUCE(i32, i32)
ARG(i32, i32)
#endif
#if !defined(PK_SPLIT) || defined(PK_ONLY_i64)
REDUCE(i64, i64)
ARG(i64, i64)
#endif
#if !defined(PK_SPLIT) || defined(PK_ONLY_b8)
REDUCE(bool, b8)
#endif

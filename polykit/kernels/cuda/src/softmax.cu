// Softmax / LogSoftmax / Hardmax along one axis of a contiguous tensor viewed as [outer, R, inner].
//
// softmax_row_<T> (inner == 1): one block per row (grid-stride over rows), blockDim in
//   {32..256} from R; three passes over the row (max, sum of exp, write), each pass's block
//   reduction deterministic (blockreduce.cuh). Reads 3R + writes R elements per row.
// softmax_col_<T> (inner > 1, and every Hardmax): one thread per (outer, inner) column,
//   serial loop over R; consecutive threads read consecutive inner elements (coalesced).
// mode: 0 Softmax, 1 LogSoftmax, 2 Hardmax (first maximal index wins). Math in fp32 (fp64 for double).
// A 16-bit Softmax computes as the spec's function body and the reference do: x - max, exp and
// the quotient each rounded to T, the sum as numpy sums T: over the innermost axis, float16 in
// float rounded once and bfloat16 one rounded addition at a time in index order (by thread 0
// of the row's block); over any other axis (the column kernel) numpy adds whole rows, so both
// types round every addition to T, in index order.
#include "blockreduce.cuh"

__device__ __forceinline__ float sm_exp(float v) { return expf(v); }
__device__ __forceinline__ double sm_exp(double v) { return exp(v); }
__device__ __forceinline__ float sm_log(float v) { return logf(v); }
__device__ __forceinline__ double sm_log(double v) { return log(v); }

// exp(x - shift) with the difference and the exponential rounded to T (16-bit Softmax stages)
template <class T, class C> __device__ __forceinline__ C staged_exp(C x, C shift) {
  return round_as<T>(sm_exp(round_as<T>(x - shift)));
}

template <class T>
__device__ void softmax_row(const T* __restrict__ x, T* __restrict__ y, i64 rows, i64 R, i64 mode) {
  typedef typename Compute<T>::type C;
  __shared__ C smem[32];
  const C ninf = -Lim<C>::hi();
  for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * R;
    T* yr = y + row * R;
    C m = ninf;
    for (i64 j = threadIdx.x; j < R; j += blockDim.x) m = OpMax()(m, ld(xr, j));
    m = block_reduce(m, OpMax(), ninf, smem);
    const C shift = (m - m == (C)0) ? m : (C)0;  // all -inf row: no shift
    if (mode == 0 && sizeof(T) == 2) {  // 16-bit Softmax: stages in T (file comment)
      C s = 0;
      if (SumRoundsEachStep<T>::value) {
        __syncthreads();
        if (threadIdx.x == 0) {
          s = 0;
          for (i64 j = 0; j < R; ++j) s = round_as<T>(s + staged_exp<T>(ld(xr, j), shift));
          smem[0] = s;
        }
        __syncthreads();
        s = smem[0];
        __syncthreads();
      } else {
        for (i64 j = threadIdx.x; j < R; j += blockDim.x) s += staged_exp<T>(ld(xr, j), shift);
        s = round_as<T>(block_reduce(s, OpSum(), (C)0, smem));
      }
      for (i64 j = threadIdx.x; j < R; j += blockDim.x) st(yr, j, staged_exp<T>(ld(xr, j), shift) / s);
      continue;
    }
    C s = 0;
    for (i64 j = threadIdx.x; j < R; j += blockDim.x) s += sm_exp(ld(xr, j) - shift);
    s = block_reduce(s, OpSum(), (C)0, smem);
    if (mode == 1) {
      const C lse = sm_log(s);
      for (i64 j = threadIdx.x; j < R; j += blockDim.x) st(yr, j, ld(xr, j) - shift - lse);
    } else {
      const C inv = (C)1 / s;
      for (i64 j = threadIdx.x; j < R; j += blockDim.x) st(yr, j, sm_exp(ld(xr, j) - shift) * inv);
    }
  }
}

template <class T>
__device__ void softmax_col(const T* __restrict__ x, T* __restrict__ y, i64 outer, i64 R, i64 inner, i64 mode) {
  typedef typename Compute<T>::type C;
  const C ninf = -Lim<C>::hi();
  for (i64 c = blockIdx.x * (i64)blockDim.x + threadIdx.x; c < outer * inner; c += (i64)gridDim.x * blockDim.x) {
    const i64 o = c / inner, i = c - o * inner;
    const T* xc = x + o * R * inner + i;
    T* yc = y + o * R * inner + i;
    C m = ninf;
    i64 arg = 0;
    for (i64 j = 0; j < R; ++j) {
      C v = ld(xc, j * inner);
      if (v > m || (v != v && m == m)) { m = v; arg = j; }
    }
    if (mode == 2) {
      for (i64 j = 0; j < R; ++j) st(yc, j * inner, (C)(j == arg ? 1 : 0));
      continue;
    }
    const C shift = (m - m == (C)0) ? m : (C)0;
    if (mode == 0 && sizeof(T) == 2) {  // 16-bit Softmax: stages in T (file comment)
      C s = 0;
      for (i64 j = 0; j < R; ++j) s = round_as<T>(s + staged_exp<T>(ld(xc, j * inner), shift));
      for (i64 j = 0; j < R; ++j) st(yc, j * inner, staged_exp<T>(ld(xc, j * inner), shift) / s);
      continue;
    }
    C s = 0;
    for (i64 j = 0; j < R; ++j) s += sm_exp(ld(xc, j * inner) - shift);
    const C lse = sm_log(s), inv = (C)1 / s;
    for (i64 j = 0; j < R; ++j) {
      C v = ld(xc, j * inner) - shift;
      st(yc, j * inner, mode == 1 ? v - lse : sm_exp(v) * inv);
    }
  }
}


#define SOFTMAX(T, code)                                                                                        \
  extern "C" __global__ void softmax_row_##code(const T* x, T* y, i64 rows, i64 R, i64 mode) {                    \
    softmax_row<T>(x, y, rows, R, mode);                                                                         \
  }                                                                                                              \
  extern "C" __global__ void softmax_col_##code(const T* x, T* y, i64 outer, i64 R, i64 inner, i64 mode) {       \
    softmax_col<T>(x, y, outer, R, inner, mode);                                                                 \
  }
SOFTMAX(float, f32)
SOFTMAX(half_t, f16)
SOFTMAX(bf16_t, bf16)
SOFTMAX(double, f64)

// CumSum / CumProd along one axis of a contiguous tensor (inclusive / exclusive, forward / reverse).
//
// The axis is read on the device from the rank-0/1 `axis` tensor (int32 or int64, negative
// allowed), so a plan needs no host copy; each block derives the [outer, R, inner] view of x
// (dims d0..d7, rank <= 8) from it.
// Geometry: blockDim.x == 256, grid-stride over work items (the host launches ceil(size/64)
// blocks, capped, which covers one row per block or one column per thread in either mode).
//   inner == 1 and R >= 64 (axis innermost): one block per row; the row is scanned in chunks of 256
//     elements (warp shuffle scan, then a scan of the 8 warp totals in shared memory) with a
//     running carry. Coalesced loads and stores.
//   otherwise: one thread per (outer, inner) column, serial loop over R; consecutive threads
//     touch consecutive inner elements (coalesced).
// Deterministic: every partial sum / product is formed in a fixed order (the row path combines
// them as a tree, so float products may differ from a serial product in the last bits). Values
// accumulate in fp32 for fp16/fp32 storage, fp64 for double, 64-bit for integers (integer
// products wrap modulo 2^64 whatever the order, then truncate to the storage type).
#include "dtypes.cuh"

template <class T> struct ScanAcc { typedef i64 type; };
template <> struct ScanAcc<half_t> { typedef float type; };
template <> struct ScanAcc<float> { typedef float type; };
template <> struct ScanAcc<double> { typedef double type; };
template <> struct ScanAcc<u32> { typedef u64 type; };
template <> struct ScanAcc<u64> { typedef u64 type; };

#define SCAN_BLOCK 256
#define SCAN_ROW_MIN 64  // shorter innermost rows: one thread per row

struct ScanView { i64 outer, R, inner; };

__device__ ScanView scan_view(const void* axis, i64 axis_is64, i64 rank, const i64* dims) {
  i64 a = axis_is64 ? *(const i64*)axis : (i64)*(const i32*)axis;
  if (a < 0) a += rank;
  ScanView v = {1, 1, 1};
  for (int d = 0; d < rank; ++d) {
    if (d < a) v.outer *= dims[d];
    else if (d == a) v.R = dims[d];
    else v.inner *= dims[d];
  }
  return v;
}

struct ScanSum {
  template <class A> __device__ static __forceinline__ A identity() { return (A)0; }
  template <class A> __device__ static __forceinline__ A apply(A a, A b) { return a + b; }
};
struct ScanProd {
  template <class A> __device__ static __forceinline__ A identity() { return (A)1; }
  template <class A> __device__ static __forceinline__ A apply(A a, A b) { return a * b; }
};

template <class Op, class A>
__device__ __forceinline__ A warp_inclusive_scan(A v, int lane) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    A u = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v = Op::apply(u, v);
  }
  return v;
}

template <class T, class Op>
__device__ void scan_impl(const T* __restrict__ x, T* __restrict__ y, const void* axis, i64 axis_is64,
                          i64 exclusive, i64 reverse, i64 rank, const i64* dims) {
  typedef typename ScanAcc<T>::type A;
  const A id = Op::template identity<A>();
  __shared__ A warp_sums[SCAN_BLOCK / 32];
  const ScanView v = scan_view(axis, axis_is64, rank, dims);
  const i64 R = v.R, inner = v.inner;
  if (inner == 1 && R >= SCAN_ROW_MIN) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    for (i64 row = blockIdx.x; row < v.outer; row += gridDim.x) {
      const i64 base = row * R;
      A carry = id;
      for (i64 c0 = 0; c0 < R; c0 += SCAN_BLOCK) {
        const i64 j = c0 + threadIdx.x;
        const i64 pos = reverse ? R - 1 - j : j;
        const A own = j < R ? (A)ld(x, base + pos) : id;
        A s = warp_inclusive_scan<Op>(own, lane);
        if (lane == 31) warp_sums[wid] = s;
        __syncthreads();
        A before = carry;
        for (int w = 0; w < wid; ++w) before = Op::apply(before, warp_sums[w]);
        A prev = __shfl_up_sync(0xffffffffu, s, 1);
        if (lane == 0) prev = id;
        if (j < R) st(y, base + pos, exclusive ? Op::apply(before, prev) : Op::apply(before, s));
        A total = carry;
        for (int w = 0; w < SCAN_BLOCK / 32; ++w) total = Op::apply(total, warp_sums[w]);
        carry = total;
        __syncthreads();
      }
    }
  } else {
    const i64 cols = v.outer * inner;
    for (i64 c = blockIdx.x * (i64)blockDim.x + threadIdx.x; c < cols; c += (i64)gridDim.x * blockDim.x) {
      const i64 o = c / inner, in = c - o * inner;
      const i64 base = o * R * inner + in;
      A acc = id;
      for (i64 j = 0; j < R; ++j) {
        const i64 off = base + (reverse ? R - 1 - j : j) * inner;
        const A val = (A)ld(x, off);
        if (exclusive) { st(y, off, acc); acc = Op::apply(acc, val); }
        else { acc = Op::apply(acc, val); st(y, off, acc); }
      }
    }
  }
}

#define SCAN(T, code, name, Op)                                                                    \
  extern "C" __global__ void __launch_bounds__(SCAN_BLOCK) name##_##code(                           \
      const T* x, T* y, const void* axis, i64 axis_is64, i64 exclusive, i64 reverse, i64 rank,     \
      i64 d0, i64 d1, i64 d2, i64 d3, i64 d4, i64 d5, i64 d6, i64 d7) {                            \
    const i64 dims[8] = {d0, d1, d2, d3, d4, d5, d6, d7};                                           \
    scan_impl<T, Op>(x, y, axis, axis_is64, exclusive, reverse, rank, dims);                        \
  }
#define CUMSUM_CUMPROD(T, code) SCAN(T, code, cumsum, ScanSum) SCAN(T, code, cumprod, ScanProd)

CUMSUM_CUMPROD(float, f32)
CUMSUM_CUMPROD(half_t, f16)
CUMSUM_CUMPROD(double, f64)
CUMSUM_CUMPROD(i32, i32)
CUMSUM_CUMPROD(i64, i64)
CUMSUM_CUMPROD(u32, u32)
CUMSUM_CUMPROD(u64, u64)

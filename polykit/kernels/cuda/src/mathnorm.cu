// LpNormalization (p = 1 or 2, one axis) and MeanVarianceNormalization (any axes).
//
// x is contiguous; the host splits its dims into kept and reduced runs (<= 4 of each after
// merging neighbours, dims innermost first, padded with size 1 / stride 0): an output group
// o (a kept index) covers the R elements base(o) + offset(r), r < R.
//   mode 0: y = x / sum|x|          mode 1: y = x / sqrt(sum x^2)   (a zero norm gives 0)
//   mode 2: y = (x - mean) / (std + 1e-9), std = sqrt(mean((x - mean)^2)) (two-pass)
// mathnorm_rows_<T>: one block per group (grid-stride), blockDim in {32..256} from R,
//   deterministic block reductions (blockreduce.cuh); consecutive threads take consecutive r
//   (coalesced when the innermost dim is reduced).
// mathnorm_cols_<T>: one thread per group, serial passes over R; used when the innermost dim
//   is kept, so consecutive threads read consecutive elements (coalesced).
// Math in fp32 for fp16/fp32 storage, fp64 for double.
#include "blockreduce.cuh"

__device__ __forceinline__ float mn_sqrt(float v) { return sqrtf(v); }
__device__ __forceinline__ double mn_sqrt(double v) { return sqrt(v); }

struct MnGeo { i64 kd[4], ks[4], rd[4], rs[4]; };

__device__ __forceinline__ i64 mn_offset(i64 i, const i64* dims, const i64* strides) {
  i64 off = 0;
#pragma unroll
  for (int d = 0; d < 4; ++d) {
    const i64 q = i / dims[d];
    off += (i - q * dims[d]) * strides[d];
    i = q;
  }
  return off;
}

template <class C>
__device__ __forceinline__ C mn_term(C v, int mode) { return mode == 0 ? (v < (C)0 ? -v : v) : v * v; }

template <class C>
__device__ __forceinline__ C mn_apply(C v, C a, C b, int mode) {
  if (mode == 2) return (v - a) / b;
  return a == (C)0 ? (C)0 : v / a;
}

template <class T>
__device__ void mathnorm_rows(const T* __restrict__ x, T* __restrict__ y, const MnGeo& g, i64 groups, i64 R,
                              int mode) {
  typedef typename Compute<T>::type C;
  __shared__ C smem[32];
  for (i64 o = blockIdx.x; o < groups; o += gridDim.x) {
    const i64 base = mn_offset(o, g.kd, g.ks);
    C acc = 0;
    for (i64 r = threadIdx.x; r < R; r += blockDim.x) {
      const C v = ld(x, base + mn_offset(r, g.rd, g.rs));
      acc += mode == 2 ? v : mn_term(v, mode);
    }
    acc = block_reduce(acc, OpSum(), (C)0, smem);
    C a, b = 0;
    if (mode == 2) {
      a = acc / (C)R;
      C dev = 0;
      for (i64 r = threadIdx.x; r < R; r += blockDim.x) {
        const C v = ld(x, base + mn_offset(r, g.rd, g.rs)) - a;
        dev += v * v;
      }
      dev = block_reduce(dev, OpSum(), (C)0, smem);
      b = mn_sqrt(dev / (C)R) + (C)1e-9;
    } else {
      a = mode == 1 ? mn_sqrt(acc) : acc;
    }
    for (i64 r = threadIdx.x; r < R; r += blockDim.x) {
      const i64 off = base + mn_offset(r, g.rd, g.rs);
      st(y, off, mn_apply(ld(x, off), a, b, mode));
    }
  }
}

template <class T>
__device__ void mathnorm_cols(const T* __restrict__ x, T* __restrict__ y, const MnGeo& g, i64 groups, i64 R,
                              int mode) {
  typedef typename Compute<T>::type C;
  for (i64 o = blockIdx.x * (i64)blockDim.x + threadIdx.x; o < groups; o += (i64)gridDim.x * blockDim.x) {
    const i64 base = mn_offset(o, g.kd, g.ks);
    C acc = 0;
    for (i64 r = 0; r < R; ++r) {
      const C v = ld(x, base + mn_offset(r, g.rd, g.rs));
      acc += mode == 2 ? v : mn_term(v, mode);
    }
    C a, b = 0;
    if (mode == 2) {
      a = acc / (C)R;
      C dev = 0;
      for (i64 r = 0; r < R; ++r) {
        const C v = ld(x, base + mn_offset(r, g.rd, g.rs)) - a;
        dev += v * v;
      }
      b = mn_sqrt(dev / (C)R) + (C)1e-9;
    } else {
      a = mode == 1 ? mn_sqrt(acc) : acc;
    }
    for (i64 r = 0; r < R; ++r) {
      const i64 off = base + mn_offset(r, g.rd, g.rs);
      st(y, off, mn_apply(ld(x, off), a, b, mode));
    }
  }
}

#define MN_ARGS                                                                                        \
  i64 groups, i64 R, i64 mode, i64 kd0, i64 kd1, i64 kd2, i64 kd3, i64 ks0, i64 ks1, i64 ks2, i64 ks3, \
      i64 rd0, i64 rd1, i64 rd2, i64 rd3, i64 rs0, i64 rs1, i64 rs2, i64 rs3
#define MN_GEO \
  const MnGeo g = {{kd0, kd1, kd2, kd3}, {ks0, ks1, ks2, ks3}, {rd0, rd1, rd2, rd3}, {rs0, rs1, rs2, rs3}};
#define MATHNORM(T, code)                                                                                       \
  extern "C" __global__ void mathnorm_rows_##code(const T* x, T* y, MN_ARGS) {                                  \
    MN_GEO mathnorm_rows<T>(x, y, g, groups, R, (int)mode);                                                     \
  }                                                                                                             \
  extern "C" __global__ void mathnorm_cols_##code(const T* x, T* y, MN_ARGS) {                                  \
    MN_GEO mathnorm_cols<T>(x, y, g, groups, R, (int)mode);                                                     \
  }

MATHNORM(float, f32)
MATHNORM(half_t, f16)
MATHNORM(double, f64)

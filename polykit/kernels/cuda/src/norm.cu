// Normalizations: LayerNormalization, GroupNormalization, InstanceNormalization,
// RMSNormalization (norm_rows_<T>) and inference BatchNormalization (batchnorm_<T>).
//
// norm_rows: x viewed as [rows, L]; one block per row (grid-stride), blockDim in {32..256}
//   from L; pass 1 block-sums x -> mean, pass 2 block-sums (x - mean)^2 -> var (two-pass,
//   deterministic, fp32 math / fp64 for double), pass 3 writes
//   y = (x - mean) * rsqrt(var + eps) * scale[p] + bias[p] with p = ((row % G) * L + j) / D:
//   LayerNorm G=1, D=1 (scale over the normalized dims); Group/InstanceNorm D = spatial size,
//   G = groups (channels), so p is the channel. n_scale/n_bias == 1 broadcasts a scalar.
//   rms != 0: no mean subtraction, var = mean(x^2) (RMSNormalization).
//   Optional per-row outputs mean / inv_std (LayerNorm's 2nd/3rd outputs, float32 stash type).
// batchnorm: y = (x - mean[c]) * rsqrt(var[c] + eps) * scale[c] + bias[c], c = (i / inner) % C;
//   one thread per element, grid-stride; reads x once, writes y once.
//   A LayerNorm / RMSNorm with a row map (norm_row_map.cuh) runs norm_rows_map_<code>: it writes input
//   row `row` to output row rm_dest(row), and with an input map reads element j of row `row` at
//   x[im_elem(row, j)]; norm_rows_<code> (every other layer) has neither in its code.
#include "blockreduce.cuh"
#include "norm_row_map.cuh"

__device__ __forceinline__ float nm_rsqrt(float v) { return rsqrtf(v); }
__device__ __forceinline__ double nm_rsqrt(double v) { return 1.0 / sqrt(v); }

template <class T, class S, bool MAPS>
__device__ void norm_rows(const T* __restrict__ x, const S* __restrict__ scale, const S* __restrict__ bias,
                          T* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
                          i64 rows, i64 L, i64 G, i64 D, i64 n_scale, i64 n_bias, double eps, i64 rms,
                          const RowMap& map, const InMap& im) {
  typedef typename Compute<T>::type C;
  __shared__ C smem[32];
  for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {
    T* yr = y + (MAPS ? rm_dest(row, map) : row) * L;
    const T* xr = x + row * L;
    C mean = 0;
    if (!rms) {
      C s = 0;
      for (i64 j = threadIdx.x; j < L; j += blockDim.x) s += (MAPS ? ld(x, im_elem(row, j, L, im)) : ld(xr, j));
      mean = block_reduce(s, OpSum(), (C)0, smem) / (C)L;
    }
    C q = 0;
    for (i64 j = threadIdx.x; j < L; j += blockDim.x) {
      C d = (MAPS ? ld(x, im_elem(row, j, L, im)) : ld(xr, j)) - mean;
      q += d * d;
    }
    const C var = block_reduce(q, OpSum(), (C)0, smem) / (C)L;
    const C rstd = nm_rsqrt(var + (C)eps);
    const i64 gbase = (row % G) * L;
    for (i64 j = threadIdx.x; j < L; j += blockDim.x) {
      const i64 p = (gbase + j) / D;
      C v = ((MAPS ? ld(x, im_elem(row, j, L, im)) : ld(xr, j)) - mean) * rstd * (C)ld(scale, n_scale == 1 ? 0 : p);
      if (bias) v += (C)ld(bias, n_bias == 1 ? 0 : p);
      st(yr, j, v);
    }
    if (threadIdx.x == 0) {
      if (mean_out) mean_out[row] = (float)mean;
      if (rstd_out) rstd_out[row] = (float)rstd;
    }
  }
}

template <class T>
__device__ void batchnorm(const T* __restrict__ x, const T* __restrict__ scale, const T* __restrict__ bias,
                          const T* __restrict__ mean, const T* __restrict__ var, T* __restrict__ y,
                          i64 n, i64 C_, i64 inner, double eps) {
  typedef typename Compute<T>::type C;
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
    const i64 c = (i / inner) % C_;
    const C r = nm_rsqrt(ld(var, c) + (C)eps);
    st(y, i, (ld(x, i) - ld(mean, c)) * r * ld(scale, c) + ld(bias, c));
  }
}

#define NORM(T, code)                                                                                         \
  extern "C" __global__ void norm_rows_##code(const T* x, const T* scale, const T* bias, T* y, float* mean_out, \
                                              float* rstd_out, i64 rows, i64 L, i64 G, i64 D, i64 n_scale,      \
                                              i64 n_bias, double eps, i64 rms) {                                \
    const RowMap none = {};                                                                                    \
    norm_rows<T, T, false>(x, scale, bias, y, mean_out, rstd_out, rows, L, G, D, n_scale, n_bias, eps, rms,    \
                           none, InMap{none, 1, 0});                                                           \
  }                                                                                                            \
  extern "C" __global__ void norm_rows_map_##code(const T* x, const T* scale, const T* bias, T* y,             \
                                                  float* mean_out, float* rstd_out, i64 rows, i64 L, i64 G,    \
                                                  i64 D, i64 n_scale, i64 n_bias, double eps, i64 rms,         \
                                                  RM_PARAMS, IM_PARAMS) {                                      \
    norm_rows<T, T, true>(x, scale, bias, y, mean_out, rstd_out, rows, L, G, D, n_scale, n_bias, eps, rms,     \
                          rm_make(RM_ARGS), InMap{rm_make(IM_MAP_ARGS), im_seg, im_offset});                   \
  }                                                                                                            \
  extern "C" __global__ void batchnorm_##code(const T* x, const T* scale, const T* bias, const T* mean,         \
                                              const T* var, T* y, i64 n, i64 C_, i64 inner, double eps) {       \
    batchnorm<T>(x, scale, bias, mean, var, y, n, C_, inner, eps);                                             \
  }
NORM(float, f32)
NORM(half_t, f16)
NORM(double, f64)

// Resize: nearest and (N-)linear interpolation, every coordinate_transformation_mode except
// tf_crop_and_resize, every nearest_mode. Separable: each output coordinate on each axis maps
// to an input coordinate (in double, like the reference); linear blends the 2^k corners of
// the k axes that really interpolate. One thread per output element (grid-stride), output
// written contiguously.
// Per-axis scale: scales[slot_d] from the device `scales` input when given (slot_d >= 0),
// else the host value out_d / in_d (sizes input or untouched axes). align_corners and
// pytorch_half_pixel divide by the integer output length (spec's length_resized, as onnxruntime).
// coord: 0 half_pixel, 1 half_pixel_symmetric, 2 pytorch_half_pixel, 3 align_corners,
//        4 asymmetric, 5 tf_half_pixel_for_nn. nearest: 0 round_prefer_floor,
//        1 round_prefer_ceil, 2 floor, 3 ceil.
#include "dtypes.cuh"

#define STR8(p) i64 p##0, i64 p##1, i64 p##2, i64 p##3, i64 p##4, i64 p##5, i64 p##6, i64 p##7
#define DBL8(p) double p##0, double p##1, double p##2, double p##3, double p##4, double p##5, double p##6, double p##7
#define ARR8(T, name, p) const T name[8] = {p##0, p##1, p##2, p##3, p##4, p##5, p##6, p##7}

__device__ __forceinline__ double src_coord(int coord, double y, i64 out_len, i64 in_len, double scale) {
  const double out_f = scale * (double)in_len;
  switch (coord) {
    case 1: return (double)in_len / 2.0 * (1.0 - (double)out_len / out_f) + (y + 0.5) / scale - 0.5;
    case 2: return out_len == 1 ? 0.0 : (y + 0.5) / scale - 0.5;
    case 3: return out_len == 1 ? 0.0 : y * (double)(in_len - 1) / (double)(out_len - 1);
    case 4: return y / scale;
    case 5: return (y + 0.5) / scale;
    default: return (y + 0.5) / scale - 0.5;
  }
}

__device__ __forceinline__ i64 nearest(double x, int rule, i64 in_len) {
  const double base = floor(x), ratio = x - base;
  bool up = rule == 0 ? ratio > 0.5 : rule == 1 ? ratio >= 0.5 : rule == 2 ? false : ratio > 0;
  i64 k = (i64)base + (up ? 1 : 0);
  return k < 0 ? 0 : (k >= in_len ? in_len - 1 : k);
}

template <class T> __device__ __forceinline__ void st_(T* p, i64 i, double v) { st(p, i, (typename Compute<T>::type)v); }
__device__ __forceinline__ void st_(double* p, i64 i, double v) { p[i] = v; }
__device__ __forceinline__ void st_(u8* p, i64 i, double v) { v = rint(v); p[i] = (u8)(v < 0 ? 0 : (v > 255 ? 255 : v)); }

template <class T>
__device__ void resize(const T* __restrict__ x, T* __restrict__ y, const float* __restrict__ scales, i64 n, i64 rank,
                       const i64* in_d, const i64* out_d, const i64* slot, const double* host_scale, i64 linear,
                       i64 coord, i64 rule) {
  typedef typename Compute<T>::type C;
  double scale[8];
  i64 st[8], acc = 1;
  for (int d = (int)rank - 1; d >= 0; --d) {
    scale[d] = (scales && slot[d] >= 0) ? (double)scales[slot[d]] : host_scale[d];
    st[d] = acc;
    acc *= in_d[d];
  }
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
    i64 r = i, base = 0, lo[8], hi[8];
    double w[8];
    int k = 0;
    for (int d = (int)rank - 1; d >= 0; --d) {
      const i64 q = d ? r / out_d[d] : 0, c = r - q * out_d[d];
      r = q;
      if (in_d[d] == out_d[d] && scale[d] == 1.0) { base += c * st[d]; continue; }
      const double xs = src_coord((int)coord, (double)c, out_d[d], in_d[d], scale[d]);
      if (!linear) { base += nearest(xs, (int)rule, in_d[d]) * st[d]; continue; }
      const double f = floor(xs);
      i64 a = (i64)f, b = a + 1;
      a = a < 0 ? 0 : (a >= in_d[d] ? in_d[d] - 1 : a);
      b = b < 0 ? 0 : (b >= in_d[d] ? in_d[d] - 1 : b);
      lo[k] = a * st[d]; hi[k] = b * st[d]; w[k] = xs - f; ++k;
    }
    if (k == 0) { y[i] = x[base]; continue; }
    double v = 0;
    for (int m = 0; m < (1 << k); ++m) {
      double wt = 1.0;
      i64 off = base;
      for (int j = 0; j < k; ++j) {
        const bool up = (m >> j) & 1;
        wt *= up ? w[j] : 1.0 - w[j];
        off += up ? hi[j] : lo[j];
      }
      v += wt * (double)ld(x, off);
    }
    st_(y, i, v);
  }
}


#define RESIZE(T, code)                                                                                         \
  extern "C" __global__ void resize_##code(const T* x, T* y, const float* scales, i64 n, i64 rank, STR8(a),      \
                                           STR8(b), STR8(s), DBL8(h), i64 linear, i64 coord, i64 rule) {         \
    ARR8(i64, in_d, a); ARR8(i64, out_d, b); ARR8(i64, slot, s); ARR8(double, hs, h);                            \
    resize<T>(x, y, scales, n, rank, in_d, out_d, slot, hs, linear, coord, rule);                                \
  }
RESIZE(float, f32)
RESIZE(half_t, f16)
RESIZE(double, f64)
RESIZE(u8, u8)

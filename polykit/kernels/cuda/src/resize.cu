// Resize: nearest, (N-)linear and cubic interpolation with every coordinate_transformation_mode
// (tf_crop_and_resize with roi and extrapolation_value), every nearest_mode, antialias and
// exclude_outside -- the semantics of polykit/kernels/reference/resize.py, which resizes one
// axis at a time in float64.
//
// Separable: per output element, each resized axis d maps its output coordinate to an input
// coordinate xs (double). nearest picks one input index. linear/cubic weigh `ntaps` neighbours
// of xs (2 / 4 taps, widened by 1/scale when antialias downscales) with weights computed inline
// (normalized to sum 1 under antialias, outside taps dropped and renormalized under
// exclude_outside); the element is the sum over every combination of taps of the k axes that
// really interpolate (an odometer) of the product of their weights times the input there.
// tf_crop_and_resize: an element whose coordinate falls outside [0, in-1] on any axis is
// extrapolation_value (what the reference's axis-by-axis masking amounts to).
// Layout: contiguous x and y of the same rank (<= 8). One thread per output element,
// grid-stride loop; output written contiguously; math in double, one rounding on store.
//
// Per-axis scale (src): 0 the host value out_d/in_d (sizes input with stretch, untouched
// axes), 1 scales[slot_d] (device scales input, float32), 2/3 min/max over the resized axes of
// sizes[slot]/in (keep_aspect_ratio_policy not_larger/not_smaller, device sizes input).
// slot_d: position of axis d in the `axes` attribute (its index into scales/sizes/roi), -1 for
// an axis Resize leaves alone. roi (only read by tf_crop_and_resize): 0 none, 1 f32, 2 f64, 3 f16.
// coord: 0 half_pixel, 1 half_pixel_symmetric, 2 pytorch_half_pixel, 3 align_corners,
//        4 asymmetric, 5 tf_half_pixel_for_nn, 6 tf_crop_and_resize.
// nearest: 0 round_prefer_floor, 1 round_prefer_ceil, 2 floor, 3 ceil.
// empty: x has no element but y has some (an input axis of length 0): y is all zeros.
// ldy: elements between y's rows of out_d[rank - 1] elements (that dim when y is dense; a channels-last
// Concat's channel total where y is placed in its slice, resize.py): element i is stored at y_at(i).
//
// RESIZE_FAST 1 (resize.py's fast_axes decides): nearest / linear without antialias, exclude_outside,
// crop or an aspect policy, where at most two adjacent axes dh, dh + 1 = dw (dh -1: one axis dw)
// change length and every other axis keeps it. y is then [outer, OH, OW, inner] over x's
// [outer, IH, IW, inner]; a thread owns one column (ow, c) of y's rows (its W taps computed once)
// and walks rows (o, oh) (block (BX, BY); a block takes RESIZE_FAST_ROWS rows at a time, its first
// threads computing their H taps into shared memory, one row each; grid y striding). Weights, tap order,
// products and sums are the general path's, so both give the same bits. An axis other than dh / dw
// that a device scale could still resize (scales input, its value not 1) sends the whole launch,
// uniformly, down the general path.
#include "dtypes.cuh"

#define STR8(p) i64 p##0, i64 p##1, i64 p##2, i64 p##3, i64 p##4, i64 p##5, i64 p##6, i64 p##7
#define DBL8(p) double p##0, double p##1, double p##2, double p##3, double p##4, double p##5, double p##6, double p##7
// parameter p##d for a run-time d, by selects (registers) rather than an indexed array (local memory)
#define pick8(p, d)                                                                                          \
  ((d) == 0 ? p##0 : (d) == 1 ? p##1 : (d) == 2 ? p##2 : (d) == 3 ? p##3 : (d) == 4 ? p##4 : (d) == 5 ? p##5 \
   : (d) == 6 ? p##6 : p##7)
#define ARR8(T, name, p) const T name[8] = {p##0, p##1, p##2, p##3, p##4, p##5, p##6, p##7}

#define NEAREST 0
#define LINEAR 1
#define CUBIC 2

__device__ __forceinline__ double src_coord(int coord, double y, i64 out_len, i64 in_len, double scale, double r0,
                                            double r1) {
  switch (coord) {
    case 1: return (double)in_len / 2.0 * (1.0 - (double)out_len / (scale * (double)in_len)) + (y + 0.5) / scale - 0.5;
    case 2: return out_len == 1 ? 0.0 : (y + 0.5) / scale - 0.5;
    case 3: return out_len == 1 ? 0.0 : y * (double)(in_len - 1) / (double)(out_len - 1);
    case 4: return y / scale;
    case 5: return (y + 0.5) / scale;
    case 6: {
      const double x = out_len == 1 ? (r1 - r0) * (double)(in_len - 1) / 2.0
                                    : y * (r1 - r0) * (double)(in_len - 1) / (double)(out_len - 1);
      return x + r0 * (double)(in_len - 1);
    }
    default: return (y + 0.5) / scale - 0.5;
  }
}

__device__ __forceinline__ i64 nearest(double x, int rule, i64 in_len) {
  const double base = floor(x), ratio = x - base;
  bool up = rule == 0 ? ratio > 0.5 : rule == 1 ? ratio >= 0.5 : rule == 2 ? false : ratio > 0;
  i64 k = (i64)base + (up ? 1 : 0);
  return k < 0 ? 0 : (k >= in_len ? in_len - 1 : k);
}

// un-normalized filter weight of the tap at offset `off` from the pixel left of x
template <int MODE> __device__ __forceinline__ double raw_weight(i64 off, double ratio, double s, double a) {
  const double t = fabs(((double)off - ratio) * s);
  if (MODE == LINEAR) return t >= 1.0 ? 0.0 : 1.0 - t;
  if (t <= 1.0) return ((a + 2.0) * t - (a + 3.0)) * t * t + 1.0;
  if (t < 2.0) return ((a * t - 5.0 * a) * t + 8.0 * a) * t - 4.0 * a;
  return 0.0;
}

// roi value k (float64 as the reference reads it), `missing` when no roi was given
__device__ __forceinline__ double roi_at(const void* roi, i64 code, i64 k, double missing) {
  if (code == 1) return (double)((const float*)roi)[k];
  if (code == 2) return ((const double*)roi)[k];
  if (code == 3) return (double)h2f(((const half_t*)roi)[k]);
  return missing;
}

template <class T> __device__ __forceinline__ void st_(T* p, i64 i, double v) { st(p, i, v); }
__device__ __forceinline__ void st_(float* p, i64 i, double v) { p[i] = (float)v; }
__device__ __forceinline__ void st_(double* p, i64 i, double v) { p[i] = v; }
__device__ __forceinline__ void st_(u8* p, i64 i, double v) { v = rint(v); p[i] = (u8)(v < 0 ? 0 : (v > 255 ? 255 : v)); }
__device__ __forceinline__ void st_(i8* p, i64 i, double v) { v = rint(v); p[i] = (i8)(v < -128 ? -128 : (v > 127 ? 127 : v)); }

struct ResizeArgs {
  const float* scales;
  const i64* sizes;
  const void* roi;
  i64 roi_code, nax, n, rank, src, coord, rule, exclude, antialias, empty;
  double cubic_a, extrapolation;
  i64 row, ldy;  // y's last dim and the elements between its rows
  __device__ __forceinline__ i64 y_at(i64 i) const { return row == ldy ? i : i / row * ldy + i % row; }
};

// threads t0, t0 + tstep, ... of the launch take elements t0, t0 + tstep, ...
template <class T, int MODE>
__device__ void resize(const T* __restrict__ x, T* __restrict__ y, const ResizeArgs& p, const i64* in_d,
                       const i64* out_d, const i64* slot, const double* host_scale, i64 t0, i64 tstep) {
  const int rank = (int)p.rank;
  const bool crop = p.coord == 6;
  if (p.empty) {
    for (i64 i = t0; i < p.n; i += tstep) st_(y, p.y_at(i), 0.0);
    return;
  }
  double policy = p.src == 2 ? 1e300 : -1e300;
  if (p.src >= 2)
    for (int d = 0; d < rank; ++d)
      if (slot[d] >= 0) {
        const double r = (double)p.sizes[slot[d]] / (double)in_d[d];
        policy = p.src == 2 ? fmin(policy, r) : fmax(policy, r);
      }
  double scale[8], r0[8], r1[8];
  i64 stride[8], acc = 1;
  bool skip[8];
  for (int d = rank - 1; d >= 0; --d) {
    scale[d] = slot[d] < 0 ? host_scale[d] : p.src == 1 ? (double)p.scales[slot[d]] : p.src >= 2 ? policy : host_scale[d];
    r0[d] = crop && slot[d] >= 0 ? roi_at(p.roi, p.roi_code, slot[d], 0.0) : 0.0;
    r1[d] = crop && slot[d] >= 0 ? roi_at(p.roi, p.roi_code, p.nax + slot[d], 1.0) : 1.0;
    skip[d] = slot[d] < 0 || (in_d[d] == out_d[d] && scale[d] == 1.0 && (!crop || (r0[d] == 0.0 && r1[d] == 1.0)));
    stride[d] = acc;
    acc *= in_d[d];
  }
  for (i64 i = t0; i < p.n; i += tstep) {
    i64 r = i, base = 0;
    // per interpolating axis: leftmost tap index (unclamped), tap count, input length, stride
    i64 first[8], ntaps[8], len[8], step[8];
    double ratio[8], s[8], norm[8], div[8];
    int k = 0;
    bool outside = false;
    for (int d = rank - 1; d >= 0; --d) {
      const i64 q = d ? r / out_d[d] : 0, c = r - q * out_d[d];
      r = q;
      if (skip[d]) { base += c * stride[d]; continue; }
      const double xs = src_coord((int)p.coord, (double)c, out_d[d], in_d[d], scale[d], r0[d], r1[d]);
      if (crop && (xs < 0.0 || xs > (double)(in_d[d] - 1))) outside = true;
      if (MODE == NEAREST) { base += nearest(xs, (int)p.rule, in_d[d]) * stride[d]; continue; }
      double f = floor(xs), rt = xs - f;
      if (rt == 0.0) { rt = 1.0; f -= 1.0; }  // an exact pixel counts as ratio 1 from its left neighbour
      const bool aa = p.antialias && scale[d] < 1.0;
      const double sd = aa ? scale[d] : 1.0;
      const i64 start = (i64)floor(-(MODE == LINEAR ? 1.0 : 2.0) / sd) + 1;
      const i64 b = (i64)f;
      first[k] = b + start; ntaps[k] = 2 - 2 * start; len[k] = in_d[d]; step[k] = stride[d];
      ratio[k] = rt; s[k] = sd;
      double sum = 1.0, total = 1.0;
      if (aa) {
        sum = 0.0;
        for (i64 t = 0; t < ntaps[k]; ++t) sum += raw_weight<MODE>(start + t, rt, sd, p.cubic_a);
      }
      if (p.exclude) {
        total = 0.0;
        for (i64 t = 0; t < ntaps[k]; ++t) {
          const i64 at = first[k] + t;
          if (at >= 0 && at < in_d[d]) total += raw_weight<MODE>(start + t, rt, sd, p.cubic_a) / sum;
        }
        total = total == 0.0 ? 1.0 : total;
      }
      norm[k] = sum; div[k] = total;
      ++k;
    }
    if (outside) { st_(y, p.y_at(i), p.extrapolation); continue; }
    if (k == 0) { y[p.y_at(i)] = x[base]; continue; }
    i64 tap[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    double v = 0.0;
    for (;;) {
      double wt = 1.0;
      i64 off = base;
      for (int j = 0; j < k; ++j) {
        const i64 at = first[j] + tap[j];
        const i64 start = (2 - ntaps[j]) / 2;  // ntaps = 2 - 2 * start
        double w = raw_weight<MODE>(start + tap[j], ratio[j], s[j], p.cubic_a);
        if (norm[j] != 1.0) w /= norm[j];  // antialias only; x / 1 == x, so the division is skipped exactly
        if (p.exclude) w = (at >= 0 && at < len[j]) ? w / div[j] : 0.0;
        wt *= w;
        off += (at < 0 ? 0 : (at >= len[j] ? len[j] - 1 : at)) * step[j];
      }
      v += wt * (double)ld(x, off);
      int j = 0;
      for (; j < k; ++j) {
        if (++tap[j] < ntaps[j]) break;
        tap[j] = 0;
      }
      if (j == k) break;
    }
    st_(y, p.y_at(i), v);
  }
}

#if RESIZE_FAST
// one axis's two linear taps (clamped input indices, weights) or nearest index (i0) at output
// coordinate c: the general path's arithmetic for an interpolating axis without antialias / exclude
struct Taps {
  i64 i0, i1;
  double w0, w1;
};

template <int MODE>
__device__ __forceinline__ Taps axis_taps(int coord, int rule, i64 c, i64 out_len, i64 in_len, double scale) {
  const double xs = src_coord(coord, (double)c, out_len, in_len, scale, 0.0, 1.0);
  Taps t;
  if (MODE == NEAREST) {
    t.i0 = nearest(xs, rule, in_len);
    t.i1 = t.i0;
    t.w0 = 1.0;
    t.w1 = 0.0;
    return t;
  }
  double f = floor(xs), rt = xs - f;
  if (rt == 0.0) { rt = 1.0; f -= 1.0; }
  const i64 b = (i64)f;
  t.i0 = b < 0 ? 0 : (b >= in_len ? in_len - 1 : b);
  t.i1 = b + 1 < 0 ? 0 : (b + 1 >= in_len ? in_len - 1 : b + 1);
  t.w0 = raw_weight<MODE>(0, rt, 1.0, 0.0);
  t.w1 = raw_weight<MODE>(1, rt, 1.0, 0.0);
  return t;
}

// RESIZE_FAST_ROWS (define, resize.py's FAST_ROWS): rows a block takes at a time: their H taps are
// computed at once, one row a thread (the block has at least that many threads), then every thread
// walks its column down them

template <class T, int MODE>
__device__ void resize_fast(const T* __restrict__ x, T* __restrict__ y, const ResizeArgs& p, i64 IH, i64 IW, i64 OH,
                            i64 OW, double sh, double sw, bool one_axis, i64 outer, i64 inner) {
  // a row's H taps and input row offsets, computed once a row (not once an element: the double
  // division and 64-bit division a row cost ~100x an element's four loads and products), for
  // RESIZE_FAST_ROWS rows in parallel, so the block waits at one barrier pair per batch of rows
  __shared__ i64 row_at0[RESIZE_FAST_ROWS], row_at1[RESIZE_FAST_ROWS];
  __shared__ double row_w0[RESIZE_FAST_ROWS], row_w1[RESIZE_FAST_ROWS];
  const i64 cols = OW * inner, rows = outer * OH;
  const i64 col = blockIdx.x * (i64)blockDim.x + threadIdx.x;
  const bool live = col < cols;  // no early return: every thread reaches the barriers
  const i64 ow = live ? (inner == 1 ? col : col / inner) : 0, ch = live ? col - ow * inner : 0;
  const Taps tw = axis_taps<MODE>((int)p.coord, (int)p.rule, ow, OW, IW, sw);
  const i64 xw0 = tw.i0 * inner + ch, xw1 = tw.i1 * inner + ch;
  const int tid = threadIdx.y * blockDim.x + threadIdx.x;
  // the loop bound is the block's, so all its threads take the same trips
  for (i64 row0 = blockIdx.y * (i64)RESIZE_FAST_ROWS; row0 < rows; row0 += (i64)gridDim.y * RESIZE_FAST_ROWS) {
    const i64 batch = rows - row0 < RESIZE_FAST_ROWS ? rows - row0 : RESIZE_FAST_ROWS;
    if (tid < batch) {
      const i64 row = row0 + tid;
      if (one_axis) {
        row_at0[tid] = row_at1[tid] = row * IW * inner;
      } else {
        const i64 o = OH == 1 ? row : row / OH, oh = row - o * OH;
        const Taps th = axis_taps<MODE>((int)p.coord, (int)p.rule, oh, OH, IH, sh);
        row_at0[tid] = (o * IH + th.i0) * IW * inner;
        row_at1[tid] = (o * IH + th.i1) * IW * inner;
        row_w0[tid] = th.w0;
        row_w1[tid] = th.w1;
      }
    }
    __syncthreads();
    if (live)
      for (int r = threadIdx.y; r < batch; r += blockDim.y) {
        const i64 i = (row0 + r) * cols + col, r0 = row_at0[r];
        if (MODE == NEAREST) {
          y[p.y_at(i)] = x[r0 + xw0];
        } else if (one_axis) {
          double v = 0.0;
          v += tw.w0 * (double)ld(x, r0 + xw0);
          v += tw.w1 * (double)ld(x, r0 + xw1);
          st_(y, p.y_at(i), v);
        } else {
          // the general path's odometer: the W axis (innermost, k = 0) fastest; wt = (1 * w_w) * w_h
          const i64 r1 = row_at1[r];
          const double h0 = row_w0[r], h1 = row_w1[r];
          double v = 0.0, wt;
          wt = tw.w0 * h0;
          v += wt * (double)ld(x, r0 + xw0);
          wt = tw.w1 * h0;
          v += wt * (double)ld(x, r0 + xw1);
          wt = tw.w0 * h1;
          v += wt * (double)ld(x, r1 + xw0);
          wt = tw.w1 * h1;
          v += wt * (double)ld(x, r1 + xw1);
          st_(y, p.y_at(i), v);
        }
      }
    __syncthreads();
  }
}
#endif

// One kernel per compile unit: the tactic defines RESIZE_KERNEL (the name), RESIZE_T (the
// storage type), RESIZE_MODE (NEAREST / LINEAR / CUBIC) and RESIZE_FAST (0 / 1).
#ifndef RESIZE_FAST
#define RESIZE_FAST 0
#endif
#if RESIZE_FAST
#define RESIZE_FAST_PARAMS , i64 dh, i64 dw, i64 outer, i64 inner
#define RESIZE_FAST_ARGS , dh, dw, outer, inner
#else
#define RESIZE_FAST_PARAMS
#define RESIZE_FAST_ARGS
#endif
#define NAM8(p) p##0, p##1, p##2, p##3, p##4, p##5, p##6, p##7
// the parameter list and its names (tests/kernels/cuda/block_emulation.py launches the kernel by them)
#define RESIZE_PARAMS                                                                                         \
  const RESIZE_T *x, RESIZE_T *y, const float *scales, const i64 *sizes, const void *roi, i64 roi_code, i64 nax, \
      i64 n, i64 rank, STR8(a), STR8(b), STR8(s), DBL8(h), i64 src, i64 coord, i64 rule, double cubic_a,        \
      i64 exclude, i64 antialias, double extrapolation RESIZE_FAST_PARAMS, i64 empty, i64 ldy
#define RESIZE_ARGS                                                                                            \
  x, y, scales, sizes, roi, roi_code, nax, n, rank, NAM8(a), NAM8(b), NAM8(s), NAM8(h), src, coord, rule, cubic_a, \
      exclude, antialias, extrapolation RESIZE_FAST_ARGS, empty, ldy
extern "C" __global__ void RESIZE_KERNEL(RESIZE_PARAMS) {
#if RESIZE_FAST
  // only constant indices into the parameter arrays here (the loops unrolled, pick8): an array indexed
  // at run time lives in local memory, and its 32 stores a thread cost more than the thread's pixels
  const ResizeArgs pf = {scales, sizes, roi, roi_code, nax, n, rank, src, coord, rule, exclude, antialias, empty,
                         cubic_a, extrapolation, pick8(b, rank - 1), ldy};
  bool general = false;  // an axis the host could not rule out: its device scale resizes it
  if (src == 1) {
#pragma unroll
    for (int d = 0; d < 8; ++d) {
      const i64 sd = pick8(s, d);
      if (d < rank && d != dh && d != dw && sd >= 0 && scales[sd] != 1.0f) general = true;
    }
  }
  if (!general) {
    const bool one = dh < 0;
    const i64 hd = one ? dw : dh, slot_w = pick8(s, dw), slot_h = pick8(s, hd);
    const double sw = src == 1 ? (double)scales[slot_w] : pick8(h, dw);
    const double sh = one ? 1.0 : src == 1 ? (double)scales[slot_h] : pick8(h, hd);
    resize_fast<RESIZE_T, RESIZE_MODE>(x, y, pf, one ? 1 : pick8(a, hd), pick8(a, dw), one ? 1 : pick8(b, hd),
                                       pick8(b, dw), sh, sw, one, outer, inner);
    return;
  }
#endif
  ARR8(i64, in_d, a); ARR8(i64, out_d, b); ARR8(i64, slot, s); ARR8(double, hs, h);
  const ResizeArgs p = {scales, sizes, roi, roi_code, nax, n, rank, src, coord, rule, exclude, antialias, empty,
                        cubic_a, extrapolation, out_d[rank - 1], ldy};
#if RESIZE_FAST
  const i64 threads = (i64)blockDim.x * blockDim.y, t0 = ((i64)blockIdx.y * gridDim.x + blockIdx.x) * threads +
                      threadIdx.y * blockDim.x + threadIdx.x;
  resize<RESIZE_T, RESIZE_MODE>(x, y, p, in_d, out_d, slot, hs, t0, threads * gridDim.x * gridDim.y);
#else
  resize<RESIZE_T, RESIZE_MODE>(x, y, p, in_d, out_d, slot, hs, blockIdx.x * (i64)blockDim.x + threadIdx.x,
                                (i64)gridDim.x * blockDim.x);
#endif
}

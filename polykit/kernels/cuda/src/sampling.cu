// GridSample, AffineGrid and DeformConv's sampling (float32).
//
// grid_sample: Y (N, C, oD, oH, oW) from X (N, C, D, H, W) at grid (N, oD, oH, oW, r) (2-D: D = oD = 1,
//   r = 2; the grid lists x (W) first). mode 0 nearest (round half to even), 1 linear, 2 cubic (2-D,
//   A = -0.75); padding 0 zeros, 1 border, 2 reflection; coordinates in float32 with explicit
//   rounding (no FMA contraction) so nearest ties match the reference.
// affine_grid: grid (N, [D,] H, W, r) = theta (N, r, r + 1) x (x, y, [z,] 1) of each output point.
// deform_im2col: cols (N, C*kH*kW, oH*oW) = X bilinearly sampled (zero outside) at each tap moved by
//   its offset (N, og*kH*kW*2, oH, oW; dy then dx), times mask (N, og*kH*kW, oH, oW) when given; a
//   GEMM (gemm.cu) then multiplies W (M, C/group*kH*kW) by each group's rows, deform_bias adds B.
// Launch: every kernel is a grid-stride loop over its outputs, block 256.
#include "dtypes.cuh"

__device__ __forceinline__ float unnormalize(float g, i64 L, i64 align) {
  // (g + 1) / 2 * (L - 1)  or  ((g + 1) * L - 1) / 2, rounded step by step as numpy does
  const float gp = __fadd_rn(g, 1.f);
  return align ? __fmul_rn(__fdiv_rn(gp, 2.f), (float)(L - 1)) : __fdiv_rn(__fsub_rn(__fmul_rn(gp, (float)L), 1.f), 2.f);
}

__device__ __forceinline__ double reflect(double x, double lo, double hi) {
  const double span = hi - lo;
  if (span <= 0) return lo;
  if (x >= lo && x <= hi) return x;
  const bool below = x < lo;
  const double dx = below ? lo - x : x - hi;
  const double n = floor(dx / span), r = dx - n * span;
  const bool even = fmod(n, 2.0) == 0.0;
  return below ? (even ? lo + r : hi - r) : (even ? hi - r : lo + r);
}

struct Axis {
  i64 L;
  double lo, hi;
};

__device__ __forceinline__ Axis axis_of(i64 L, i64 align) {
  Axis a;
  a.L = L;
  a.lo = align ? 0.0 : -0.5;
  a.hi = align ? (double)(L - 1) : (double)L - 0.5;
  return a;
}

// coordinate of one axis after the padding rule moved it into range (border / reflection)
__device__ __forceinline__ float place(float c, const Axis& a, i64 padding) {
  if (c >= a.lo && c <= a.hi) return c;
  if (padding == 1) return fminf(fmaxf(c, 0.f), (float)(a.L - 1));
  if (padding == 2) return (float)reflect(c, a.lo, a.hi);
  return c;
}

// index k of one axis under the padding rule; false: the tap reads zero
__device__ __forceinline__ bool tap(i64& k, const Axis& a, i64 padding) {
  if (padding == 0) return k >= 0 && k < a.L;
  if (padding == 2) k = (i64)reflect((double)k, a.lo, a.hi);
  k = k < 0 ? 0 : (k >= a.L ? a.L - 1 : k);
  return true;
}

__device__ __forceinline__ void cubic_weights(float t, float w[4]) {
  const float A = -0.75f;
  float d = t + 1.f;
  w[0] = ((A * d - 5.f * A) * d + 8.f * A) * d - 4.f * A;
  d = t;
  w[1] = ((A + 2.f) * d - (A + 3.f)) * d * d + 1.f;
  d = 1.f - t;
  w[2] = ((A + 2.f) * d - (A + 3.f)) * d * d + 1.f;
  d = 2.f - t;
  w[3] = ((A * d - 5.f * A) * d + 8.f * A) * d - 4.f * A;
}

extern "C" __global__ void __launch_bounds__(256) grid_sample(
    const float* __restrict__ X, const float* __restrict__ grid, float* __restrict__ Y, i64 N, i64 C, i64 D, i64 H,
    i64 W, i64 oD, i64 oH, i64 oW, i64 r, i64 mode, i64 padding, i64 align) {
  const i64 total = N * C * oD * oH * oW, spatial = oD * oH * oW;
  const Axis ax[3] = {axis_of(W, align), axis_of(H, align), axis_of(D, align)};
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
    const i64 o = i % spatial, nc = i / spatial, n = nc / C;
    const float* g = grid + (n * spatial + o) * r;
    const float* img = X + nc * D * H * W;
    float c[3] = {0.f, 0.f, 0.f};
    for (int k = 0; k < r; ++k) {
      c[k] = unnormalize(g[k], ax[k].L, align);
      if (mode == 0) c[k] = rintf(c[k]);
      if (mode != 2 || padding != 1) c[k] = place(c[k], ax[k], padding);  // cubic border clamps its taps only
    }
    float acc = 0.f;
    if (mode == 0) {
      i64 k0 = (i64)c[0], k1 = (i64)c[1], k2 = r == 3 ? (i64)c[2] : 0;
      if (tap(k0, ax[0], padding) && tap(k1, ax[1], padding) && (r == 2 || tap(k2, ax[2], padding)))
        acc = img[(k2 * H + k1) * W + k0];
    } else if (mode == 1) {
      const i64 b0 = (i64)floorf(c[0]), b1 = (i64)floorf(c[1]), b2 = r == 3 ? (i64)floorf(c[2]) : 0;
      const float f0 = c[0] - b0, f1 = c[1] - b1, f2 = r == 3 ? c[2] - b2 : 0.f;
      for (int t = 0; t < (r == 3 ? 8 : 4); ++t) {
        const int d0 = t & 1, d1 = (t >> 1) & 1, d2 = t >> 2;
        i64 k0 = b0 + d0, k1 = b1 + d1, k2 = b2 + d2;
        const float w = (d0 ? f0 : 1.f - f0) * (d1 ? f1 : 1.f - f1) * (r == 3 ? (d2 ? f2 : 1.f - f2) : 1.f);
        if (tap(k0, ax[0], padding) && tap(k1, ax[1], padding) && (r == 2 || tap(k2, ax[2], padding)))
          acc += w * img[(k2 * H + k1) * W + k0];
      }
    } else {
      const i64 b0 = (i64)floorf(c[0]), b1 = (i64)floorf(c[1]);
      float wx[4], wy[4];
      cubic_weights(c[0] - b0, wx);
      cubic_weights(c[1] - b1, wy);
      for (int dy = 0; dy < 4; ++dy)
        for (int dx = 0; dx < 4; ++dx) {
          i64 k0 = b0 + dx - 1, k1 = b1 + dy - 1;
          if (tap(k0, ax[0], padding) && tap(k1, ax[1], padding)) acc += wx[dx] * wy[dy] * img[k1 * W + k0];
        }
    }
    Y[i] = acc;
  }
}

extern "C" __global__ void __launch_bounds__(256) affine_grid(
    const float* __restrict__ theta, float* __restrict__ G, i64 N, i64 D, i64 H, i64 W, i64 r, i64 align) {
  const i64 points = D * H * W;
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < N * points; i += (i64)gridDim.x * blockDim.x) {
    const i64 n = i / points, p = i % points;
    const i64 idx[3] = {p % W, (p / W) % H, p / (W * H)};
    const i64 len[3] = {W, H, D};
    float base[4];
    for (int k = 0; k < r; ++k)
      base[k] = align ? (len[k] == 1 ? -1.f : -1.f + 2.f * idx[k] / (float)(len[k] - 1))
                      : (2.f * idx[k] + 1.f) / (float)len[k] - 1.f;
    base[r] = 1.f;
    const float* t = theta + n * r * (r + 1);
    for (int row = 0; row < r; ++row) {
      float v = 0.f;
      for (int k = 0; k <= r; ++k) v += t[row * (r + 1) + k] * base[k];
      G[i * r + row] = v;
    }
  }
}

extern "C" __global__ void __launch_bounds__(256) deform_im2col(
    const float* __restrict__ X, const float* __restrict__ offset, const float* __restrict__ mask,
    float* __restrict__ cols, i64 N, i64 C, i64 H, i64 W, i64 kH, i64 kW, i64 oH, i64 oW, i64 sh, i64 sw, i64 ph,
    i64 pw, i64 dh, i64 dw, i64 og) {
  const i64 L = oH * oW, total = N * C * kH * kW * L;
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
    const i64 l = i % L, row = (i / L) % (C * kH * kW), n = i / (L * C * kH * kW);
    const i64 c = row / (kH * kW), kk = row % (kH * kW), ki = kk / kW, kj = kk % kW;
    const i64 oy = l / oW, ox = l % oW, g = c / (C / og);
    const i64 tapi = g * kH * kW + kk;
    const float dy = offset[((n * og * kH * kW + tapi) * 2 + 0) * L + l];
    const float dx = offset[((n * og * kH * kW + tapi) * 2 + 1) * L + l];
    const float py = (float)(oy * sh - ph + ki * dh) + dy, px = (float)(ox * sw - pw + kj * dw) + dx;
    const float fy = floorf(py), fx = floorf(px);
    const i64 y0 = (i64)fy, x0 = (i64)fx;
    const float ly = py - fy, lx = px - fx;
    const float* img = X + (n * C + c) * H * W;
    float v = 0.f;
    for (int t = 0; t < 4; ++t) {
      const i64 yy = y0 + (t >> 1), xx = x0 + (t & 1);
      if (yy >= 0 && yy < H && xx >= 0 && xx < W)
        v += ((t >> 1) ? ly : 1.f - ly) * ((t & 1) ? lx : 1.f - lx) * img[yy * W + xx];
    }
    if (mask) v *= mask[(n * og * kH * kW + tapi) * L + l];
    cols[i] = v;
  }
}

extern "C" __global__ void __launch_bounds__(256) deform_bias(float* __restrict__ Y, const float* __restrict__ B,
                                                              i64 total, i64 M, i64 L) {
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x)
    Y[i] += B[(i / L) % M];
}

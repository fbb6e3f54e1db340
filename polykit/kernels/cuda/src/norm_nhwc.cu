// Channels-last group / instance normalization (ai.polykit GroupNormNHWC; cuda.norm_nhwc, norm_nhwc.py).
//
// X, Y [N, P, C] (P = the pixels: L of a 1-D conv's output, H * W of a 2-D one), G groups of
// CG = C / G consecutive channels; scale, bias [C] of X's type; statistics in fp32 per (n, group) over
// the P * CG elements of the group, strided by C. Three launches (no memset: every workspace value is
// written before it is read, in each run and CUDA-graph replay):
//
// gn_nhwc_partials, grid (S, CT, N), NG_THREADS threads: block (s, t, n) walks pixels [s * chunk,
//   min(P, (s + 1) * chunk)) of sample n over channel tile t: thread (lx, ly) = (tid % tx, tid / tx)
//   owns channels c0 = (t * tx + lx) * NG_VEC .. + NG_VEC (16-byte loads when NG_VEC > 1: the host
//   checks C % NG_VEC == 0 and 16-byte aligned X) and pixels p = s * chunk + ly, + NG_THREADS / tx, ...,
//   keeping a Welford mean and M2 per channel; the rows of threads combine theirs (Chan's formula, row
//   order 0, 1, ...) through shared memory into the chunk's per-channel mean and M2 at
//   ws[((n * S + s) * C + c) * 2 + {0, 1}]. Per channel, not per group, so tiles need not align with
//   groups and any CG (1 for InstanceNorm) keeps the 16-byte loads along C.
// gn_nhwc_stats, grid (G, N), NG_THREADS threads: block (g, n) combines the S * CG partials of its
//   group (entry e = s * CG + j; thread i takes e = i, i + NG_THREADS, ... then a fixed-order tree over
//   the threads): mean and rstd = rsqrt(M2 / count + eps) at stats[(n * G + g) * 2 + {0, 1}]. The
//   combine order depends on the shapes only: the same bits every run.
// gn_nhwc_apply, grid-stride over NG_VEC-element vectors of Y: y = act((x - mean) * rstd * scale[c] + bias[c]),
//   act the layer's `activation` (NG_ACT; none by default) on the normalized value rounded to ELEM (as
//   the unfused norm stored it), pointwise.cuh's functions in fp32, the result rounded once at the store.
//
// Defines: ELEM (float, half_t, bf16_t), NG_VEC (1, or 16 / sizeof(ELEM)), NG_ACT (the index of the
// activation in group_norm_nhwc.NORM_ACTIVATIONS: 0 none, 1 relu, 2 sigmoid, 3 tanh, 4 silu, 5 gelu (erf;
// PK_GELU16 with 16-bit ELEM), 6 gelu_tanh; the apply kernel only).
#include "dtypes.cuh"
#ifndef NG_ACT
#define NG_ACT 0
#endif
#if NG_ACT
#include "pointwise.cuh"
#endif

#ifndef ELEM
#define ELEM half_t
#endif
#ifndef NG_VEC
#define NG_VEC 1
#endif
#define NG_THREADS 256

// the activation of the apply kernel on a normalized value (float)
__device__ __forceinline__ float ng_act(float v) {
#if NG_ACT == 0
  return v;
#else
  v = round_as<ELEM>(v);
#if NG_ACT == 1
  return pk_relu(v);
#elif NG_ACT == 2
  return pk_sigmoid(v);
#elif NG_ACT == 3
  return pk_tanh(v);
#elif NG_ACT == 4
  return v * pk_sigmoid(v);
#elif NG_ACT == 5
  return pk_gelu(v);
#elif NG_ACT == 6
  return pk_gelu_tanh(v);
#else
#error "NG_ACT: an index of group_norm_nhwc.NORM_ACTIVATIONS (0 .. 6)"
#endif
#endif
}

struct alignas(sizeof(ELEM) * NG_VEC) NgPack {
  ELEM v[NG_VEC];
};

// (k, mean, m2) += (kb, mb, qb): Chan's parallel combination of two Welford states
__device__ __forceinline__ void ng_merge(float& k, float& m, float& q, float kb, float mb, float qb) {
  if (kb == 0.f) return;
  const float n = k + kb, d = mb - m, w = kb / n;
  m += d * w;
  q += qb + d * d * k * w;
  k = n;
}

extern "C" __global__ void gn_nhwc_partials(const ELEM* __restrict__ x, float* __restrict__ ws, i64 P, int C,
                                            int S, i64 chunk, int tx) {
  extern __shared__ float ng_sh[];  // [rows][tx * NG_VEC] means, then as many M2s, then [rows] counts
  const int rows = NG_THREADS / tx, lx = threadIdx.x % tx, ly = threadIdx.x / tx;
  const int width = tx * NG_VEC;
  float* sh_m = ng_sh;
  float* sh_q = ng_sh + rows * width;
  float* sh_k = ng_sh + 2 * rows * width;
  const i64 n = blockIdx.z, s = blockIdx.x;
  const int c0 = (blockIdx.y * tx + lx) * NG_VEC;
  const i64 p0 = s * chunk, p1 = min(P, p0 + chunk);
  float m[NG_VEC], q[NG_VEC], k = 0.f;
#pragma unroll
  for (int e = 0; e < NG_VEC; ++e) m[e] = q[e] = 0.f;
  if (c0 < C) {
    for (i64 p = p0 + ly; p < p1; p += rows) {
      const NgPack v = *(const NgPack*)(x + (n * P + p) * C + c0);
      k += 1.f;
      const float inv = 1.f / k;
#pragma unroll
      for (int e = 0; e < NG_VEC; ++e) {
        const float xv = (float)ld(v.v, e), d = xv - m[e];
        m[e] += d * inv;
        q[e] += d * (xv - m[e]);
      }
    }
  } else {
    for (i64 p = p0 + ly; p < p1; p += rows) k += 1.f;  // every row's count, whether its lanes hold channels
  }
#pragma unroll
  for (int e = 0; e < NG_VEC; ++e) {
    sh_m[ly * width + lx * NG_VEC + e] = m[e];
    sh_q[ly * width + lx * NG_VEC + e] = q[e];
  }
  if (lx == 0) sh_k[ly] = k;
  __syncthreads();
  if (ly != 0 || c0 >= C) return;
#pragma unroll
  for (int e = 0; e < NG_VEC; ++e) {
    float kk = sh_k[0], mm = m[e], qq = q[e];
    for (int r = 1; r < rows; ++r) {
      const int at = r * width + lx * NG_VEC + e;
      ng_merge(kk, mm, qq, sh_k[r], sh_m[at], sh_q[at]);
    }
    float* out = ws + ((n * S + s) * C + c0 + e) * 2;
    out[0] = mm;
    out[1] = qq;
  }
}

extern "C" __global__ void gn_nhwc_stats(const float* __restrict__ ws, float* __restrict__ stats, i64 P, int C,
                                         int G, int S, i64 chunk, float eps) {
  __shared__ float sk[NG_THREADS], sm[NG_THREADS], sq[NG_THREADS];
  const int g = blockIdx.x, cg = C / G;
  const i64 n = blockIdx.y, entries = (i64)S * cg;
  float k = 0.f, m = 0.f, q = 0.f;
  for (i64 e = threadIdx.x; e < entries; e += NG_THREADS) {
    const i64 s = e / cg, c = (i64)g * cg + e % cg;
    const float* part = ws + ((n * S + s) * C + c) * 2;
    ng_merge(k, m, q, (float)(min(P, (s + 1) * chunk) - s * chunk), part[0], part[1]);
  }
  sk[threadIdx.x] = k;
  sm[threadIdx.x] = m;
  sq[threadIdx.x] = q;
  __syncthreads();
  for (int half = NG_THREADS / 2; half > 0; half >>= 1) {
    if (threadIdx.x < half) {
      float kk = sk[threadIdx.x], mm = sm[threadIdx.x], qq = sq[threadIdx.x];
      ng_merge(kk, mm, qq, sk[threadIdx.x + half], sm[threadIdx.x + half], sq[threadIdx.x + half]);
      sk[threadIdx.x] = kk;
      sm[threadIdx.x] = mm;
      sq[threadIdx.x] = qq;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    stats[(n * G + g) * 2] = sm[0];
    stats[(n * G + g) * 2 + 1] = rsqrtf(sq[0] / sk[0] + eps);
  }
}

extern "C" __global__ void gn_nhwc_apply(const ELEM* __restrict__ x, const float* __restrict__ stats,
                                         const ELEM* __restrict__ scale, const ELEM* __restrict__ bias,
                                         ELEM* __restrict__ y, i64 vectors, i64 PC, int C, int G) {
  const int cg = C / G;
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < vectors; i += (i64)gridDim.x * blockDim.x) {
    const i64 first = i * NG_VEC, n = first / PC;
    const int c0 = (int)(first % C);
    const NgPack v = *(const NgPack*)(x + first);
    NgPack out;
#pragma unroll
    for (int e = 0; e < NG_VEC; ++e) {
      const int c = c0 + e;
      const float* st_ = stats + (n * G + c / cg) * 2;
      st(out.v, e, ng_act(((float)ld(v.v, e) - st_[0]) * st_[1] * (float)ld(scale, c) + (float)ld(bias, c)));
    }
    *(NgPack*)(y + first) = out;
  }
}

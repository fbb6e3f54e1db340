// Integer products: MatMulInteger and ConvInteger (int8/uint8 operands, int32 accumulate and
// output, zero points subtracted on load; int32 wraps exactly as the reference's int64 result
// cast to int32 does).
//
// mmi_<a>_<b>: Y[b, m, n] = sum_k (A[b, m, k] - azp) * (B[b, k, n] - bzp); azp is none (azp_n 0),
//   one value (1) or one per row of A (M); bzp none, one, or one per column of B (N).
//   16x16 output tile per block (block 16x16), K walked in 16-wide shared-memory tiles; grid
//   (ceil(N/16), ceil(M/16), min(batch, 65535)) with a loop over further batches. Batch dims
//   (at most 6, broadcast) give A and B offsets through strides (0 on broadcast dims).
// convi_<x>_<w>: direct NC(D)HW convolution, one thread per output element (1-D grid-stride);
//   1-3 spatial dims mapped onto D x H x W; padded positions contribute 0 (i.e. x's zero point).
#include "dtypes.cuh"

#define T 16
#define STR6(p) i64 p##0, i64 p##1, i64 p##2, i64 p##3, i64 p##4, i64 p##5
#define ARR6(name, p) const i64 name[6] = {p##0, p##1, p##2, p##3, p##4, p##5}

template <class TA, class TB>
__device__ void mmi(const TA* __restrict__ A, const TB* __restrict__ B, const TA* azp, i64 azp_n, const TB* bzp,
                    i64 bzp_n, i32* __restrict__ Y, i64 M, i64 N, i64 K, i64 nbatch, i64 nb, const i64* bd,
                    const i64* sa, const i64* sb) {
  __shared__ i32 As[T][T + 1];
  __shared__ i32 Bs[T][T + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const i64 m = blockIdx.y * (i64)T + ty, n = blockIdx.x * (i64)T + tx;
  for (i64 b = blockIdx.z; b < nbatch; b += gridDim.z) {
    i64 oa = 0, ob = 0, r = b;
    for (int d = (int)nb - 1; d >= 0; --d) {
      const i64 q = r / bd[d], c = r - q * bd[d];
      oa += c * sa[d];
      ob += c * sb[d];
      r = q;
    }
    const TA* a = A + oa;
    const TB* bm = B + ob;
    u32 acc = 0;  // unsigned: wraps like the reference's int64 -> int32 cast, without signed overflow
    for (i64 k0 = 0; k0 < K; k0 += T) {
      const i64 ka = k0 + tx, kb = k0 + ty;
      i32 va = 0, vb = 0;
      if (m < M && ka < K) {
        va = (i32)a[m * K + ka];
        if (azp_n) va -= (i32)azp[azp_n == 1 ? 0 : m];
      }
      if (n < N && kb < K) {
        vb = (i32)bm[kb * N + n];
        if (bzp_n) vb -= (i32)bzp[bzp_n == 1 ? 0 : n];
      }
      As[ty][tx] = va;
      Bs[ty][tx] = vb;
      __syncthreads();
#pragma unroll
      for (int k = 0; k < T; ++k) acc += (u32)(As[ty][k] * Bs[k][tx]);
      __syncthreads();
    }
    if (m < M && n < N) Y[(b * M + m) * N + n] = (i32)acc;
  }
}

template <class TX, class TW>
__device__ void convi(const TX* __restrict__ X, const TW* __restrict__ W, const TX* xzp, const TW* wzp, i64 wzp_n,
                      i32* __restrict__ Y, i64 NB, i64 C, i64 D, i64 H, i64 Wd, i64 M, i64 OD, i64 OH, i64 OW, i64 KD,
                      i64 KH, i64 KW, i64 sd, i64 sh, i64 sw, i64 pd, i64 ph, i64 pw, i64 dd, i64 dh, i64 dw, i64 G) {
  const i64 total = NB * M * OD * OH * OW;
  const i64 cg = C / G, mg = M / G;
  const i32 xz = xzp ? (i32)xzp[0] : 0;
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
    i64 r = i;
    const i64 ow = r % OW; r /= OW;
    const i64 oh = r % OH; r /= OH;
    const i64 od = r % OD; r /= OD;
    const i64 m = r % M, nb = r / M;
    const i64 g = m / mg;
    const i32 wz = wzp_n ? (i32)wzp[wzp_n == 1 ? 0 : m] : 0;
    u32 acc = 0;
    for (i64 c = 0; c < cg; ++c) {
      const TX* x = X + (nb * C + g * cg + c) * D * H * Wd;
      const TW* w = W + (m * cg + c) * KD * KH * KW;
      for (i64 kd = 0; kd < KD; ++kd) {
        const i64 id = od * sd - pd + kd * dd;
        if (id < 0 || id >= D) continue;
        for (i64 kh = 0; kh < KH; ++kh) {
          const i64 ih = oh * sh - ph + kh * dh;
          if (ih < 0 || ih >= H) continue;
          for (i64 kw = 0; kw < KW; ++kw) {
            const i64 iw = ow * sw - pw + kw * dw;
            if (iw < 0 || iw >= Wd) continue;
            acc += (u32)(((i32)x[(id * H + ih) * Wd + iw] - xz) * ((i32)w[(kd * KH + kh) * KW + kw] - wz));
          }
        }
      }
    }
    Y[i] = (i32)acc;
  }
}

#define PAIR(TA, a, TB, b)                                                                                        \
  extern "C" __global__ void __launch_bounds__(T * T) mmi_##a##_##b(                                              \
      const TA* A, const TB* B, const TA* azp, i64 azp_n, const TB* bzp, i64 bzp_n, i32* Y, i64 M, i64 N, i64 K,  \
      i64 nbatch, i64 nb, STR6(d), STR6(s), STR6(t)) {                                                            \
    ARR6(bd, d); ARR6(sa, s); ARR6(sb, t);                                                                        \
    mmi<TA, TB>(A, B, azp, azp_n, bzp, bzp_n, Y, M, N, K, nbatch, nb, bd, sa, sb);                                \
  }                                                                                                               \
  extern "C" __global__ void __launch_bounds__(256) convi_##a##_##b(                                             \
      const TA* X, const TB* W, const TA* xzp, const TB* wzp, i64 wzp_n, i32* Y, i64 NB, i64 C, i64 D, i64 H,     \
      i64 Wd, i64 M, i64 OD, i64 OH, i64 OW, i64 KD, i64 KH, i64 KW, i64 sd, i64 sh, i64 sw, i64 pd, i64 ph,      \
      i64 pw, i64 dd, i64 dh, i64 dw, i64 G) {                                                                    \
    convi<TA, TB>(X, W, xzp, wzp, wzp_n, Y, NB, C, D, H, Wd, M, OD, OH, OW, KD, KH, KW, sd, sh, sw, pd, ph, pw,   \
                  dd, dh, dw, G);                                                                                 \
  }
PAIR(i8, i8, i8, i8)
PAIR(i8, i8, u8, u8)
PAIR(u8, u8, i8, i8)
PAIR(u8, u8, u8, u8)

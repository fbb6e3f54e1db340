// GEMM main loops shared by the gemm and conv families (implicit GEMM).
//
// A "problem" P describes one batched product D[z] = op(A[z]) (M x K) * op(B[z]) (K x N):
//   P.M, P.N, P.K                    sizes (per batch item z = blockIdx.z)
//   float P.a(z, m, k), P.b(z, k, n) element loaders (called only in range)
//   void  P.store(z, m, n, acc)      writes one fp32 accumulator (bias/alpha/epilogue inside)
// Loaders return fp32 (half inputs convert exactly); accumulation is always fp32.
#pragma once
#include "dtypes.cuh"

// ---- SIMT fp32 tiles ---------------------------------------------------------------------
// Block: (BM/TM)*(BN/TN) threads; each thread owns a TM x TN micro-tile, rows ty + i*(BM/TM),
// cols tx + j*(BN/TN) (strided so shared-memory reads are conflict-free broadcasts).
// Grid: (ceil(N/BN), ceil(M/BM), batch).
template <class P, int BM, int BN, int BK, int TM, int TN>
__device__ __forceinline__ void simt_gemm(const P& p) {
  constexpr int TX = BN / TN, TY = BM / TM, NT = TX * TY;
  __shared__ float As[BK][BM + 1];
  __shared__ float Bs[BK][BN + 1];
  const int tid = threadIdx.x, tx = tid % TX, ty = tid / TX;
  const i64 z = blockIdx.z, m0 = (i64)blockIdx.y * BM, n0 = (i64)blockIdx.x * BN;
  float acc[TM][TN];
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;
  for (i64 k0 = 0; k0 < p.K; k0 += BK) {
    for (int idx = tid; idx < BM * BK; idx += NT) {
      const int mm = idx / BK, kk = idx % BK;
      const i64 m = m0 + mm, k = k0 + kk;
      As[kk][mm] = (m < p.M && k < p.K) ? p.a(z, m, k) : 0.f;
    }
    for (int idx = tid; idx < BN * BK; idx += NT) {
      const int kk = idx / BN, nn = idx % BN;
      const i64 n = n0 + nn, k = k0 + kk;
      Bs[kk][nn] = (n < p.N && k < p.K) ? p.b(z, k, n) : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
      float a[TM], b[TN];
#pragma unroll
      for (int i = 0; i < TM; ++i) a[i] = As[kk][ty + i * TY];
#pragma unroll
      for (int j = 0; j < TN; ++j) b[j] = Bs[kk][tx + j * TX];
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) {
      const i64 m = m0 + ty + i * TY, n = n0 + tx + j * TX;
      if (m < p.M && n < p.N) p.store(z, m, n, acc[i][j]);
    }
}

// ---- tensor-core fp16 tiles (mma.sync.m16n8k16, fp32 accumulate) ----------------------------
// Block: 8 warps as WM x WN = 2 x 4; block tile BM x BN = 128 x 128 (warp tile 64 x 32 =
// 4 x 4 mma tiles), BK = 32. A is staged as As[m][k], B transposed as Bs[n][k] (fp16),
// rows padded by 8 halves; fragments follow the PTX ISA m16n8k16 layouts.
// Grid: (ceil(N/128), ceil(M/128), batch); 256 threads.
#define MMA_BM 128
#define MMA_BN 128
#define MMA_BK 32
#define MMA_PAD 8

__device__ __forceinline__ void mma_16816(float* c, const u32* a, const u32* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <class P>
__device__ __forceinline__ void mma_gemm(const P& p) {
  __shared__ __align__(16) u16 As[MMA_BM][MMA_BK + MMA_PAD];
  __shared__ __align__(16) u16 Bs[MMA_BN][MMA_BK + MMA_PAD];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int wm = warp / 4, wn = warp % 4;           // warp position: 2 x 4
  const int grp = lane / 4, tig = lane % 4;
  const i64 z = blockIdx.z, m0 = (i64)blockIdx.y * MMA_BM, n0 = (i64)blockIdx.x * MMA_BN;
  float acc[4][4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.f;
  for (i64 k0 = 0; k0 < p.K; k0 += MMA_BK) {
    for (int idx = tid; idx < MMA_BM * MMA_BK; idx += 256) {
      const int mm = idx / MMA_BK, kk = idx % MMA_BK;
      const i64 m = m0 + mm, k = k0 + kk;
      As[mm][kk] = f2h((m < p.M && k < p.K) ? p.a(z, m, k) : 0.f).x;
    }
    for (int idx = tid; idx < MMA_BN * MMA_BK; idx += 256) {
      const int kk = idx / MMA_BN, nn = idx % MMA_BN;
      const i64 n = n0 + nn, k = k0 + kk;
      Bs[nn][kk] = f2h((n < p.N && k < p.K) ? p.b(z, k, n) : 0.f).x;
    }
    __syncthreads();
#pragma unroll
    for (int ks = 0; ks < MMA_BK; ks += 16) {
      u32 af[4][4], bf[4][2];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = wm * 64 + i * 16 + grp, c = ks + tig * 2;
        af[i][0] = *(const u32*)&As[r][c];
        af[i][1] = *(const u32*)&As[r + 8][c];
        af[i][2] = *(const u32*)&As[r][c + 8];
        af[i][3] = *(const u32*)&As[r + 8][c + 8];
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int n = wn * 32 + j * 8 + grp, c = ks + tig * 2;
        bf[j][0] = *(const u32*)&Bs[n][c];
        bf[j][1] = *(const u32*)&Bs[n][c + 8];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) mma_16816(acc[i][j], af[i], bf[j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const i64 m = m0 + wm * 64 + i * 16 + grp + (r >= 2 ? 8 : 0);
        const i64 n = n0 + wn * 32 + j * 8 + tig * 2 + (r & 1);
        if (m < p.M && n < p.N) p.store(z, m, n, acc[i][j][r]);
      }
}

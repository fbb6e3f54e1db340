// GEMM main loops shared by the gemm and conv families (implicit GEMM).
//
// A "problem" P describes one batched product D[z] = op(A[z]) (M x K) * op(B[z]) (K x N):
//   P.M, P.N, P.K                    sizes (per batch item z)
//   float P.a(z, m, k)               A element loader (called only in range)
//   P::Col P.col(z, n)               what the B loader needs of column n, computed once per
//                                    thread and tile (a thread loads one column of B's tile)
//   float P.b(z, k, col)             B element loader (called only in range)
//   void  P.store(z, m, n, acc)      writes one fp32 accumulator (bias/alpha/epilogue inside)
// Loaders return fp32 (half inputs convert exactly); accumulation is always fp32.
//
// Split-K: a launch with `splits` > 1 runs blockIdx.z = item * splits + s; block s covers the
// K range [s * kper, (s + 1) * kper) (kper a multiple of the tile's BK) and writes its fp32
// partial tile to partial[(blockIdx.z * M + m) * N + n]; a second kernel (splitk_reduce below)
// sums the splits in a fixed order and stores through P.store: deterministic, and it fills
// the GPU when M x N alone has too few tiles (batch-1 convolutions, BERT's FFN at seq 128).
#pragma once
#include "dtypes.cuh"

struct KSlice {
  i64 z, k_begin, k_end;
};

// this block's batch item and K range; `bk` is the block tile's K depth
__device__ __forceinline__ KSlice k_slice(i64 K, i64 splits, i64 bk) {
  KSlice t;
  const i64 s = blockIdx.z % splits;
  t.z = blockIdx.z / splits;
  const i64 kper = ((K + splits - 1) / splits + bk - 1) / bk * bk;
  t.k_begin = s * kper < K ? s * kper : K;
  t.k_end = t.k_begin + kper < K ? t.k_begin + kper : K;
  return t;
}

// store a finished accumulator: into the split's partial tile, or through the problem
template <class P>
__device__ __forceinline__ void put(const P& p, const KSlice& t, float* partial, i64 m, i64 n, float acc) {
  if (partial)
    partial[((i64)blockIdx.z * p.M + m) * p.N + n] = acc;
  else
    p.store(t.z, m, n, acc);
}

// Sum the splits of every (item, m, n) in order s = 0..splits-1 and store through P.
// Grid (ceil(M*N/256), 1, items), block 256; `make(z)` builds the problem of item z.
template <class P, class Make>
__device__ __forceinline__ void splitk_reduce(const Make& make, i64 splits, const float* partial) {
  const i64 z = blockIdx.z;
  const P p = make(z);
  const i64 MN = p.M * p.N;
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < MN; i += (i64)gridDim.x * blockDim.x) {
    const float* src = partial + z * splits * MN + i;
    float acc = 0.f;
    for (i64 s = 0; s < splits; ++s) acc += src[s * MN];
    p.store(z, i / p.N, i % p.N, acc);
  }
}

// ---- SIMT fp32 tiles ---------------------------------------------------------------------
// Block: (BM/TM)*(BN/TN) threads; each thread owns a TM x TN micro-tile, rows ty + i*(BM/TM),
// cols tx + j*(BN/TN) (strided so shared-memory reads are conflict-free broadcasts).
// Grid: (ceil(N/BN), ceil(M/BM), batch * splits).
// The next K tile is loaded into registers while the current one is multiplied (one shared
// buffer, loads in flight across the math).
template <class P, int BM, int BN, int BK, int TM, int TN>
__device__ __forceinline__ void simt_gemm(const P& p, const KSlice& t, float* partial) {
  constexpr int TX = BN / TN, TY = BM / TM, NT = TX * TY;
  constexpr int LA = BM * BK / NT, LB = BN * BK / NT, KB = NT / BN;
  static_assert((BM * BK) % NT == 0 && NT % BN == 0 && BK % KB == 0, "loader layout");
  __shared__ float As[BK][BM + 1];
  __shared__ float Bs[BK][BN + 1];
  const int tid = threadIdx.x, tx = tid % TX, ty = tid / TX;
  const i64 z = t.z, m0 = (i64)blockIdx.y * BM, n0 = (i64)blockIdx.x * BN;
  const i64 nb = n0 + tid % BN;  // this thread's B column: rows tid / BN + i * KB
  const bool n_ok = nb < p.N;
  const typename P::Col col = p.col(z, n_ok ? nb : 0);
  float ra[LA], rb[LB];
  auto load = [&](i64 k0) {
#pragma unroll
    for (int i = 0; i < LA; ++i) {
      const int idx = tid + i * NT, mm = idx / BK, kk = idx % BK;
      const i64 m = m0 + mm, k = k0 + kk;
      ra[i] = (m < p.M && k < t.k_end) ? p.a(z, m, k) : 0.f;
    }
#pragma unroll
    for (int i = 0; i < LB; ++i) {
      const i64 k = k0 + tid / BN + i * KB;
      rb[i] = (n_ok && k < t.k_end) ? p.b(z, k, col) : 0.f;
    }
  };
  float acc[TM][TN];
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;
  if (t.k_begin < t.k_end) load(t.k_begin);
  for (i64 k0 = t.k_begin; k0 < t.k_end; k0 += BK) {
#pragma unroll
    for (int i = 0; i < LA; ++i) {
      const int idx = tid + i * NT;
      As[idx % BK][idx / BK] = ra[i];
    }
#pragma unroll
    for (int i = 0; i < LB; ++i) Bs[tid / BN + i * KB][tid % BN] = rb[i];
    __syncthreads();
    if (k0 + BK < t.k_end) load(k0 + BK);
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
      if (m < p.M && n < p.N) put(p, t, partial, m, n, acc[i][j]);
    }
}

// ---- tensor-core fp16 tiles (mma.sync.m16n8k16, fp32 accumulate) ----------------------------
// Block: 8 warps as WM x WN = 2 x 4; block tile BM x BN = 128 x 128 (warp tile 64 x 32 =
// 4 x 4 mma tiles), BK = 32. A is staged as As[m][k], B transposed as Bs[n][k] (fp16),
// rows padded by 8 halves; fragments follow the PTX ISA m16n8k16 layouts.
// Grid: (ceil(N/128), ceil(M/128), batch * splits); 256 threads. Register-prefetched like simt_gemm.
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
__device__ __forceinline__ void mma_gemm(const P& p, const KSlice& t, float* partial) {
  // B is loaded as pairs of consecutive k (stored as one 32-bit word): rows 2 * (tid / MMA_BN + i * KB) + {0, 1}
  constexpr int LA = MMA_BM * MMA_BK / 256, LB = MMA_BN * MMA_BK / 256, KB = 256 / MMA_BN;
  __shared__ __align__(16) u16 As[MMA_BM][MMA_BK + MMA_PAD];
  __shared__ __align__(16) u16 Bs[MMA_BN][MMA_BK + MMA_PAD];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int wm = warp / 4, wn = warp % 4;           // warp position: 2 x 4
  const int grp = lane / 4, tig = lane % 4;
  const i64 z = t.z, m0 = (i64)blockIdx.y * MMA_BM, n0 = (i64)blockIdx.x * MMA_BN;
  const i64 nb = n0 + tid % MMA_BN;  // this thread's B column
  const bool n_ok = nb < p.N;
  const typename P::Col col = p.col(z, n_ok ? nb : 0);
  float ra[LA], rb[LB];
  auto load = [&](i64 k0) {
#pragma unroll
    for (int i = 0; i < LA; ++i) {
      const int idx = tid + i * 256, mm = idx / MMA_BK, kk = idx % MMA_BK;
      const i64 m = m0 + mm, k = k0 + kk;
      ra[i] = (m < p.M && k < t.k_end) ? p.a(z, m, k) : 0.f;
    }
#pragma unroll
    for (int i = 0; i < LB; ++i) {
      const i64 k = k0 + 2 * (tid / MMA_BN + (i / 2) * KB) + (i & 1);
      rb[i] = (n_ok && k < t.k_end) ? p.b(z, k, col) : 0.f;
    }
  };
  float acc[4][4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.f;
  if (t.k_begin < t.k_end) load(t.k_begin);
  for (i64 k0 = t.k_begin; k0 < t.k_end; k0 += MMA_BK) {
#pragma unroll
    for (int i = 0; i < LA; ++i) {
      const int idx = tid + i * 256;
      As[idx / MMA_BK][idx % MMA_BK] = f2h(ra[i]).x;
    }
#pragma unroll
    for (int i = 0; i < LB; i += 2)
      *(u32*)&Bs[tid % MMA_BN][2 * (tid / MMA_BN + (i / 2) * KB)] = (u32)f2h(rb[i]).x | ((u32)f2h(rb[i + 1]).x << 16);
    __syncthreads();
    if (k0 + MMA_BK < t.k_end) load(k0 + MMA_BK);
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
        if (m < p.M && n < p.N) put(p, t, partial, m, n, acc[i][j][r]);
      }
}

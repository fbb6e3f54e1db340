// MatMul / Gemm on Hopper tensor cores (sm_90a): Y[z] = alpha * A[z] (M x K) * B[z] + beta * C,
// fp16 or bf16 storage (ELEM = half_t | bf16_t), fp32 accumulation.
//
// A is row-major [M, K] (K contiguous); B is [K, N] row-major (B_MN 1: N contiguous) or
// [N, K] (B_MN 0: a transposed Gemm operand, K contiguous). Both are read through TMA tensor
// maps of rank 3 (innermost dim first: K or N, then rows, then the batch item), so tiles past
// an edge are zero-filled by the copy engine; a batch item of an operand that does not vary
// over the batch uses coordinate 0 (a_batched / b_batched 0). Y is contiguous (z, M, N); C
// (Gemm only, may be null) is broadcast to (M, N) through element strides (scm, scn).
//
// Tile BM x BN x 64 with BM = 64 * MSUB * CONSUMERS. Warp-specialized and persistent:
// warpgroup 0 is the producer (one thread issues the TMA loads of STAGES stages, each stage
// guarded by a `full` and an `empty` mbarrier); warpgroups 1..CONSUMERS each own MSUB x 64
// rows of the tile and run wgmma on every stage, then the epilogue (alpha, beta*C, the fused
// epilogue, fp16/bf16 store of column pairs). Blocks loop over tiles t = blockIdx.x, +gridDim.x
// (grid = min(tiles, SMs)), tiles ordered by tile_of (GROUP tile rows at a time).
// Launch: grid (min(tiles, SMs)), block 128 * (CONSUMERS + 1), dynamic shared memory
// gemm_sm90_smem() = 1024 (alignment) + STAGES * (BM + BN) * 128 + 16 * STAGES bytes.
// Deterministic: each output element is one fixed-order K loop in one thread.
#include "sm90.cuh"

#ifndef HAS_EPILOGUE
#define HAS_EPILOGUE 0
#define EPI_PARAMS
#define EPI_COMMA_ARGS
#endif

#define BM (64 * MSUB * CONSUMERS)
#define STAGE_BYTES ((BM + BN) * 128)
#define GROUP 8

struct OutP {
  ELEM* Y;
  const ELEM* C;
  i64 M, N, scm, scn;
  float alpha, beta;
#if HAS_EPILOGUE
  EpiState epi;
#endif
  __device__ __forceinline__ float value(i64 z, i64 m, i64 n, float acc) const {
    float v = alpha * acc;
    if (C) v += beta * (float)ld(C, m * scm + n * scn);
#if HAS_EPILOGUE
    v = apply_epilogue(epi, v, (z * M + m) * N + n, n);
#endif
    return v;
  }
  // columns n, n + 1 of row m (n even); the pair store needs N even for 4-byte alignment
  __device__ __forceinline__ void store2(i64 z, i64 m, i64 n, float a, float b) const {
    if (m >= M || n >= N) return;
    ELEM* y = Y + (z * M + m) * N + n;
    const float va = value(z, m, n, a);
    if (n + 1 < N) {
      const float vb = value(z, m, n + 1, b);
      if ((N & 1) == 0) {
        ELEM pair[2];
        st(pair, 0, va);
        st(pair, 1, vb);
        *(u32*)y = *(const u32*)pair;
        return;
      }
      st(y, 1, vb);
    }
    st(y, 0, va);
  }
};

extern "C" __global__ void __launch_bounds__(128 * (CONSUMERS + 1), 1) gemm_sm90(
    const __grid_constant__ TmaDesc tm_a, const __grid_constant__ TmaDesc tm_b, const ELEM* C, ELEM* Y, i64 M,
    i64 N, i64 K, i64 scm, i64 scn, float alpha, float beta, i64 items, i64 a_batched, i64 b_batched EPI_PARAMS) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = (unsigned char*)(((u64)smem_raw + 1023) & ~(u64)1023);
  u64* full = (u64*)(smem + STAGES * STAGE_BYTES);
  u64* empty = full + STAGES;
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  const int tiles_m = (int)((M + BM - 1) / BM), tiles_n = (int)((N + BN - 1) / BN);
  const int tiles = tiles_m * tiles_n * (int)items;
  const int ktiles = (int)((K + 63) / 64);

  if (threadIdx.x == 0) {
    tma_prefetch_desc(&tm_a);
    tma_prefetch_desc(&tm_b);
    for (int s = 0; s < STAGES; ++s) {
      bar_init(&full[s], 1);
      bar_init(&empty[s], CONSUMERS);
    }
    bar_fence_init();
  }
  __syncthreads();

  if (wg == 0) {  // ---- producer: TMA loads, one thread ------------------------------------
    set_max_regs_dec<40>();
    if (tid != 0) return;
    int stage = 0;
    u32 phase = 0;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
      const TileIdx ti = tile_of(t, tiles_m, tiles_n, GROUP);
      const int za = a_batched ? ti.z : 0, zb = b_batched ? ti.z : 0;
      for (int kt = 0; kt < ktiles; ++kt) {
        bar_wait(&empty[stage], phase ^ 1);
        unsigned char* a = smem + stage * STAGE_BYTES;
        unsigned char* b = a + BM * 128;
        bar_expect_tx(&full[stage], STAGE_BYTES);
        tma_load_3d(a, &tm_a, &full[stage], kt * 64, ti.tm * BM, za);
#if B_MN
#pragma unroll
        for (int j = 0; j < BN / 64; ++j) tma_load_3d(b + j * 8192, &tm_b, &full[stage], ti.tn * BN + j * 64, kt * 64, zb);
#else
        tma_load_3d(b, &tm_b, &full[stage], kt * 64, ti.tn * BN, zb);
#endif
        if (++stage == STAGES) {
          stage = 0;
          phase ^= 1;
        }
      }
    }
    return;
  }

  // ---- consumers: wgmma over the stages, then the epilogue ----------------------------------
  set_max_regs_inc<232>();
  const int row0 = (wg - 1) * MSUB * 64;
  OutP out;
  out.Y = Y; out.C = C; out.M = M; out.N = N; out.scm = scm; out.scn = scn; out.alpha = alpha; out.beta = beta;
#if HAS_EPILOGUE
  out.epi = make_epi(EPI_ARGS);
#endif
  float acc[MSUB][BN / 2];
  int stage = 0;
  u32 phase = 0;
  const int warp = tid / 32, lane = tid % 32;
  for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
    const TileIdx ti = tile_of(t, tiles_m, tiles_n, GROUP);
    int prev = -1;
    for (int kt = 0; kt < ktiles; ++kt) {
      bar_wait(&full[stage], phase);
      const u32 a = smem_addr(smem + stage * STAGE_BYTES);
      wgmma_fence();
      wgmma_stage<BN, MSUB, B_MN, ELEM>(acc, a, a + BM * 128, row0, kt == 0);
      wgmma_commit();
      wgmma_wait<1>();  // the previous stage's wgmma are done: hand its buffers back
      if (prev >= 0 && tid == 0) bar_arrive(&empty[prev]);
      prev = stage;
      if (++stage == STAGES) {
        stage = 0;
        phase ^= 1;
      }
    }
    wgmma_wait<0>();
#pragma unroll
    for (int s = 0; s < MSUB; ++s) fence_regs<BN / 2>(acc[s]);
    if (prev >= 0 && tid == 0) bar_arrive(&empty[prev]);
    // accumulator layout (m64nNk16): row = 16 * warp + lane / 4 (+8), column = 8 * j + 2 * (lane % 4) (+1)
    const i64 m_base = (i64)ti.tm * BM + row0 + warp * 16 + lane / 4;
    const i64 n_base = (i64)ti.tn * BN + 2 * (lane % 4);
#pragma unroll
    for (int s = 0; s < MSUB; ++s)
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
        const i64 m = m_base + s * 64, n = n_base + j * 8;
        out.store2(ti.z, m, n, acc[s][4 * j], acc[s][4 * j + 1]);
        out.store2(ti.z, m + 8, n, acc[s][4 * j + 2], acc[s][4 * j + 3]);
      }
  }
}

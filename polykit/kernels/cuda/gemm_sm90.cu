// MatMul / Gemm and channels-last convolution on Hopper tensor cores (sm_90a):
// Y[z] = alpha * A[z] (M x K) * B[z] + beta * C, fp16 or bf16 storage (ELEM = half_t | bf16_t),
// or float storage with tf32 math (ELEM = float: wgmma k8, operands' low mantissa bits
// ignored; B must be [N, K], B_MN 0), fp32 accumulation.
//
// A is row-major [M, K] (K contiguous); B is [K, N] row-major (B_MN 1: N contiguous) or
// [N, K] (B_MN 0: a transposed Gemm operand, K contiguous). Both are read through TMA tensor
// maps of rank 3 (innermost dim first: K or N, then rows, then the batch item), so tiles past
// an edge are zero-filled by the copy engine; a batch item of an operand that does not vary
// over the batch uses coordinate 0 (a_batched / b_batched 0). Y is contiguous (z, M, N); C
// (Gemm only, may be null) is broadcast to (M, N) through element strides (scm, scn).
//
// Tile BM x BN x KE with BM = 64 * MSUB * CONSUMERS and KE = 128 bytes of K (64 16-bit
// elements, 32 floats): every shared-memory row is one 128-byte swizzle row whatever ELEM is. Warp-specialized and persistent:
// warpgroup 0 is the producer (one thread issues the TMA loads of STAGES stages, each stage
// guarded by a `full` and an `empty` mbarrier); warpgroups 1..CONSUMERS each own MSUB x 64
// rows of the tile and run wgmma on every stage, then the epilogue (alpha, beta*C, the fused
// epilogue, fp16/bf16 store of column pairs). Blocks loop over tiles t = blockIdx.x, +gridDim.x
// (grid = min(tiles, SMs)), tiles ordered by tile_of (GROUP tile rows at a time).
//
// conv_sm90: ai.polykit ConvNHWC (group 1, C % VEC == 0) as an implicit GEMM with the same
// consumers: M = NB * OH * OW output pixels, N = output channels, K = KH * KW * C in (kh, kw, c)
// order, so the KRSC weight is B ([N, K], B_MN 0, through TMA) and Y [NB, OH, OW, N] is the
// row-major GEMM output. A is gathered by the whole producer warpgroup with 16-byte cp.async
// (VEC channels of one (kh, kw) tap; zeros in the padding and past K), completion counted on the
// stage's `full` barrier (cp.async.mbarrier.arrive.noinc). The conv bias is C (scn 1, beta 1).
// BLOCKS 2 (one consumer warpgroup, few stages): two blocks share an SM, so one block's epilogue
// runs while the other's wgmma do; they keep the launch register budget (no setmaxnreg).
// Launch: grid (min(tiles, BLOCKS * SMs)), block 128 * (CONSUMERS + 1), dynamic shared memory
// 1024 (alignment) + STAGES * (BM + BN) * 128 + 16 * STAGES bytes.
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
#ifndef BLOCKS
#define BLOCKS 1  // blocks an SM runs at once; 2: one block's epilogue overlaps the other's products
#endif
#define EPI_GROUP 4  // column blocks (8 columns each) whose epilogue loads are batched
constexpr int KE = 128 / sizeof(ELEM);  // K elements of one stage (one 128-byte row)
constexpr int VEC = 16 / sizeof(ELEM);  // elements of one 16-byte chunk
static_assert(sizeof(ELEM) == 2 || B_MN == 0, "tf32 wgmma reads B K-major only");

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
  // columns n, n + 1 of row m (n even), values already final; pairs need N even (aligned pairs).
  // float storage (tf32 layers) stores tf32-rounded values: the next tf32 layer reads them
  // exactly instead of truncating their low mantissa bits (a bias that compounds over layers).
  __device__ __forceinline__ void store2(i64 z, i64 m, i64 n, float a, float b) const {
    if (m >= M || n >= N) return;
    if (sizeof(ELEM) == 4) {
      a = tf32_round(a);
      b = tf32_round(b);
    }
    ELEM* y = Y + (z * M + m) * N + n;
    if (n + 1 < N) {
      if ((N & 1) == 0) {
        struct __align__(2 * sizeof(ELEM)) Pair { ELEM v[2]; } pair;
        st(pair.v, 0, a);
        st(pair.v, 1, b);
        *(Pair*)y = pair;
        return;
      }
      st(y, 1, b);
    }
    st(y, 0, a);
  }
};

// ---- consumers: wgmma over the stages, then the epilogue (both kernels) -----------------------
__device__ __forceinline__ void consume(const OutP& out, unsigned char* smem, u64* full, u64* empty, int tiles_m,
                                        int tiles_n, int tiles, int ktiles, int wg, int tid) {
  const int row0 = (wg - 1) * MSUB * 64;
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
    // accumulator layout (m64nNk16): row = 16 * warp + lane / 4 (+8), column = 8 * j + 2 * (lane % 4) (+1).
    // EPI_GROUP column blocks at a time: their epilogue values first (the loads of C and of the
    // epilogue inputs are in flight together: no store can alias them yet), then their stores.
    const i64 m_base = (i64)ti.tm * BM + row0 + warp * 16 + lane / 4;
    const i64 n_base = (i64)ti.tn * BN + 2 * (lane % 4);
#pragma unroll
    for (int s = 0; s < MSUB; ++s)
#pragma unroll
      for (int j0 = 0; j0 < BN / 8; j0 += EPI_GROUP) {
#pragma unroll
        for (int j = j0; j < j0 + EPI_GROUP; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const i64 m = m_base + s * 64 + (e >= 2 ? 8 : 0), n = n_base + j * 8 + (e & 1);
            if (m < out.M && n < out.N) acc[s][4 * j + e] = out.value(ti.z, m, n, acc[s][4 * j + e]);
          }
#pragma unroll
        for (int j = j0; j < j0 + EPI_GROUP; ++j) {
          const i64 m = m_base + s * 64, n = n_base + j * 8;
          out.store2(ti.z, m, n, acc[s][4 * j], acc[s][4 * j + 1]);
          out.store2(ti.z, m + 8, n, acc[s][4 * j + 2], acc[s][4 * j + 3]);
        }
      }
  }
}

// shared-memory layout, barrier set-up (full: `arrivals` per phase; empty: one per consumer)
struct Stages {
  unsigned char* smem;
  u64 *full, *empty;
};
__device__ __forceinline__ Stages setup_stages(unsigned char* raw, u32 arrivals) {
  Stages st;
  st.smem = (unsigned char*)(((u64)raw + 1023) & ~(u64)1023);
  st.full = (u64*)(st.smem + STAGES * STAGE_BYTES);
  st.empty = st.full + STAGES;
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      bar_init(&st.full[s], arrivals);
      bar_init(&st.empty[s], CONSUMERS);
    }
    bar_fence_init();
  }
  __syncthreads();
  return st;
}

__device__ __forceinline__ OutP make_out(ELEM* Y, const ELEM* C, i64 M, i64 N, i64 scm, i64 scn, float alpha,
                                         float beta) {
  OutP out;
  out.Y = Y; out.C = C; out.M = M; out.N = N; out.scm = scm; out.scn = scn; out.alpha = alpha; out.beta = beta;
  return out;
}

// advance a (stage, phase) ring position
__device__ __forceinline__ void next_stage(int& stage, u32& phase) {
  if (++stage == STAGES) {
    stage = 0;
    phase ^= 1;
  }
}

extern "C" __global__ void __launch_bounds__(128 * (CONSUMERS + 1), BLOCKS) gemm_sm90(
    const __grid_constant__ TmaDesc tm_a, const __grid_constant__ TmaDesc tm_b, const ELEM* C, ELEM* Y, i64 M,
    i64 N, i64 K, i64 scm, i64 scn, float alpha, float beta, i64 items, i64 a_batched, i64 b_batched EPI_PARAMS) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  const int tiles_m = (int)((M + BM - 1) / BM), tiles_n = (int)((N + BN - 1) / BN);
  const int tiles = tiles_m * tiles_n * (int)items;
  const int ktiles = (int)((K + KE - 1) / KE);
  if (threadIdx.x == 0) {
    tma_prefetch_desc(&tm_a);
    tma_prefetch_desc(&tm_b);
  }
  const Stages st = setup_stages(smem_raw, 1);

  if (wg == 0) {  // ---- producer: TMA loads, one thread ------------------------------------
    if (BLOCKS == 1) set_max_regs_dec<40>();
    int stage = 0;
    u32 phase = 0;
    for (int t = blockIdx.x; t < tiles && tid == 0; t += gridDim.x) {
      const TileIdx ti = tile_of(t, tiles_m, tiles_n, GROUP);
      const int za = a_batched ? ti.z : 0, zb = b_batched ? ti.z : 0;
      for (int kt = 0; kt < ktiles; ++kt, next_stage(stage, phase)) {
        bar_wait(&st.empty[stage], phase ^ 1);
        unsigned char* a = st.smem + stage * STAGE_BYTES;
        unsigned char* b = a + BM * 128;
        bar_expect_tx(&st.full[stage], STAGE_BYTES);
        tma_load_3d(a, &tm_a, &st.full[stage], kt * KE, ti.tm * BM, za);
#if B_MN
#pragma unroll
        for (int j = 0; j < BN / 64; ++j)
          tma_load_3d(b + j * 8192, &tm_b, &st.full[stage], ti.tn * BN + j * 64, kt * KE, zb);
#else
        tma_load_3d(b, &tm_b, &st.full[stage], kt * KE, ti.tn * BN, zb);
#endif
      }
    }
  } else {  // ---- consumers (128 * 40 + 256 * 232 = 168 * 384: the launch allocation) --------------
    if (BLOCKS == 1) set_max_regs_inc<232>();
    OutP out = make_out(Y, C, M, N, scm, scn, alpha, beta);
#if HAS_EPILOGUE
    out.epi = make_epi(EPI_ARGS);
#endif
    consume(out, st.smem, st.full, st.empty, tiles_m, tiles_n, tiles, ktiles, wg, tid);
  }
}

// rows of the A tile one producer thread gathers: rows tid / 8 + 16 * i, chunk tid % 8
#define ROWS_PER_THREAD (BM / 16)
// setmaxnreg moves registers only within the block's launch allocation (168 x 384 with two
// consumers): 128 * 56 + 256 * 224 = 168 * 384. Asking for more than was released hangs.
#define CONV_PRODUCER_REGS 56
#define CONV_CONSUMER_REGS (CONSUMERS == 1 ? 240 : 224)

extern "C" __global__ void __launch_bounds__(128 * (CONSUMERS + 1), BLOCKS) conv_sm90(
    const __grid_constant__ TmaDesc tm_w, const ELEM* X, const ELEM* Bias, ELEM* Y, i64 M, i64 N, i64 K, int H,
    int W, int C, int OH, int OW, int KW, int SH, int SW, int PH, int PW, int DH, int DW EPI_PARAMS) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  const int tiles_m = (int)((M + BM - 1) / BM), tiles_n = (int)((N + BN - 1) / BN);
  const int tiles = tiles_m * tiles_n;
  const int ktiles = (int)((K + KE - 1) / KE);
  if (threadIdx.x == 0) tma_prefetch_desc(&tm_w);
  const Stages st = setup_stages(smem_raw, 128 + 1);  // 128 cp.async arrivals + the TMA thread's expect_tx

  if (wg == 0) {  // ---- producer warpgroup: im2col rows by cp.async, weights by TMA -----------
    if (BLOCKS == 1) set_max_regs_dec<CONV_PRODUCER_REGS>();
    const int chunk = tid % 8, c8s = C / VEC, kchunks = (int)(K / VEC);
    int stage = 0;
    u32 phase = 0;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
      const TileIdx ti = tile_of(t, tiles_m, tiles_n, GROUP);
      i64 base[ROWS_PER_THREAD];  // image offset of the row's pixel, -1 past M
      int ih0[ROWS_PER_THREAD], iw0[ROWS_PER_THREAD];
#pragma unroll
      for (int i = 0; i < ROWS_PER_THREAD; ++i) {
        const i64 m = (i64)ti.tm * BM + tid / 8 + 16 * i;
        const int img = (int)(m / (OH * OW)), pix = (int)(m - (i64)img * OH * OW);
        const int oh = pix / OW, ow = pix - oh * OW;
        base[i] = m < M ? (i64)img * H * W * C : -1;
        ih0[i] = oh * SH - PH;
        iw0[i] = ow * SW - PW;
      }
      for (int kt = 0; kt < ktiles; ++kt, next_stage(stage, phase)) {
        bar_wait(&st.empty[stage], phase ^ 1);
        unsigned char* a = st.smem + stage * STAGE_BYTES;
        if (tid == 0) {
          bar_expect_tx(&st.full[stage], BN * 128);
          tma_load_3d(a + BM * 128, &tm_w, &st.full[stage], kt * KE, ti.tn * BN, 0);
        }
        const int q = kt * 8 + chunk;  // this thread's 16-byte chunk of K: tap (kh, kw), channels c8 * VEC..
        const int tap = q / c8s, c8 = q - tap * c8s, kh = tap / KW, kw = tap - kh * KW;
#pragma unroll
        for (int i = 0; i < ROWS_PER_THREAD; ++i) {
          const int r = tid / 8 + 16 * i;
          const int ih = ih0[i] + kh * DH, iw = iw0[i] + kw * DW;
          const bool ok = base[i] >= 0 && q < kchunks && ih >= 0 && ih < H && iw >= 0 && iw < W;
          const ELEM* src = X + (ok ? base[i] + ((i64)ih * W + iw) * C + c8 * VEC : 0);
          cp_async16(a + r * 128 + ((chunk ^ (r & 7)) << 4), src, ok);
        }
        bar_arrive_cp_async(&st.full[stage]);
      }
    }
  } else {  // ---- consumers ---------------------------------------------------------------------
    if (BLOCKS == 1) set_max_regs_inc<CONV_CONSUMER_REGS>();
    OutP out = make_out(Y, Bias, M, N, 0, 1, 1.f, 1.f);
#if HAS_EPILOGUE
    out.epi = make_epi(EPI_ARGS);
#endif
    consume(out, st.smem, st.full, st.empty, tiles_m, tiles_n, tiles, ktiles, wg, tid);
  }
}

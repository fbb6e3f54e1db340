// Attention on Hopper tensor cores (FlashAttention-3 form, wgmma + TMA, sm_90a):
//   O[b, h] = softmax(Q[b, h] K[b, h]^T * scale [+ mask]) V[b, h]
// ELEM = half_t | bf16_t storage, fp32 scores, softmax statistics and accumulators; head size
// HD (64 or 128) for Q, K and V; CONSUMERS (1 or 2) warpgroups of 64 query rows a block; BKV
// (64 or 128) keys a tile.
//
// Q, K and V arrive through rank-4 TMA tensor maps (innermost first: d, then seq and head in
// the order of their strides, then batch): bits of `geo`, three per tensor x (Q 0, K 1, V 2):
// 1 << 3x its head stride is below its seq stride ([B, S, H, D], or a view of a packed projection:
// map dims d, h, s, b; else d, s, h, b; the map's strides are the view's), 2 << 3x its batch
// dim is 1 (coordinate 0: broadcast), 4 << 3x its head dim is 1. A box is 64 d (128 bytes) by
// the tile's rows; rows past the sequence are zero-filled by the copy engine. Query head h loads
// key/value head h / kv_groups (grouped-query heads; 1 otherwise). O is written from
// registers through element strides (ob, oh, os), d contiguous. The mask (optional) is
// [b][h][q][k] through strides (mb, mh, mq, mk): mask_kind 1 additive (ELEM), 2 bool keep-mask
// (0 -> -inf); a causal layer arrives as such a keep-mask. A row whose softmax is undefined
// (every score -inf, or a NaN score) gives NaN, or 0 with nan_to_zero.
//
// Shared memory (1024-byte aligned, 128-byte swizzle, sm90.cuh's K-major / MN-major formats):
// Q: HD / 64 boxes of BQ rows x 64 d; K and V: 2 stages, each HD / 64 boxes of BKV keys x 64 d
// (BKV * 128 bytes a box). The same K/V tile is K-major B for S = Q K^T (keys are S's columns, d its
// depth) and MN-major B for O += P V (keys are the depth, d the columns: box j holds columns
// 64 j ..). Barriers: q_full, full[2] (TMA bytes), empty[2] (one arrive per consumer).
//
// Warp roles: warps 0 .. 4 CONSUMERS - 1 are the consumer warpgroups (warpgroup c owns query
// rows q0 + 64 c ..); warp 4 CONSUMERS is the producer (lane 0 issues every TMA load: Q once,
// then each key tile into stage t % 2 after both consumers released it).
// Per key tile a consumer runs S = Q K^T (wgmma, Q and K from shared memory, HD / 16 k steps),
// the online softmax in fp32 registers (flash_common.cuh: scale, mask, keys past Skv -> -inf,
// running max / sum), packs P to ELEM in registers (S's accumulator layout is the register-A
// layout of m64nNk16) and runs O += P V (wgmma, A from registers, V MN-major). Software
// pipelined inside the warpgroup (FlashAttention-3's intra-warpgroup overlap): iteration t
// issues S of tile t and P V of tile t - 1 together, runs tile t's softmax while that P V is
// still on the tensor cores, then waits for it, releases tile t - 1's stage and rescales O.
// Each output element is one fixed-order loop in one thread: deterministic.
// Launch: grid (ceil(S / BQ), H, B), block 128 CONSUMERS + 32, dynamic shared memory
// 1024 + (BQ + 4 * BKV) * HD * 2 + 64 bytes.
#include "sm90.cuh"
#include "flash_common.cuh"

#define BQ (64 * CONSUMERS)
#ifndef BKV
#define BKV 64  // keys a tile
#endif
#define BOXES (HD / 64)                    // 64-d boxes of a row
#define Q_BYTES (BQ * HD * 2)
#define KV_BYTES (BKV * HD * 2)            // one K (or V) tile of a stage
#define THREADS (128 * CONSUMERS + 32)
static_assert(HD == 64 || HD == 128, "head sizes 64 and 128");
static_assert(CONSUMERS == 1 || CONSUMERS == 2, "one or two consumer warpgroups");
static_assert(BKV == 64 || BKV == 128, "key tiles of 64 or 128");

// a tile of `rows` rows of one tensor (bits: its three `geo` bits) at sequence row `row0` of
// head h, batch b: BOXES TMA boxes of 64 d, box j at dst + j * rows * 128
__device__ __forceinline__ void load_rows(unsigned char* dst, const TmaDesc* map, u64* bar, int bits, int rows,
                                          int row0, int h, int b) {
  const int hh = (bits & 4) ? 0 : h, bb = (bits & 2) ? 0 : b;
#pragma unroll
  for (int j = 0; j < BOXES; ++j) {
    if (bits & 1)
      tma_load_4d(dst + j * rows * 128, map, bar, 64 * j, hh, row0, bb);
    else
      tma_load_4d(dst + j * rows * 128, map, bar, 64 * j, row0, hh, bb);
  }
}

__device__ __forceinline__ u32 pack_elems(float lo, float hi) {
  struct __align__(4) Pair { ELEM v[2]; } pair;
  st(pair.v, 0, lo);
  st(pair.v, 1, hi);
  return *reinterpret_cast<const u32*>(&pair);
}

// S = Q K^T of one key tile for warpgroup wg's 64 rows: s[nb][4], n-block nb = keys 8 nb .. 8 nb + 7
// (the m64nNk16 accumulator of each warp lies in m16n8 fragment order); HD / 16 k steps
__device__ __forceinline__ void issue_scores(float (&s)[BKV / 8][4], u32 q_addr, u32 k_addr, int wg) {
  float(&acc)[1][BKV / 2] = *reinterpret_cast<float(*)[1][BKV / 2]>(&s[0][0]);
#pragma unroll
  for (int j = 0; j < BOXES; ++j)
    wgmma_stage<BKV, 1, 0, ELEM>(acc, q_addr + j * BQ * 128, k_addr + j * BKV * 128, 64 * wg, j == 0);
}

// O += P V: P's 16-key slices as register A operands, V MN-major (16 keys = 2 KB of rows a step)
__device__ __forceinline__ void issue_pv(float (&o)[HD / 8][4], const u32 (&pa)[BKV / 16][4], u32 v_addr) {
#pragma unroll
  for (int kk = 0; kk < BKV / 16; ++kk)
    WgmmaRA<HD, ELEM>::template run<1>(&o[0][0], pa[kk], smem_desc(v_addr + kk * 2048, BKV * 128, 1024), 1);
}

// probabilities -> ELEM pairs in the register-A layout of m64nNk16 (rows g, g + 8; keys 2 t4, 2 t4 + 8)
__device__ __forceinline__ void pack_probs(const float (&s)[BKV / 8][4], u32 (&pa)[BKV / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < BKV / 16; ++kk) {
    pa[kk][0] = pack_elems(s[2 * kk][0], s[2 * kk][1]);
    pa[kk][1] = pack_elems(s[2 * kk][2], s[2 * kk][3]);
    pa[kk][2] = pack_elems(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    pa[kk][3] = pack_elems(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
}

extern "C" __global__ void __launch_bounds__(THREADS, 1) flash_attention_sm90(
    const __grid_constant__ TmaDesc tm_q, const __grid_constant__ TmaDesc tm_k, const __grid_constant__ TmaDesc tm_v,
    ELEM* __restrict__ O, const void* __restrict__ mask, int S, int Skv, i64 ob, i64 oh, i64 os, i64 mb, i64 mh,
    i64 mq, i64 mk, float scale, int mask_kind, int nan_to_zero, int kv_groups, int causal_off, int geo) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* sQ = (unsigned char*)(((u64)smem_raw + 1023) & ~(u64)1023);
  unsigned char* sK = sQ + Q_BYTES;       // 2 stages
  unsigned char* sV = sK + 2 * KV_BYTES;  // 2 stages
  u64* q_full = (u64*)(sV + 2 * KV_BYTES);
  u64* full = q_full + 1;
  u64* empty = full + 2;
  const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * BQ;
  const int tiles = flash_key_tiles((Skv + BKV - 1) / BKV, BKV, q0, BQ, S, causal_off);  // producer and consumers alike
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  if (threadIdx.x == 0) {
    tma_prefetch_desc(&tm_q);
    tma_prefetch_desc(&tm_k);
    tma_prefetch_desc(&tm_v);
    bar_init(q_full, 1);
    for (int s = 0; s < 2; ++s) {
      bar_init(&full[s], 1);
      bar_init(&empty[s], CONSUMERS);
    }
    bar_fence_init();
  }
  __syncthreads();

  if (wg == CONSUMERS) {  // ---- producer warp: lane 0 issues the TMA loads --------------------
    if (tid != 0) return;
    bar_expect_tx(q_full, Q_BYTES);
    load_rows(sQ, &tm_q, q_full, geo, BQ, q0, h, b);
    for (int t = 0; t < tiles; ++t) {
      const int stage = t & 1;
      bar_wait(&empty[stage], ((t >> 1) & 1) ^ 1);
      bar_expect_tx(&full[stage], 2 * KV_BYTES);
      load_rows(sK + stage * KV_BYTES, &tm_k, &full[stage], geo >> 3, BKV, t * BKV, h / kv_groups, b);
      load_rows(sV + stage * KV_BYTES, &tm_v, &full[stage], geo >> 6, BKV, t * BKV, h / kv_groups, b);
    }
    return;
  }

  // ---- consumer warpgroup wg: query rows q0 + 64 wg .. + 63 ------------------------------------
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  const int row_a = q0 + 64 * wg + 16 * warp + g;  // this thread's two query rows: row_a, row_a + 8
  float o[HD / 8][4];
  flash_zero(o);
  FlashRows rows;
  rows.init();
  const FlashMask fmask = {mask, b * mb + h * mh, mq, mk, mask_kind};
  const u32 q_addr = smem_addr(sQ);
  float s[BKV / 8][4];  // S of the newest tile, then its probabilities
  u32 pa[BKV / 16][4];  // P of the previous tile: the A operand of its P V
  float corr[2];
  bar_wait(q_full, 0);
  if (tiles > 0) {  // prologue: tile 0's S and probabilities
    bar_wait(&full[0], 0);
    wgmma_fence();
    issue_scores(s, q_addr, smem_addr(sK), wg);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs<BKV / 2>(&s[0][0]);
    flash_scores_tile<ELEM, false>(s, corr, rows, 0, Skv, row_a, S, fmask, scale, t4);  // o is 0: no rescale
    pack_probs(s, pa);
  }
  for (int t = 1; t < tiles; ++t) {
    const int stage = t & 1;
    bar_wait(&full[stage], (t >> 1) & 1);
    wgmma_fence();
    issue_scores(s, q_addr, smem_addr(sK + stage * KV_BYTES), wg);        // S of tile t
    wgmma_commit();
    issue_pv(o, pa, smem_addr(sV + (stage ^ 1) * KV_BYTES));             // O += P V of tile t - 1
    wgmma_commit();
    wgmma_wait<1>();  // S done; P V still running under the softmax of tile t
    fence_regs<BKV / 2>(&s[0][0]);
    flash_scores_tile<ELEM, false>(s, corr, rows, t * BKV, Skv, row_a, S, fmask, scale, t4);
    wgmma_wait<0>();
    fence_regs<HD / 2>(&o[0][0]);
    if (tid == 0) bar_arrive(&empty[stage ^ 1]);
    flash_rescale(o, corr);
    pack_probs(s, pa);
  }
  if (tiles > 0) {  // epilogue: the last tile's P V
    const int stage = (tiles - 1) & 1;
    wgmma_fence();
    issue_pv(o, pa, smem_addr(sV + stage * KV_BYTES));
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs<HD / 2>(&o[0][0]);
    if (tid == 0) bar_arrive(&empty[stage]);
  }

  // normalize and store rows row_a, row_a + 8; undefined rows -> NaN (or 0)
  flash_store_pairs(O + b * ob + h * oh, os, rows, o, row_a, S, t4, nan_to_zero);
}

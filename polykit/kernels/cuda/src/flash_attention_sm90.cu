// Attention on Hopper tensor cores (FlashAttention-3 form, wgmma + TMA, sm_90a):
//   O[b, h] = softmax(Q[b, h] K[b, h]^T * scale [+ mask]) V[b, h]
// ELEM = half_t | bf16_t storage, fp32 scores, softmax statistics and accumulators; head size
// HD (64 or 128) for Q, K and V; CONSUMERS (1 or 2) warpgroups of 64 query rows a block; BKV
// (64 or 128) keys a tile; STAGES (2 to 4, default 2) K/V stages; PINGPONG and PERSISTENT (0 or 1):
// below.
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
// Q: HD / 64 boxes of BQ rows x 64 d; K and V: STAGES stages, each HD / 64 boxes of BKV keys x 64 d
// (BKV * 128 bytes a box). The same K/V tile is K-major B for S = Q K^T (keys are S's columns, d its
// depth) and MN-major B for O += P V (keys are the depth, d the columns: box j holds columns
// 64 j ..). Barriers: q_full, full[STAGES] (TMA bytes), empty[STAGES] (one arrive per consumer), and
// with PERSISTENT q_empty (one arrive per consumer once its last S of an item is done).
//
// Warp roles: warps 0 .. 4 CONSUMERS - 1 are the consumer warpgroups (warpgroup c owns query
// rows q0 + 64 c ..); warpgroup CONSUMERS is the producer (one warp; with PINGPONG a whole
// warpgroup, for setmaxnreg) whose thread 0 issues every TMA load: Q once an item, then key tile t into
// stage t % STAGES after every consumer released that stage's previous tile.
// Per key tile a consumer runs S = Q K^T (wgmma, Q and K from shared memory, HD / 16 k steps),
// the online softmax in fp32 registers (flash_common.cuh: scale, mask, keys past Skv -> -inf,
// running max / sum), packs P to ELEM in registers (S's accumulator layout is the register-A
// layout of m64nNk16) and runs O += P V (wgmma, A from registers, V MN-major). Software
// pipelined inside the warpgroup (FlashAttention-3's intra-warpgroup overlap): iteration t
// issues S of tile t and P V of tile t - 1 together, runs tile t's softmax while that P V is
// still on the tensor cores, then waits for it, releases tile t - 1's stage and rescales O.
// Each output element is one fixed-order loop in one thread: deterministic.
//
// PINGPONG 1 (FlashAttention-3's inter-warpgroup ping-pong; CONSUMERS 2, block 384): the two
// consumers take turns on the tensor cores, so one's softmax runs under the other's GEMMs. A turn
// is the issue of one iteration's wgmma (S of tile t and P V of tile t - 1; the prologue's S of
// tile 0, the epilogue's last P V): consumer c waits on named barrier 1 + c (256 threads: its own
// 128 wait, the other consumer's 128 arrive when they have issued their turn's wgmma), issues,
// then arrives on the other's barrier. Consumer 1 arrives once up front (consumer 0 goes first) and
// consumer 0 takes one more turn at the end (a bare bar.sync), so every barrier generation has 128
// waiting and 128 arriving threads and none is left open at exit, whatever the number of turns (both
// consumers run the same: `tiles` + 1 an item with key tiles, none without).
// Registers (setmaxnreg, the whole warpgroup executes it): the launch gives 384 threads
// 65536 / 384 -> 168 a thread (__launch_bounds__(384, 1); ptxas allocates in 8s); the producer drops
// to PRODUCER_REGS 24 and the consumers rise to CONSUMER_REGS 240: 24 * 128 + 240 * 256 = 168 * 384,
// the launch allocation exactly (asking for more than was released would hang in setmaxnreg.inc).
// A consumer of HD 128 and BKV 128 holds O (64 x 128 fp32 / 128 threads = 64 registers), S of tile t
// (64), P of tile t - 1 (64 x 128 ELEM = 32) live across the wgmma: 160 + softmax statistics,
// addresses and the mask's state; 168 (the 1-warpgroup kernel's budget) would spill, 240 leaves
// room. BKV 128 then: BKV 64 halves S and P (112 live) but doubles the barriers, softmax
// reductions and rescales a key, and the wgmma of S shrinks to n64. Shared memory at HD 128, BKV
// 128: Q 32 KiB + STAGES x 64 KiB (K and V): 2 stages 160 KiB, 3 stages 224 KiB (+ 1 KiB alignment
// and the barriers: 230,480 bytes of the 232,448 a block may have); HD 64 halves all of it.
//
// Prediction (not measured; H100 SXM, fp16, PINGPONG, HD 128, BKV 128): [4,16,2048,128] ~500 TFLOP/s
// (~275 us; flash_sm90 304, SDPA 626). A block's key tile is 4 * 128 * 128 * 128 = 8.4 MFLOP = 2048
// tensor-core clocks of an SM (4096 dense fp16 FLOP a clock); its softmax is 16,384 exp2 = 1024
// MUFU clocks (16 a clock) plus ~8 fp32 instructions a score (scale, max, subtract, exp2f's denormal
// guard, sum, pack: ~1024 ALU clocks at 128 a clock), 1024 blocks = 7.8 waves of 132. One
// warpgroup's softmax (half of that, MUFU and ALU on separate pipes) fits under the other's 1024 GEMM
// clocks, so the tensor cores idle mainly in the hand-offs, the prologue / epilogue of each block
// (~10 % of a 16-tile block: nothing else on the SM hides them) and the tail wave: ~55-60 % of the
// dense peak with 2 stages, a few points more with 3 (a stage is free again only once both
// consumers' P V of it are done), ~5 % more with PERSISTENT (the next item's loads under the
// current item's last P V and store). [8,12,128,64] ~50 TFLOP/s (~8 us, no gain over
// flash_sm90's 7.6 us): one query block of 128 and one key tile a head, 96 blocks for 132 SMs:
// latency (TMA, one S, one softmax, one P V, the store), nothing to overlap.
//
// PERSISTENT 1: at most one block an SM (grid x = min(items, SMs)) loops over the work items (query
// block, head, batch) u = blockIdx.x, + gridDim.x, .. of ceil(S / BQ) x heads x batch (the trailing
// arguments), query blocks innermost; the producer loads an item's Q once both consumers have
// released the previous one (q_empty: after their last S of it) and its key tiles into the same stage
// ring, so the next item's loads run under the current item's last P V and store. The stage ring's
// position and the barrier parities count over the block's items.
// FLASH_Q8 1 (ai.polykit AttentionQuantize): O is float8_e4m3fn, written as flash_attention.cu writes it
// (flash_common.cuh's FlashStoreE4m3: QuantizeLinear of the ELEM value the 16-bit kernel stores, two bytes a
// store); y_scale is the last parameter.
// Launch: grid (ceil(S / BQ), H, B) (PERSISTENT: (min(items, SMs), 1, 1)), block THREADS (128
// CONSUMERS + 32; PINGPONG 384), dynamic shared memory 1024 + (BQ + 2 * STAGES * BKV) * HD * 2 +
// 16 * (STAGES + 2) bytes.
#include "sm90.cuh"
#include "flash_common.cuh"

#define BQ (64 * CONSUMERS)
#ifndef BKV
#define BKV 64  // keys a tile
#endif
#define BOXES (HD / 64)                    // 64-d boxes of a row
#define Q_BYTES (BQ * HD * 2)
#define KV_BYTES (BKV * HD * 2)            // one K (or V) tile of a stage
#ifndef STAGES
#define STAGES 2
#endif
#ifndef PINGPONG
#define PINGPONG 0
#endif
#ifndef PERSISTENT
#define PERSISTENT 0
#endif
#if PERSISTENT
#define ITEM_PARAMS , int heads, int batch
#else
#define ITEM_PARAMS
#endif
#define THREADS (PINGPONG ? 128 * (CONSUMERS + 1) : 128 * CONSUMERS + 32)
#define PRODUCER_REGS 24
#define CONSUMER_REGS 240
static_assert(HD == 64 || HD == 128, "head sizes 64 and 128");
static_assert(CONSUMERS == 1 || CONSUMERS == 2, "one or two consumer warpgroups");
static_assert(BKV == 64 || BKV == 128, "key tiles of 64 or 128");
static_assert(STAGES >= 2 && STAGES <= 4, "two to four K/V stages");
static_assert(!PINGPONG || CONSUMERS == 2, "ping-pong takes two consumer warpgroups");
static_assert(!PINGPONG || PRODUCER_REGS * 128 + CONSUMER_REGS * 128 * CONSUMERS <= 65536 / THREADS / 8 * 8 * THREADS,
              "setmaxnreg may only move the launch allocation");

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

// key tile t's stage and the parity of that stage's use (t counts a block's key tiles over its items)
__device__ __forceinline__ int stage_of(int t) { return (int)((unsigned)t % STAGES); }
__device__ __forceinline__ u32 phase_of(int t) { return ((unsigned)t / STAGES) & 1; }

// PINGPONG: consumer wg's turn to issue wgmma begins when the other consumer has issued its own
// (named barrier 1 + wg) and ends by handing the turn over; no-ops otherwise
__device__ __forceinline__ void turn_begin(int wg) {
  if (PINGPONG) named_sync<256>(1 + wg);
}
__device__ __forceinline__ void turn_end(int wg) {
  if (PINGPONG) named_arrive<256>(2 - wg);
}

// One work item: query rows q0 .. q0 + BQ - 1 of head h, batch b, and the key tiles they need
// (producer and consumers alike). Without PERSISTENT a block's one item is its grid position; with
// it, item u of ceil(S / BQ) x heads x batch, query blocks innermost (a head's blocks run side by
// side and share its K and V in L2).
struct Item {
  int q0, h, b, tiles;
};
__device__ __forceinline__ Item item_of(int u, int S, int Skv, int causal_off, int heads) {
  Item it;
  if (PERSISTENT) {
    const int qblocks = (S + BQ - 1) / BQ;
    it.q0 = (u % qblocks) * BQ;
    u /= qblocks;
    it.h = u % heads;
    it.b = u / heads;
  } else {
    it.q0 = blockIdx.x * BQ;
    it.h = blockIdx.y;
    it.b = blockIdx.z;
  }
  it.tiles = flash_key_tiles((Skv + BKV - 1) / BKV, BKV, it.q0, BQ, S, causal_off);
  return it;
}

extern "C" __global__ void __launch_bounds__(THREADS, 1) flash_attention_sm90(
    const __grid_constant__ TmaDesc tm_q, const __grid_constant__ TmaDesc tm_k, const __grid_constant__ TmaDesc tm_v,
    FA_OUT* __restrict__ O, const void* __restrict__ mask, int S, int Skv, i64 ob, i64 oh, i64 os, i64 mb, i64 mh,
    i64 mq, i64 mk, float scale, int mask_kind, int nan_to_zero, int kv_groups, int causal_off, int geo
        ITEM_PARAMS FA_Q8_PARAMS) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* sQ = (unsigned char*)(((u64)smem_raw + 1023) & ~(u64)1023);
  unsigned char* sK = sQ + Q_BYTES;            // STAGES stages
  unsigned char* sV = sK + STAGES * KV_BYTES;  // STAGES stages
  u64* q_full = (u64*)(sV + STAGES * KV_BYTES);
  u64* full = q_full + 1;
  u64* empty = full + STAGES;
  u64* q_empty = empty + STAGES;  // PERSISTENT: both consumers' S of an item are done, Q may be replaced
#if PERSISTENT
  const int items = (S + BQ - 1) / BQ * heads * batch, first = blockIdx.x, step = gridDim.x;
#else
  const int items = 1, first = 0, step = 1, heads = 0;
#endif
  const Item first_item = item_of(first, S, Skv, causal_off, heads);
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  if (threadIdx.x == 0) {
    tma_prefetch_desc(&tm_q);
    tma_prefetch_desc(&tm_k);
    tma_prefetch_desc(&tm_v);
    bar_init(q_full, 1);
    for (int s = 0; s < STAGES; ++s) {
      bar_init(&full[s], 1);
      bar_init(&empty[s], CONSUMERS);
    }
    if (PERSISTENT) bar_init(q_empty, CONSUMERS);
    bar_fence_init();
  }
  __syncthreads();

  if (wg == CONSUMERS) {  // ---- producer: thread 0 issues the TMA loads ---------------------------
    if (PINGPONG) set_max_regs_dec<PRODUCER_REGS>();  // the whole warpgroup, before any thread leaves
    if (tid != 0) return;
    int kt = 0;  // key tiles loaded so far
    for (int u = first, n = 0; u < items; u += step, ++n) {
      const Item it = n == 0 ? first_item : item_of(u, S, Skv, causal_off, heads);
      if (PERSISTENT) bar_wait(q_empty, (n & 1) ^ 1);  // the previous item's S are done
      bar_expect_tx(q_full, Q_BYTES);
      load_rows(sQ, &tm_q, q_full, geo, BQ, it.q0, it.h, it.b);
      for (int t = 0; t < it.tiles; ++t, ++kt) {
        const int stage = stage_of(kt);
        bar_wait(&empty[stage], phase_of(kt) ^ 1);
        bar_expect_tx(&full[stage], 2 * KV_BYTES);
        load_rows(sK + stage * KV_BYTES, &tm_k, &full[stage], geo >> 3, BKV, t * BKV, it.h / kv_groups, it.b);
        load_rows(sV + stage * KV_BYTES, &tm_v, &full[stage], geo >> 6, BKV, t * BKV, it.h / kv_groups, it.b);
      }
    }
    return;
  }

  // ---- consumer warpgroup wg: query rows q0 + 64 wg .. + 63 of each item ------------------------
  if (PINGPONG) {
    set_max_regs_inc<CONSUMER_REGS>();
    if (wg == 1) named_arrive<256>(1);  // consumer 0 takes the first turn
  }
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  const u32 q_addr = smem_addr(sQ);
#if FLASH_Q8
  const FlashStoreE4m3 store = {e4m3_quantizer(y_scale[0]), 0.f};
#else
  const FlashStoreAsIs store;
#endif
  float o[HD / 8][4];
  float s[BKV / 8][4];  // S of the newest tile, then its probabilities
  u32 pa[BKV / 16][4];  // P of the previous tile: the A operand of its P V
  float corr[2];
  int kt = 0;  // key tiles consumed so far (the producer's count)
  for (int u = first, n = 0; u < items; u += step, ++n) {
    const Item it = n == 0 ? first_item : item_of(u, S, Skv, causal_off, heads);
    const int tiles = it.tiles;
    const int row_a = it.q0 + 64 * wg + 16 * warp + g;  // this thread's two query rows: row_a, row_a + 8
    flash_zero(o);
    FlashRows rows;
    rows.init();
    const FlashMask fmask = {mask, it.b * mb + it.h * mh, mq, mk, mask_kind};
    bar_wait(q_full, n & 1);
    if (tiles > 0) {  // prologue: tile 0's S and probabilities
      bar_wait(&full[stage_of(kt)], phase_of(kt));
      turn_begin(wg);
      wgmma_fence();
      issue_scores(s, q_addr, smem_addr(sK + stage_of(kt) * KV_BYTES), wg);
      wgmma_commit();
      turn_end(wg);
      wgmma_wait<0>();
      fence_regs<BKV / 2>(&s[0][0]);
      flash_scores_tile<ELEM, false>(s, corr, rows, 0, Skv, row_a, S, fmask, scale, t4);  // o is 0: no rescale
      pack_probs(s, pa);
    }
    for (int t = 1; t < tiles; ++t) {
      const int stage = stage_of(kt + t), prev = stage_of(kt + t - 1);
      bar_wait(&full[stage], phase_of(kt + t));
      turn_begin(wg);
      wgmma_fence();
      issue_scores(s, q_addr, smem_addr(sK + stage * KV_BYTES), wg);        // S of tile t
      wgmma_commit();
      issue_pv(o, pa, smem_addr(sV + prev * KV_BYTES));                    // O += P V of tile t - 1
      wgmma_commit();
      turn_end(wg);
      wgmma_wait<1>();  // S done; P V still running under the softmax of tile t
      fence_regs<BKV / 2>(&s[0][0]);
      flash_scores_tile<ELEM, false>(s, corr, rows, t * BKV, Skv, row_a, S, fmask, scale, t4);
      wgmma_wait<0>();
      fence_regs<HD / 2>(&o[0][0]);
      if (tid == 0) bar_arrive(&empty[prev]);
      flash_rescale(o, corr);
      pack_probs(s, pa);
    }
    if (PERSISTENT && tid == 0) bar_arrive(q_empty);  // every S of the item is done: the next Q may load
    if (tiles > 0) {  // epilogue: the last tile's P V
      const int stage = stage_of(kt + tiles - 1);
      turn_begin(wg);
      wgmma_fence();
      issue_pv(o, pa, smem_addr(sV + stage * KV_BYTES));
      wgmma_commit();
      turn_end(wg);
      wgmma_wait<0>();
      fence_regs<HD / 2>(&o[0][0]);
      if (tid == 0) bar_arrive(&empty[stage]);
    }
    kt += tiles;

    // normalize and store rows row_a, row_a + 8; undefined rows -> NaN (or 0)
    flash_store_pairs(O + it.b * ob + it.h * oh, os, rows, o, row_a, S, t4, nan_to_zero, store);
  }
  // consumer 1 handed over once more than consumer 0 took (its first arrive): take that turn, so no
  // barrier generation is left open (the header's barrier balance)
  if (PINGPONG && wg == 0) named_sync<256>(1);
}

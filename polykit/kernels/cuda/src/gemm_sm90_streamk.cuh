// Stream-K for the Hopper GEMM (gemm_sm90.cu with STREAMK 1; gemm_sm90_streamk.py): CUTLASS's
// data-parallel + stream-K hybrid against wave quantization, with CUTLASS's in-kernel fixup (one
// launch, no reduce kernel). Of the `tiles` output tiles, the first dp_tiles (whole waves, a
// multiple of the grid) run unsplit as in the plain kernel, block b taking tiles b, b + grid, ...;
// the last sk_tiles (the schedule's choice: the partial wave, or it and one whole wave, or every
// tile under a wave) are laid end to end as sk_tiles * ktiles K steps, and block b takes the steps
// [b * I / grid, (b + 1) * I / grid) of that line (I = sk_tiles * ktiles, every range non-empty).
// A block's range is pieces of consecutive tiles, at most one of them partial at each end:
//   - its last piece on the line may hold a tile's first steps but not its last (a "store"
//     piece): its fp32 accumulators go to the block's slot of `partial` and the block releases
//     its flag;
//   - its first piece may hold a tile's last steps but not its first (a "fixup" piece): the block
//     waits on the flags of the blocks holding the tile's earlier steps (acquire), adds their
//     slots to its accumulators in a fixed order (the nearest block first) and runs the epilogue;
//   - pieces between are whole tiles, finished in place.
// A block runs its stream-K pieces in reverse line order (store piece first, fixup piece last),
// so no block waits before it has released its own flag, and the blocks it waits on (lower ids,
// resident since the grid is one block an SM) stored their pieces first thing: no deadlock, and
// short waits. Deterministic: the split depends only on the shapes and the grid, the adds on the
// split, so every run adds the same operands in the same order.
//
// partial: fp32 [grid][BM * BN] in the consumers' fragment order (float4 q of consumer thread t at
// (q * 128 * CONSUMERS + t) * 4: coalesced), then int flags[grid], zeroed by the enqueue before
// the launch (a memset on the same stream).
#pragma once
#include "gemm_sm90_epilogue.cuh"

#ifndef STREAMK
#define STREAMK 0
#endif
#if STREAMK
#define STREAMK_PARAMS , float *partial, i64 dp_tiles, i64 sk_tiles
static_assert(!I8 && !SPLIT3 && !SPLITK, "stream-K serves the fp16 / bf16 / tf32 GEMMs");
constexpr int SK_THREADS = 128 * CONSUMERS;  // the consumers: the threads that store and fix up
constexpr int SK_BARRIER = 2;                // their named barrier (1: prepare_b's)
enum : int { SK_WHOLE = -1, SK_STORE = 0, SK_FIXUP = 1 };  // Unit::slice of a stream-K unit

// first K step (on the stream-K line of `iters` steps) of block b's range
__device__ __forceinline__ i64 sk_begin(i64 b, i64 iters, i64 grid) { return b * iters / grid; }
// the block whose range holds step x (ranges are non-empty: grid <= iters)
__device__ __forceinline__ int sk_block_of(i64 x, i64 iters, i64 grid) {
  return (int)(((x + 1) * grid + iters - 1) / iters - 1);
}

// This block's work unit i: its data-parallel tiles first, then the pieces of its stream-K range
// from the last to the first. Unit::slice is SK_WHOLE, SK_STORE or SK_FIXUP. False past the last.
__device__ __forceinline__ bool streamk_unit(int i, int tiles_m, int tiles_n, int ktiles, int dp_tiles, int sk_tiles,
                                             Unit& w) {
  const int dp = dp_tiles / (int)gridDim.x;
  if (i < dp) {
    w.ti = tile_of((int)blockIdx.x + i * (int)gridDim.x, tiles_m, tiles_n, GROUP);
    w.slice = SK_WHOLE;
    w.k0 = 0;
    w.k1 = ktiles;
    return true;
  }
  const i64 iters = (i64)sk_tiles * ktiles, s0 = sk_begin(blockIdx.x, iters, gridDim.x),
            s1 = sk_begin(blockIdx.x + 1, iters, gridDim.x);
  const i64 t = (s1 - 1) / ktiles - (i - dp), first = t * ktiles;
  if (t < s0 / ktiles) return false;
  w.ti = tile_of(dp_tiles + (int)t, tiles_m, tiles_n, GROUP);
  w.k0 = (int)max(s0 - first, (i64)0);
  w.k1 = (int)min(s1 - first, (i64)ktiles);
  w.slice = w.k1 < ktiles ? SK_STORE : w.k0 > 0 ? SK_FIXUP : SK_WHOLE;
  return true;
}

__device__ __forceinline__ float4* sk_slot(float* partial, int block) {
  return (float4*)(partial + (i64)block * (BM * BN));
}
__device__ __forceinline__ int* sk_flags(float* partial) { return (int*)(partial + (i64)gridDim.x * (BM * BN)); }

// A store piece: the accumulators to this block's slot, then (every consumer's stores done) its flag released.
__device__ __forceinline__ void store_piece(float* partial, const float (&acc)[MSUB][BN / 2], int ct) {
  float4* p = sk_slot(partial, blockIdx.x) + ct;
#pragma unroll
  for (int s = 0; s < MSUB; ++s)
#pragma unroll
    for (int q = 0; q < BN / 8; ++q)
      __stcg(p + (s * (BN / 8) + q) * SK_THREADS,
             make_float4(acc[s][4 * q], acc[s][4 * q + 1], acc[s][4 * q + 2], acc[s][4 * q + 3]));
  named_barrier<SK_BARRIER, SK_THREADS>();
  if (ct == 0)
    asm volatile("fence.acq_rel.gpu;\n\tst.relaxed.gpu.global.b32 [%0], 1;" ::"l"(sk_flags(partial) + blockIdx.x)
                 : "memory");
}

// A fixup piece of the tile whose steps begin in block b0: wait for blocks b0 .. this - 1 (their
// store pieces are this tile's), then add their slots, the nearest block first. A block that
// never stores (not resident: the grid must be one block an SM) traps after SK_MAX_POLLS polls
// (seconds) instead of hanging the stream.
constexpr int SK_MAX_POLLS = 1 << 24;
__device__ __forceinline__ void fixup_piece(float* partial, int b0, float (&acc)[MSUB][BN / 2], int ct) {
  if (ct == 0)
    for (int b = b0; b < (int)blockIdx.x; ++b) {
      int ready = 0;
      for (int polls = 0; !ready; ++polls) {
        if (polls == SK_MAX_POLLS) __trap();
        asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(ready) : "l"(sk_flags(partial) + b) : "memory");
      }
    }
  named_barrier<SK_BARRIER, SK_THREADS>();
  for (int b = (int)blockIdx.x - 1; b >= b0; --b) {
    const float4* p = sk_slot(partial, b) + ct;
#pragma unroll
    for (int s = 0; s < MSUB; ++s)
#pragma unroll
      for (int q = 0; q < BN / 8; ++q) {
        const float4 v = __ldcg(p + (s * (BN / 8) + q) * SK_THREADS);
        acc[s][4 * q] += v.x;
        acc[s][4 * q + 1] += v.y;
        acc[s][4 * q + 2] += v.z;
        acc[s][4 * q + 3] += v.w;
      }
  }
}

// The consumers of a stream-K launch: each unit's K steps, then its epilogue (whole and fixup
// pieces) or its store.
__device__ __forceinline__ void consume_streamk(const OutP& out, float* partial, unsigned char* smem,
                                                unsigned char* scratch, u64* full, u64* empty, int tiles_m,
                                                int tiles_n, int ktiles, int dp_tiles, int sk_tiles, int wg, int tid) {
  const int row0 = (wg - 1) * MSUB * 64, ct = (wg - 1) * 128 + tid;
  const int warp = tid / 32, lane = tid % 32;
  const i64 iters = (i64)sk_tiles * ktiles;
  float acc[MSUB][BN / 2];
  Ring ring;
  Unit w;
  for (int i = 0; streamk_unit(i, tiles_m, tiles_n, ktiles, dp_tiles, sk_tiles, w); ++i) {
    mainloop(acc, ring, smem, scratch, full, empty, w.k1 - w.k0, row0, ct, tid);
    if (w.slice == SK_STORE) {
      store_piece(partial, acc, ct);
      continue;
    }
    if (w.slice == SK_FIXUP)  // the tile's first step: this block's first, less the piece's offset
      fixup_piece(partial, sk_block_of(sk_begin(blockIdx.x, iters, gridDim.x) - w.k0, iters, gridDim.x), acc, ct);
    finish_tile(out, w.ti, acc, row0, warp, lane);
  }
}
#else
#define STREAMK_PARAMS
#endif

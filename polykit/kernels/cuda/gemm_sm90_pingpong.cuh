// The ping-pong consumer loop of the Hopper GEMM (gemm_sm90.cu with PINGPONG 1; 16-bit operands):
// each of the two consumer warpgroups owns whole tiles of BM = 64 * MSUB rows, warpgroup 1 the
// block's even tiles (units blockIdx.x, + 2 * gridDim.x, ...), warpgroup 2 its odd ones. The
// producer fills the stage ring in unit order, so a warpgroup skips the stages of the other's tile
// (Ring::skip, ktiles steps). Their K loops take turns through two named barriers: warpgroup 2
// starts a tile's K loop when warpgroup 1 has finished the previous tile's, and the other way
// round, so one warpgroup's epilogue runs on the CUDA cores while the other's wgmma run (CUTLASS's
// KernelTmaWarpSpecializedPingpong). The turns are also what keeps a warpgroup from waiting on a
// stage two fills ahead of the producer: an mbarrier's parity cannot tell those fills apart.
// A warpgroup signals the other only when the other has a next tile, so every bar.arrive meets a
// bar.sync. One tile a block (tiles <= gridDim.x) leaves warpgroup 2 idle.
#pragma once
#include "gemm_sm90_epilogue.cuh"

static_assert(!PINGPONG || (CONSUMERS == 2 && !SPLIT3 && !SPLITK && !B_SCRATCH),
              "ping-pong: two consumer warpgroups, 16-bit or s8 operands, whole-K tiles");

// named barriers 2 and 3 (0: __syncthreads, 1: prepare_b): "warpgroup 1 / 2 may start its K loop"
template <int ID> __device__ __forceinline__ void turn_wait() { asm volatile("bar.sync %0, 256;" ::"n"(ID) : "memory"); }
template <int ID> __device__ __forceinline__ void turn_give() { asm volatile("bar.arrive %0, 256;" ::"n"(ID) : "memory"); }

__device__ __forceinline__ void consume_pingpong(const OutT& out, unsigned char* smem, u64* full, u64* empty,
                                                 int tiles_m, int tiles_n, int tiles, int ktiles, int wg, int tid) {
  const int me = wg - 1;  // 0 or 1
  acc_t acc[MSUB][BN / 2];
  Ring ring;
  if (me == 1) ring.skip(ktiles);  // unit blockIdx.x is warpgroup 1's
  for (int t = blockIdx.x + me * gridDim.x; t < tiles; t += 2 * gridDim.x) {
    if (me == 1)
      turn_wait<3>();
    else if (t != (int)blockIdx.x)
      turn_wait<2>();
    mainloop(acc, ring, smem, nullptr, full, empty, ktiles, 0, tid, tid);
    if (t + (int)gridDim.x < tiles) {  // the other warpgroup has a next tile: its turn
      if (me == 0)
        turn_give<3>();
      else
        turn_give<2>();
    }
    ring.skip(ktiles);
    finish_tile(out, tile_of(t, tiles_m, tiles_n, GROUP), acc, 0, tid);
  }
}

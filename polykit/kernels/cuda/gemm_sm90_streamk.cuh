// Stream-K for the Hopper GEMM (gemm_sm90.cu with STREAMK 1; gemm_sm90_streamk.py): CUTLASS's
// data-parallel + stream-K hybrid against wave quantization. Of the `tiles` output tiles, the first
// dp_tiles (whole waves, a multiple of the grid) run unsplit as in the plain kernel, block b taking
// tiles b, b + grid, ...; the last sk_tiles (the partial wave plus one whole wave, or every tile
// when there is less than a wave) are laid end to end as sk_tiles * ktiles K steps, and block b
// takes the steps [b * I / grid, (b + 1) * I / grid) of that line (I = sk_tiles * ktiles): every
// block the same share of the math within one step. A block's range is its pieces of consecutive
// tiles: a tile whose K steps all lie in one block is finished by that block (finish_tile, the
// plain epilogue); the other tiles' pieces go to `partial` as fp32 (a block has at most two: the
// one holding its first step, slot 0, and the one holding its last, slot 1), and
// gemm_sm90_streamk_reduce sums each split tile's pieces in a fixed order (the first block's piece
// plus the sum of the later blocks' in block order) and runs the epilogue through OutP (finish_sum). Deterministic: the split depends only on the shapes and the
// grid (BLOCKS * SMs of the device), so every run adds the same operands in the same order.
//
// partial: fp32 [grid][2][BM][BN], each slot a whole tile row-major (no bounds at the stores).
// Reduce launch: grid (min(ceil(sk_tiles * BM * BN / 8 / block), cap)), block <= 256, grid-stride,
// one thread per 8 consecutive columns of a tile row (threads of a tile one block ran return at once).
#pragma once
#include "gemm_sm90_splitk.cuh"

#ifndef STREAMK
#define STREAMK 0
#endif
#if STREAMK
#define STREAMK_PARAMS , float *partial, i64 dp_tiles, i64 sk_tiles
static_assert(!I8 && !SPLIT3 && !SPLITK, "stream-K serves the fp16 / bf16 / tf32 GEMMs");

// first K step (on the stream-K line of `iters` steps) of block b's range
__device__ __forceinline__ i64 sk_begin(i64 b, i64 iters, i64 grid) { return b * iters / grid; }
// the block whose range holds step x (ranges are non-empty: grid <= iters)
__device__ __forceinline__ int sk_block_of(i64 x, i64 iters, i64 grid) {
  return (int)(((x + 1) * grid + iters - 1) / iters - 1);
}

// This block's work unit i: its data-parallel tiles first, then the pieces of its stream-K range.
// Unit::slice is -1 for a whole tile (finished in place), else the piece's partial slot (0, 1).
// False past the block's last unit.
__device__ __forceinline__ bool streamk_unit(int i, int tiles_m, int tiles_n, int ktiles, int dp_tiles, int sk_tiles,
                                             Unit& w) {
  const int dp = dp_tiles / (int)gridDim.x;
  if (i < dp) {
    w.ti = tile_of((int)blockIdx.x + i * (int)gridDim.x, tiles_m, tiles_n, GROUP);
    w.slice = -1;
    w.k0 = 0;
    w.k1 = ktiles;
    return true;
  }
  const i64 iters = (i64)sk_tiles * ktiles, s0 = sk_begin(blockIdx.x, iters, gridDim.x),
            s1 = sk_begin(blockIdx.x + 1, iters, gridDim.x);
  const int j = i - dp;
  const i64 t = s0 / ktiles + j, first = t * ktiles;
  if (first >= s1) return false;
  w.ti = tile_of(dp_tiles + (int)t, tiles_m, tiles_n, GROUP);
  w.k0 = (int)max(s0 - first, (i64)0);
  w.k1 = (int)min(s1 - first, (i64)ktiles);
  w.slice = w.k0 == 0 && w.k1 == ktiles ? -1 : j == 0 ? 0 : 1;
  return true;
}

template <class F>
__device__ __forceinline__ F* partial_slot(F* partial, i64 block, int slot) {
  return partial + (block * 2 + slot) * (i64)(BM * BN);
}

// The consumers of a stream-K launch: each unit's K steps, then its epilogue (whole tile) or its
// accumulators to its slot (8-byte stores, kept in L2 for the reduce).
__device__ __forceinline__ void consume_streamk(const OutP& out, float* partial, unsigned char* smem,
                                                unsigned char* scratch, u64* full, u64* empty, int tiles_m,
                                                int tiles_n, int ktiles, int dp_tiles, int sk_tiles, int wg, int tid) {
  const int row0 = (wg - 1) * MSUB * 64, ct = (wg - 1) * 128 + tid;
  const int warp = tid / 32, lane = tid % 32;
  float acc[MSUB][BN / 2];
  Ring ring;
  Unit w;
  for (int i = 0; streamk_unit(i, tiles_m, tiles_n, ktiles, dp_tiles, sk_tiles, w); ++i) {
    mainloop(acc, ring, smem, scratch, full, empty, w.k1 - w.k0, row0, ct, tid);
    if (w.slice < 0) {
      finish_tile(out, w.ti, acc, row0, warp, lane);
      continue;
    }
    float* p = partial_slot(partial, blockIdx.x, w.slice) + (row0 + warp * 16 + lane / 4) * BN + 2 * (lane % 4);
#pragma unroll
    for (int s = 0; s < MSUB; ++s)
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
        __stcg((float2*)(p + s * 64 * BN + 8 * j), make_float2(acc[s][4 * j], acc[s][4 * j + 1]));
        __stcg((float2*)(p + (s * 64 + 8) * BN + 8 * j), make_float2(acc[s][4 * j + 2], acc[s][4 * j + 3]));
      }
  }
}

// The reduce: each split stream-K tile's pieces summed in block order, then OutP's epilogue.
__device__ __forceinline__ void reduce_streamk(const OutP& out, const float* partial, int tiles_m, int tiles_n,
                                               int ktiles, int dp_tiles, int sk_tiles, int grid) {
  constexpr int ROW_GROUPS = BN / 8, GROUPS = BM * ROW_GROUPS;  // 8-column groups of a tile row, of a tile
  const i64 iters = (i64)sk_tiles * ktiles;
  const bool vector_rows = vector_ok(out);
  for (i64 g = (i64)blockIdx.x * blockDim.x + threadIdx.x; g < (i64)sk_tiles * GROUPS;
       g += (i64)gridDim.x * blockDim.x) {
    const int t = (int)(g / GROUPS), e = (int)(g - (i64)t * GROUPS), r = e / ROW_GROUPS, c = (e % ROW_GROUPS) * 8;
    const i64 first = (i64)t * ktiles;
    const int b0 = sk_block_of(first, iters, grid), b1 = sk_block_of(first + ktiles - 1, iters, grid);
    if (b0 == b1) continue;  // one block ran the whole tile and finished it
    const TileIdx ti = tile_of(dp_tiles + t, tiles_m, tiles_n, GROUP);
    const i64 m = (i64)ti.tm * BM + r, n = (i64)ti.tn * BN + c;
    if (m >= out.M || n >= out.N) continue;
    // b0's piece is its last (slot 1) unless its range starts at the tile; then the later
    // blocks' first pieces (slot 0, 2 * BM * BN floats apart) in block order
    const float4* at = (const float4*)(partial_slot(partial, b0, sk_begin(b0, iters, grid) < first ? 1 : 0) + r * BN + c);
    const float4 x = __ldcg(at), y = __ldcg(at + 1);
    float v[8];
    sum_slices(partial_slot(partial, b0 + 1, 0) + r * BN + c, 2 * BM * BN, b1 - b0, v);
    const float q[8] = {x.x, x.y, x.z, x.w, y.x, y.y, y.z, y.w};
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = q[k] + v[k];
    finish_sum(out, ti.z, m, n, v, vector_rows);
  }
}
#else
#define STREAMK_PARAMS
#endif

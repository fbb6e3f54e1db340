// weight_only_mma: WeightOnlyMatMul (ai.polykit; compiler/ops/quant/weight_only.py) on tensor cores for
// W4A16 at small M (decode, M = 1..16 rows): Y = X @ dequantize(W)^T + B with mma.sync m16n8k16 (16-bit
// operands, float32 accumulate); tactics cuda.weight_only.mma_m16_k<WK>_c<8 * NT>
// (kernels/cuda/int8/weight_only_mma.py).
//
// Layouts: weight_only.cu's (X [M, K] row-major ELEM, W uint8 [N, ldw] rows K-contiguous two codes a
// byte, scale [N, nb] ELEM, zero point [N, nb] int8 for int4 / uint8 for uint4 or null, B [N] or null,
// Y [M, N] ELEM). Here ELEM is half_t or bf16_t, the weight int4 or uint4 (runtime `wtype` 0 / 1), K a
// multiple of 16 and block a multiple of 32 (a lane's 16-byte chunk of 32 codes lies in one scale
// block); the tactic's supports() refuses the rest (weight_only.cu's kernels take it).
// Numerics: each weight is dequantized exactly as the reference (weight_only_mma.cuh: the exact
// integer value - zero point times the scale, rounded once to ELEM); the mma multiplies 16-bit X by
// it exactly and sums in float32 (its own order inside an instruction); the K split's partials add
// in a fixed order (deterministic); Y = ELEM(sum + float(B)), one rounding.
//
// Geometry: block = WK warps, owning NT n8 tiles (columns n0 = blockIdx.x * 8 * NT ..) and a row tile of
// 16 (m0 = blockIdx.y * 16, stepping by gridDim.y * 16: any M). K is cut in slices of 128 elements
// (64 bytes of a packed row); warp w takes slices w, w + WK, .. in groups of G (the next group's
// weight chunks, scales and zero points are loaded before the current group's math: G * NT 16-byte
// loads in flight a lane). Lane = 4 * g + t (mma's groupID g, thread in group t): in slice s it loads
// chunk 4 * s + t (bytes 64 * s + 16 * t: 4 lanes read 64 contiguous bytes of a row) of row
// n0 + 8 * j + g for each tile j, and so supplies the B operand of column g: its 16 bytes are 4 words
// of 8 codes, word i dequantized to pairs (c0,c4) (c1,c5) (c2,c6) (c3,c7) (weight_only_mma.cuh);
// mma step 2i takes b = {(c0,c4), (c1,c5)}, step 2i + 1 b = {(c2,c6), (c3,c7)}: the mma's k positions
// 2t, 2t+1, 2t+8, 2t+9 are the chunk's elements 8i + {0,4,1,5} (then {2,6,3,7}). K order is
// free in a sum, so A follows the same map: the lane loads X[m0 + g (and + 8)][k .. k + 7], k =
// 128 * s + 32 * t + 8 * i, as 16 bytes (L1 / L2: X is small) and permutes it with 4 byte-permutes
// into the same pairs. Rows past M are zero (rows g + 8 are not loaded at all when M - m0 <= 8), as
// are elements past K (chunks starting past K load nothing; K % 16 == 0 keeps each 8 elements whole).
// After the loop each warp's C fragments (row g / g + 8, columns 2t, 2t + 1 of each tile) go to
// shared memory, part[WK][16][8 * NT] floats, and the block sums them in warp order.
//
// Cost (counted from the source, not read from SASS) per weight element, a lane's instructions: the
// dequantization ~2 (float16) / ~2.5 (bfloat16, two subtractions), the mma 2 a word a tile = 0.25, X
// 2 loads + 8 byte-permutes a word shared by the NT tiles = 1.25 / NT (half at M <= 8), a chunk's
// address, scale and zero point ~0.4: ~3.3 (NT = 2) / ~3 (NT = 4) a lane-element, i.e. K * 3.3 / 32
// warp-instructions a column, about a third of weight_only_gemv's at M = 1 and a ninth at M = 16.
// Bytes: the packed weight K / 2 a column (+ scales, zero points) from DRAM once; X M * K * 2 once a
// block from L2 (N / (8 * NT) blocks).
// Predicted at N = K = 4096, int4 blocked 128, float16 X (not measured). H200 (132 SMs, 4.8 TB/s): weights
// 8.8 MB ~ 1.8 us of DRAM; issue 16.8 M * 3.3 / 32 ~ 1.7 M warp-instructions ~ 2 us at 1.6 GHz; X from L2
// once a block: 2 MB at M = 1 (c16), 16.8 MB at M = 16 (c32: twice the weights, the limiter: ~2.5-3.5 us
// at L2 speed); with launch and the K chain (2 groups of dependent loads a warp) ~3-5 us at M = 1 and
// ~5-8 us at M = 16, against 26.5 / 90.6 us measured for weight_only_gemv and 15.5 / 14.9 us for the
// fp16 GEMM (the 2.5x target: <= ~6 us; M = 16 may miss it by X's re-reads: fewer of them needs more
// columns a block, i.e. K split over blocks). kernels/cuda/int8/weight_only_mma.py's mma_us is this
// model with weight_only.gemv_us's H100 constants (3.0 TB/s, X at DRAM speed, 3 us fixed): 6.6 / 6.4 us
// (c16 / c32) at M = 1 and 17.2 / 11.8 us at M = 16, against gemv_us's best 8.9 and 20.4.
// Registers (cuobjdump -res-usage, sm_90, no spills): 120-122 a thread at NT = 2 (2 blocks an SM), 198-215 at
// NT = 4 (1 block an SM; 188-196 before the slice's math moved to weight_only_mma.cuh's wq_slice_mma, shared
// with weight_only_mma_staged.cu: the same occupancy).
// Measured since (H100, ncu, M = 1, c32): 25.9 us at ncu's locked clocks, DRAM 10 %, occupancy 12.5 %; the
// SASS waits for each word's X load (inside the bounds branches of wq_x8) before its mma, so a warp's 4
// slices are ~16 dependent L1 / L2 round trips besides its 2 DRAM load groups: latency bound, 11.3 us (the
// layer, H100) against the ~3-5 us predicted above. mma_us now counts those round trips (X_LATENCY_US,
// fitted to that run); weight_only_mma_staged.cu is the geometry that removes them.
// Defines: ELEM (half_t, bf16_t), WK (warps a block), NT (n8 tiles a warp), G (slices a load group).
#include "weight_only_mma.cuh"

#ifndef ELEM
#define ELEM half_t
#endif
#ifndef WK
#define WK 8
#endif
#ifndef NT
#define NT 2
#endif
#ifndef G
#define G 2
#endif
#define WQ_COLS (8 * NT)

// acc[j] += X[rows, slice s] * W[tile j's columns, slice s]^T for the lane's chunk `ch[j]`, X from L1 / L2
template <int WT>
__device__ __forceinline__ void wq_slice(float (&acc)[NT][4], const WqChunk (&ch)[NT], const ELEM* __restrict__ x,
                                         int M, int K, int m0, int s, int g, int t, bool hi_rows, bool vec) {
  const int k0 = s * 128 + t * 32;
  wq_slice_mma<ELEM, WT, NT>(acc, ch, [=](int i, uint4& lo, uint4& hi) {
    lo = wq_x8(x, m0 + g, M, k0 + 8 * i, K, vec);
    hi = hi_rows ? wq_x8(x, m0 + g + 8, M, k0 + 8 * i, K, vec) : make_uint4(0u, 0u, 0u, 0u);
  });
}

template <int WT>
__device__ __forceinline__ void wq_body(float* part, const ELEM* __restrict__ x, const u8* __restrict__ w,
                                        const ELEM* __restrict__ scale, const void* __restrict__ zero,
                                        const ELEM* __restrict__ bias, ELEM* __restrict__ y, int M, int N, int K,
                                        int ldw, int block, int nb) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int n0 = blockIdx.x * WQ_COLS, slices = (K + 127) / 128;
  const bool vec = (size_t)x % 16 == 0;  // K % 16 == 0: every row then starts 16-byte aligned
  for (int m0 = blockIdx.y * 16; m0 < M; m0 += gridDim.y * 16) {
    const bool hi_rows = M - m0 > 8;  // warp-uniform: rows g + 8 hold data
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;
    WqChunk cur[G][NT], nxt[G][NT];
#pragma unroll
    for (int q = 0; q < G; ++q)
#pragma unroll
      for (int j = 0; j < NT; ++j)
        cur[q][j] = wq_load<WT>(w, scale, zero, n0 + 8 * j + g, N, ((warp + q * WK) * 4 + t) * 32, K, ldw, block, nb);
    for (int s0 = warp; s0 < slices; s0 += G * WK) {  // a group: slices s0, s0 + WK, .. (G of them)
#pragma unroll
      for (int q = 0; q < G; ++q)  // the next group's chunks, in flight during this group's math
#pragma unroll
        for (int j = 0; j < NT; ++j)
          nxt[q][j] = wq_load<WT>(w, scale, zero, n0 + 8 * j + g, N, ((s0 + (G + q) * WK) * 4 + t) * 32, K, ldw,
                                  block, nb);
#pragma unroll
      for (int q = 0; q < G; ++q)
        if (s0 + q * WK < slices) wq_slice<WT>(acc, cur[q], x, M, K, m0, s0 + q * WK, g, t, hi_rows, vec);
#pragma unroll
      for (int q = 0; q < G; ++q)
#pragma unroll
        for (int j = 0; j < NT; ++j) cur[q][j] = nxt[q][j];
    }
#pragma unroll
    for (int j = 0; j < NT; ++j) {  // C fragment: rows g, g + 8; columns 2t, 2t + 1 of tile j
      float* p = part + warp * 16 * WQ_COLS + j * 8 + 2 * t;
      p[g * WQ_COLS] = acc[j][0];
      p[g * WQ_COLS + 1] = acc[j][1];
      p[(g + 8) * WQ_COLS] = acc[j][2];
      p[(g + 8) * WQ_COLS + 1] = acc[j][3];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < 16 * WQ_COLS; i += 32 * WK) {  // the warps' partials in warp order
      const int m = m0 + i / WQ_COLS, n = n0 + i % WQ_COLS;
      float v = part[i];
#pragma unroll
      for (int p = 1; p < WK; ++p) v += part[p * 16 * WQ_COLS + i];
      if (m < M && n < N) st(y, (i64)m * N + n, bias ? __fadd_rn(v, ld(bias, n)) : v);
    }
    __syncthreads();  // part is reused by the next row tile
  }
}

extern "C" __global__ void __launch_bounds__(32 * WK)
weight_only_mma(const ELEM* __restrict__ x, const u8* __restrict__ w, const ELEM* __restrict__ scale,
                const void* __restrict__ zero, const ELEM* __restrict__ bias, ELEM* __restrict__ y, int M, int N,
                int K, int ldw, int block, int nb, int wtype) {
  __shared__ float part[WK * 16 * WQ_COLS];
  if (wtype == WQ_I4)
    wq_body<WQ_I4>(part, x, w, scale, zero, bias, y, M, N, K, ldw, block, nb);
  else
    wq_body<WQ_U4>(part, x, w, scale, zero, bias, y, M, N, K, ldw, block, nb);
}

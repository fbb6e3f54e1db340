// Split-K for the Hopper GEMM (gemm_sm90.cu with SPLITK 1; gemm_sm90_splitk.py): the consumers of
// the persistent kernel run each work unit (tile, K slice: unit_of) through the tile's K loop and
// store its fp32 accumulators to `partial`; gemm_sm90_splitk_reduce then sums the slices of each
// element in slice order and applies alpha, beta * C and the fused epilogue through OutP, as the
// unsplit kernel's epilogue does. Deterministic: every sum has the same operands in the same order
// whichever block ran which unit.
//
// partial: fp32, row-major [splits][items][M][NP] with NP = ceil(N / BN) * BN, so every column a
// fragment holds is inside its row (no column bounds at the stores) and each 8-column group of
// the reduce is two aligned 16-byte loads a slice.
// Reduce launch: grid (min(ceil(items * M * ceil(N / 8) / block), cap)), block <= 256 (grid-stride: one
// thread per 8 consecutive columns of a row).
#pragma once
#include "gemm_sm90_epilogue.cuh"

#if SPLITK
#define SPLITK_PARAMS , float *partial, i64 splits
static_assert(!I8, "split-K serves the float-accumulating GEMMs");

__device__ __forceinline__ i64 partial_cols(i64 N) { return (N + BN - 1) / BN * BN; }

// The consumers of a split-K launch: each unit's K range, then its accumulators to its slice of
// `partial` (a lane holds columns 2q, 2q + 1 of each 8-column block of rows m and m + 8: 8-byte
// stores, a quad filling one 32-byte sector; kept in L2 for the reduce).
__device__ __forceinline__ void consume_partials(float* partial, i64 M, i64 N, int items, unsigned char* smem,
                                                 unsigned char* scratch, u64* full, u64* empty, int tiles_m,
                                                 int tiles_n, int tiles, int ktiles, int splits, int wg, int tid) {
  const int row0 = (wg - 1) * MSUB * 64, ct = (wg - 1) * 128 + tid;
  const int warp = tid / 32, lane = tid % 32;
  const i64 np = partial_cols(N);
  float acc[MSUB][BN / 2];
  Ring ring;
  for (int u = blockIdx.x; u < tiles * splits; u += gridDim.x) {
    const Unit w = unit_of(u, tiles_m, tiles_n, tiles, ktiles, splits);
#if SPLIT3
    mainloop_3xtf32(acc, ring, smem, scratch, full, empty, w.k1 - w.k0, row0, ct, tid);
#else
    mainloop(acc, ring, smem, scratch, full, empty, w.k1 - w.k0, row0, ct, tid);
#endif
    float* p = partial + ((i64)w.slice * items + w.ti.z) * M * np + (i64)w.ti.tn * BN + 2 * (lane % 4);
    const i64 m_base = (i64)w.ti.tm * BM + row0 + warp * 16 + lane / 4;
#pragma unroll
    for (int s = 0; s < MSUB; ++s) {
      const i64 m = m_base + s * 64;
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
        if (m < M) __stcg((float2*)(p + m * np + 8 * j), make_float2(acc[s][4 * j], acc[s][4 * j + 1]));
        if (m + 8 < M) __stcg((float2*)(p + (m + 8) * np + 8 * j), make_float2(acc[s][4 * j + 2], acc[s][4 * j + 3]));
      }
    }
  }
}

// 8 consecutive columns of one row summed over the slices in slice order, their loads issued
// SLICE_BATCH slices at a time (one L2 round trip a batch, not one a slice)
constexpr int SLICE_BATCH = 4;
__device__ __forceinline__ void sum_slices(const float* p, i64 slice_stride, int splits, float (&v)[8]) {
  for (int s0 = 0; s0 < splits; s0 += SLICE_BATCH) {
    float4 q[2 * SLICE_BATCH];
#pragma unroll
    for (int b = 0; b < SLICE_BATCH; ++b)
      if (s0 + b < splits) {
        const float4* at = (const float4*)(p + (s0 + b) * slice_stride);
        q[2 * b] = __ldcg(at);
        q[2 * b + 1] = __ldcg(at + 1);
      }
#pragma unroll
    for (int b = 0; b < SLICE_BATCH; ++b)
      if (s0 + b < splits) {
        const float w[8] = {q[2 * b].x, q[2 * b].y, q[2 * b].z, q[2 * b].w,
                            q[2 * b + 1].x, q[2 * b + 1].y, q[2 * b + 1].z, q[2 * b + 1].w};
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = s0 + b == 0 ? w[i] : v[i] + w[i];
      }
  }
}

// The reduce: the slices' sum of each element, then OutP's epilogue (finish8 where vector_ok
// allows, else value + store2 a column pair at a time).
__device__ __forceinline__ void reduce_partials(const OutP& out, const float* partial, int items, int splits) {
  const i64 np = partial_cols(out.N), groups = (out.N + 7) / 8, rows = (i64)items * out.M;
  const bool vector_rows = vector_ok(out);
  for (i64 g = (i64)blockIdx.x * blockDim.x + threadIdx.x; g < rows * groups; g += (i64)gridDim.x * blockDim.x) {
    const i64 r = g / groups, n = (g - r * groups) * 8, z = r / out.M, m = r - z * out.M;
    float v[8];
    sum_slices(partial + r * np + n, rows * np, splits, v);
    if (vector_rows) {  // N % 8 == 0: the 8 columns are in the row
      finish8(out, z, m, n, v);
      continue;
    }
#pragma unroll
    for (int i = 0; i < 8; i += 2)
      if (n + i < out.N) {
        const float a = out.value(z, m, n + i, v[i]);
        const float b = n + i + 1 < out.N ? out.value(z, m, n + i + 1, v[i + 1]) : 0.f;
        out.store2(z, m, n + i, a, b);
      }
  }
}
#else
#define SPLITK_PARAMS
#endif

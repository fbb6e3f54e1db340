// MatMul / Gemm on Hopper tensor cores (sm_90a): Y[z] = alpha * A[z] (M x K) * B[z] + beta * C
// (storage types, tiles, pipeline: gemm_sm90_core.cuh; epilogue: gemm_sm90_epilogue.cuh).
//
// A is row-major [M, K] (K contiguous); B is [K, N] row-major (B_MN 1: N contiguous) or
// [N, K] (B_MN 0: a transposed Gemm operand, K contiguous). Both are read through TMA tensor
// maps of rank 3 (innermost dim first: K or N, then rows, then the batch item), so tiles past
// an edge are zero-filled by the copy engine; a batch item of an operand that does not vary
// over the batch uses coordinate 0 (a_batched / b_batched 0). Y is contiguous (z, M, N); C
// (Gemm only, may be null) is broadcast to (M, N) through element strides (scm, scn).
// The producer warpgroup's one thread issues the TMA loads of A and B.
// SPLITK 1 (gemm_sm90_splitk.cuh): the units are (tile, K slice) pairs, `splits` slices a tile, and
// the consumers store fp32 partials to `partial` instead of Y; gemm_sm90_splitk_reduce (this module)
// sums them and writes Y through the epilogue (C, Y and the epilogue inputs are its arguments).
// STREAMK 1 (gemm_sm90_streamk.cuh): whole waves of tiles unsplit, the rest spread over the blocks
// by K steps; a tile split between blocks is summed in the kernel by the block holding its last
// steps, from the others' fp32 pieces in `partial` (flag-ordered fixup: one launch).
#include "gemm_sm90_epilogue.cuh"
#include "gemm_sm90_splitk.cuh"
#include "gemm_sm90_streamk.cuh"

// The producer's TMA loads of one work unit's K steps into the stage ring
__device__ __forceinline__ void produce(const Stages& st, const TmaDesc* tm_a, const TmaDesc* tm_b, const Unit& w,
                                        i64 a_batched, i64 b_batched, int& stage, u32& phase) {
  const TileIdx ti = w.ti;
  const int za = a_batched ? ti.z : 0, zb = b_batched ? ti.z : 0;
  for (int kt = w.k0; kt < w.k1; ++kt, next_stage(stage, phase)) {
    bar_wait(&st.empty[stage], phase ^ 1);
    unsigned char* a = st.smem + stage * STAGE_BYTES;
    unsigned char* b = a + BM * 128;
    bar_expect_tx(&st.full[stage], STAGE_BYTES);
    tma_load_3d(a, tm_a, &st.full[stage], kt * KE, ti.tm * BM, za);
#if B_MN
#pragma unroll
    for (int j = 0; j < BN / KE; ++j)  // boxes of KE N (128 bytes) by KE K rows
      tma_load_3d(b + j * KE * 128, tm_b, &st.full[stage], ti.tn * BN + j * KE, kt * KE, zb);
#else
    tma_load_3d(b, tm_b, &st.full[stage], kt * KE, ti.tn * BN, zb);
#endif
  }
}

extern "C" __global__ void __launch_bounds__(128 * (CONSUMERS + 1), BLOCKS) gemm_sm90(
    const __grid_constant__ TmaDesc tm_a, const __grid_constant__ TmaDesc tm_b, const ELEM* C, ELEM* Y, i64 M,
    i64 N, i64 K, i64 scm, i64 scn, float alpha, float beta, i64 items, i64 a_batched, i64 b_batched SPLITK_PARAMS
        STREAMK_PARAMS I8_PARAMS EPI_PARAMS) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  const int tiles_m = (int)((M + BM - 1) / BM), tiles_n = (int)((N + BN - 1) / BN);
  const int tiles = tiles_m * tiles_n * (int)items;
  const int ktiles = (int)((K + KE - 1) / KE);
#if !SPLITK
  constexpr i64 splits = 1;
#endif
  if (threadIdx.x == 0) {
    tma_prefetch_desc(&tm_a);
    tma_prefetch_desc(&tm_b);
  }
  const Stages st = setup_stages(smem_raw, 1);

  if (wg == 0) {  // ---- producer: TMA loads, one thread ------------------------------------
    if (BLOCKS == 1) set_max_regs_dec<40>();
    int stage = 0;
    u32 phase = 0;
#if STREAMK
    Unit w;
    for (int i = 0; tid == 0 && streamk_unit(i, tiles_m, tiles_n, ktiles, (int)dp_tiles, (int)sk_tiles, w); ++i)
      produce(st, &tm_a, &tm_b, w, a_batched, b_batched, stage, phase);
#else
    for (int u = blockIdx.x; u < tiles * (int)splits && tid == 0; u += gridDim.x)
      produce(st, &tm_a, &tm_b, unit_of(u, tiles_m, tiles_n, tiles, ktiles, (int)splits), a_batched, b_batched,
              stage, phase);
#endif
  } else {  // ---- consumers (128 * 40 + 256 * 232 = 168 * 384: the launch allocation) --------------
    if (BLOCKS == 1) set_max_regs_inc<232>();
#if SPLITK
    consume_partials(partial, M, N, (int)items, st.smem, st.scratch, st.full, st.empty, tiles_m, tiles_n, tiles,
                     ktiles, (int)splits, wg, tid);
#else
    OutT out = MAKE_OUT(Y, C, M, N, scm, scn, alpha, beta);
#if I8 && !F8  // int8 operands, zero points 0 (int8_gemm_sm90.py): |x w| <= 2^14, so K < 256 keeps every |acc| below 2^22
    out.q.small_sums = K < 256;
#endif
#if HAS_EPILOGUE
    EPI_OF(out) = make_epi(EPI_ARGS);
#endif
#if STREAMK
    consume_streamk(out, partial, st.smem, st.scratch, st.full, st.empty, tiles_m, tiles_n, ktiles, (int)dp_tiles,
                    (int)sk_tiles, wg, tid);
#else
    consume(out, st.smem, st.scratch, st.full, st.empty, tiles_m, tiles_n, tiles, ktiles, wg, tid);
#endif
#endif
  }
}

#if SPLITK
extern "C" __global__ void __launch_bounds__(256) gemm_sm90_splitk_reduce(const ELEM* C, ELEM* Y, i64 M, i64 N,
                                                                           i64 scm, i64 scn, float alpha, float beta,
                                                                           i64 items, const float* partial,
                                                                           i64 splits EPI_PARAMS) {
  OutP out = make_out(Y, C, M, N, scm, scn, alpha, beta);
#if HAS_EPILOGUE
  out.epi = make_epi(EPI_ARGS);
#endif
  reduce_partials(out, partial, (int)items, (int)splits);
}
#endif

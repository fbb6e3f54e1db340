// conv_sm90: ai.polykit ConvNHWC (group 1, C % VEC == 0) on Hopper tensor cores (sm_90a) as an
// implicit GEMM with gemm_sm90.cu's consumers (gemm_sm90_core.cuh, gemm_sm90_epilogue.cuh):
// M = NB * OH * OW output pixels, N = output channels, K = KH * KW * C in (kh, kw, c) order, so
// the KRSC weight is B ([N, K], B_MN 0, through TMA) and Y [NB, OH, OW, N] is the row-major GEMM
// output. A is gathered by the whole producer warpgroup with 16-byte cp.async (VEC channels of
// one (kh, kw) tap; zeros in the padding and past K), completion counted on the stage's `full`
// barrier (cp.async.mbarrier.arrive.noinc). The conv bias is C (scm 0, scn 1, beta 1). With I8 1
// the same kernel runs INT8 layers (int8_sm90.py: s8 operands, int8_out.cuh's output).
// LDY: elements between consecutive output pixels' rows of Y (N when dense; a Concat's channel total
// when Y is placed in its slice: gemm_sm90_epilogue.cuh's OUT_ROW_STRIDE); the INT8 / FP8 outputs
// take it dense (N). D2S_H, D2S_W (defines): a depth_to_space ConvNHWC, OH / OW the conv's own output
// grid and N its bH * bW * C channels, stored rearranged (gemm_sm90_epilogue.cuh's yrow / ycol). LDX: elements between consecutive input pixels of X (C when dense; a Concat's
// channel total when X is placed in its slice and this conv reads it too: conv_sm90.py checks that
// LDX and X keep the 16-byte cp.async sources aligned); the INT8 / FP8 kernels read X dense (C).
// CONV_GROUPED 1 (conv_sm90_grouped.py): a grouped ConvNHWC, group g = blockIdx.z a dense conv of
// C (= Cg) input and N (= Mg) output channels: X + g * C (its pixels still LDX apart: the layer's
// channel total), the weights' rows by TMA coordinate z = g (tm_w's third dim the groups), Bias,
// Y + g * N (Y's rows LDY apart: the layer's output channels). M, K are a group's GEMM.
#define OUT_ROW_STRIDE 1
#ifndef CONV_GROUPED
#define CONV_GROUPED 0
#endif
#include "gemm_sm90_epilogue.cuh"

// rows of the A tile one producer thread gathers: rows tid / 8 + 16 * i, chunk tid % 8
#define ROWS_PER_THREAD (BM / 16)
// setmaxnreg moves registers only within the block's launch allocation (168 x 384 with two
// consumers): 128 * 56 + 256 * 224 = 168 * 384. Asking for more than was released hangs. Two
// blocks of two consumers (80 x 384 each): 128 * 56 + 256 * 88 <= 80 * 384.
#define MOVE_REGS (BLOCKS == 1 || CONSUMERS == 2)
#define CONV_PRODUCER_REGS 56
#define CONV_CONSUMER_REGS (BLOCKS == 1 ? (CONSUMERS == 1 ? 240 : 224) : 88)

extern "C" __global__ void __launch_bounds__(128 * (CONSUMERS + 1), BLOCKS) conv_sm90(
    const __grid_constant__ TmaDesc tm_w, const OPER* X, const ELEM* Bias, ELEM* Y, i64 M, i64 N, i64 K, int H,
    int W, int C, int OH, int OW, int KW, int SH, int SW, int PH, int PW, int DH, int DW, i64 LDY, i64 LDX I8_PARAMS
    EPI_PARAMS) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  const int tiles_m = (int)((M + BM - 1) / BM), tiles_n = (int)((N + BN - 1) / BN);
  const int tiles = tiles_m * tiles_n;
  const int ktiles = (int)((K + KE - 1) / KE);
  if (threadIdx.x == 0) tma_prefetch_desc(&tm_w);
#if CONV_GROUPED && !I8 && !F8
  const int grp = blockIdx.z;  // this block's group: its input channels, weight rows, outputs
  X += (i64)grp * C;
  Y += (i64)grp * N;
  if (Bias) Bias += (i64)grp * N;
#else
  const int grp = 0;
#endif
  const Stages st = setup_stages(smem_raw, 128 + 1);  // 128 cp.async arrivals + the TMA thread's expect_tx

  if (wg == 0) {  // ---- producer warpgroup: im2col rows by cp.async, weights by TMA -----------
    if (MOVE_REGS) set_max_regs_dec<CONV_PRODUCER_REGS>();
    const int chunk = tid % 8, c8s = C / VEC, kchunks = (int)(K / VEC);
#if I8 || F8
    const int ldx = C;  // the INT8 / FP8 tactics read X dense (and keep their registers)
    (void)LDX;
#else
    const i64 ldx = LDX;
#endif
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
        base[i] = m < M ? (i64)img * H * W * ldx : -1;
        ih0[i] = oh * SH - PH;
        iw0[i] = ow * SW - PW;
      }
      for (int kt = 0; kt < ktiles; ++kt, next_stage(stage, phase)) {
        bar_wait(&st.empty[stage], phase ^ 1);
        unsigned char* a = st.smem + stage * STAGE_BYTES;
        if (tid == 0) {
          bar_expect_tx(&st.full[stage], BN * 128);
          tma_load_3d(a + BM * 128, &tm_w, &st.full[stage], kt * KE, ti.tn * BN, grp);
        }
        const int q = kt * 8 + chunk;  // this thread's 16-byte chunk of K: tap (kh, kw), channels c8 * VEC..
        const int tap = q / c8s, c8 = q - tap * c8s, kh = tap / KW, kw = tap - kh * KW;
#pragma unroll
        for (int i = 0; i < ROWS_PER_THREAD; ++i) {
          const int r = tid / 8 + 16 * i;
          const int ih = ih0[i] + kh * DH, iw = iw0[i] + kw * DW;
          const bool ok = base[i] >= 0 && q < kchunks && ih >= 0 && ih < H && iw >= 0 && iw < W;
          const OPER* src = X + (ok ? base[i] + ((i64)ih * W + iw) * ldx + c8 * VEC : 0);
          cp_async16(a + r * 128 + ((chunk ^ (r & 7)) << 4), src, ok);
        }
        bar_arrive_cp_async(&st.full[stage]);
      }
    }
  } else {  // ---- consumers ---------------------------------------------------------------------
    if (MOVE_REGS) set_max_regs_inc<CONV_CONSUMER_REGS>();
    OutT out = MAKE_OUT(Y, Bias, M, N, 0, 1, 1.f, 1.f);
#if !I8 && !F8
    out.ldy = LDY;
#if D2S
    out.d2s_ow = OW;
    out.d2s_cb = N / (D2S_H * D2S_W);
#endif
#else
    (void)LDY;
#endif
#if HAS_EPILOGUE
    EPI_OF(out) = make_epi(EPI_ARGS);
#endif
    consume(out, st.smem, st.scratch, st.full, st.empty, tiles_m, tiles_n, tiles, ktiles, wg, tid);
  }
}

// conv_sm90: ai.polykit ConvNHWC (group 1, C % VEC == 0) on Hopper tensor cores (sm_90a) as an
// implicit GEMM with gemm_sm90.cu's consumers (gemm_sm90_core.cuh, gemm_sm90_epilogue.cuh):
// M = NB * OH * OW output pixels, N = output channels, K = KH * KW * C in (kh, kw, c) order, so
// the KRSC weight is B ([N, K], B_MN 0, through TMA) and Y [NB, OH, OW, N] is the row-major GEMM
// output. A is gathered by the whole producer warpgroup with 16-byte cp.async (VEC channels of
// one (kh, kw) tap; zeros in the padding and past K), completion counted on the stage's `full`
// barrier (cp.async.mbarrier.arrive.noinc). The conv bias is C (scm 0, scn 1, beta 1). With I8 1
// the same kernel runs INT8 layers (int8_sm90.py: s8 operands, int8_out.cuh's output).
// F8 1: FP8 layers (fp8_sm90.py: e4m3 operands, each stage's products added to fp32 accumulators); with
// F8_PIECES > 1 (fp8_conv_sm90.py) a stage's columns promoted in pieces (gemm_sm90_core.cuh mainloop_f8_pieces).
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
// a tile's residual in registers before its K loop up to 128 columns on INT8 (gemm_sm90_epilogue.cuh's TILE_INPUTS)
#define TILE_INPUT_COLS (F8 ? 256 : 128)
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
    const int chunk = tid % 8, c8s = C / VEC;
#if I8 || F8
    const int ldx = C;  // the INT8 / FP8 tactics read X dense (and keep their registers)
    (void)LDX;
#else
    const int ldx = (int)LDX;  // a channel total: conv_sm90.py keeps NB * H * W * C below 2^31
#endif
    int stage = 0;
    u32 phase = 0;
    // Per k-tile the producer's work is this loop's instructions (cuobjdump, fp16 3x3: 228 SASS instructions
    // a k-tile on the 64x32x2 tile and 307 on 128-row tiles before, with two integer divisions and 64-bit
    // index math a row), which bounds tiles whose wgmma work per k-tile is small (N <= 64). So: the chunk's
    // (tap, channel block) advances by counting, not dividing; a row keeps its input pixel's index and its
    // tap-0 coordinates (32-bit), and a k-tile adds one tap delta, compares two coordinates and makes one
    // widening multiply a row (rows past M carry a coordinate no image has).
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
      const TileIdx ti = tile_of(t, tiles_m, tiles_n, GROUP);
      int pix[ROWS_PER_THREAD];  // the row's input pixel (image, ih0, iw0) as an index (NB * H * W < 2^28)
      int ih0[ROWS_PER_THREAD], iw0[ROWS_PER_THREAD];
#pragma unroll
      for (int i = 0; i < ROWS_PER_THREAD; ++i) {
        const i64 m = (i64)ti.tm * BM + tid / 8 + 16 * i;
        const int img = (int)(m / (OH * OW)), px = (int)(m - (i64)img * OH * OW);
        const int oh = px / OW, ow = px - oh * OW;
        ih0[i] = oh * SH - PH;
        iw0[i] = ow * SW - PW;
        pix[i] = (img * H + ih0[i]) * W + iw0[i];
        if (m >= M) ih0[i] = -0x40000000;  // past M: below every image
      }
      const int arow = (tid / 8) * 128 + ((chunk ^ ((tid / 8) & 7)) << 4);  // row r's swizzled chunk, r = tid / 8 + 16 i
      // (per tile: computed once above the tile loop, ptxas kept them live into the consumers' register
      // increase and spilled there on the FP8 128x128 tile)
      const int KH = (int)(K / ((i64)KW * C));
      int c8 = chunk % c8s, kh = chunk / c8s / KW, kw = chunk / c8s - kh * KW;  // this thread's chunk of k-tile 0
      for (int kt = 0; kt < ktiles; ++kt, next_stage(stage, phase)) {
        bar_wait(&st.empty[stage], phase ^ 1);
        unsigned char* a = st.smem + stage * STAGE_BYTES;
        if (tid == 0) {
          bar_expect_tx(&st.full[stage], BN * 128);
          tma_load_3d(a + BM * 128, &tm_w, &st.full[stage], kt * KE, ti.tn * BN, grp);
        }
        const int dh = kh * DH, dw = kw * DW, dpix = dh * W + dw;
        const OPER* xc = X + c8 * VEC;
        const bool live = kh < KH;  // past K (the last k-tile's tail): zeros
#pragma unroll
        for (int i = 0; i < ROWS_PER_THREAD; ++i) {
          const bool ok = live && (unsigned)(ih0[i] + dh) < (unsigned)H && (unsigned)(iw0[i] + dw) < (unsigned)W;
          const OPER* src = ok ? xc + (i64)(pix[i] + dpix) * ldx : X;
          cp_async16(a + arow + 16 * 128 * i, src, ok);
        }
        bar_arrive_cp_async(&st.full[stage]);
        // the next k-tile's chunk: 8 chunks on, carried through channel blocks, taps and kernel rows
        for (c8 += 8; c8 >= c8s; c8 -= c8s)
          if (++kw == KW) {
            kw = 0;
            ++kh;
          }
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
#if I8  // int8 operands, zero points 0: |x w| <= 2^14, so K < 256 keeps every |acc| below 2^22
    out.q.small_sums = K < 256;
#endif
#if HAS_EPILOGUE
    EPI_OF(out) = make_epi(EPI_ARGS);
#endif
    consume(out, st.smem, st.scratch, st.full, st.empty, tiles_m, tiles_n, tiles, ktiles, wg, tid);
  }
}

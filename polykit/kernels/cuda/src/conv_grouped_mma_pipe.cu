// Grouped convolution, channels last, on tensor cores: ai.polykit ConvNHWC with group > 1, cpg =
// C / group a multiple of 8 input channels a group and Mg = M / group a multiple of 8 output
// channels a group; float16 or bfloat16 storage (ELEM half_t / bf16_t), fp32 accumulation; bias and
// the layer's fused epilogue (epilogue_hook.cuh) applied before the store. 2-D, any kernel size,
// strides, dilations and pads. Group 1 (a dense conv of few channels, conv_halo_mma.py) runs as one
// group: cpg = C, Mg = M, a slice CB = M or a divisor of it, so GB = 1 and every block stages all
// C channels of its window.
//
// X is (NB, H, W, C), W is (M, KH, KW, cpg) (KRSC), Y is (NB, OH, OW, M), bias M.
// Per group an implicit GEMM: D[pixel][m] = sum_k A[pixel][k] * B[k][m], k = tap * cpg + ci (the
// KRSC weight's own order), K = KH*KW*cpg padded to 16, on mma.sync.m16n8k16 (A row-major, B
// column-major: the weight row of an output channel is B's column).
//
// Work: a block computes a TH x TW spatial tile of one image (TH * TW <= the block's pixels, the
// rest masked) x CB output channels, CB a multiple of Mg (whole groups) or a divisor of it. Warp w
// takes channel chunk w % CW (8 * GM_NB channels of one group) and pixel chunk w / CW (16 * GM_WM
// pixels): GM_WM x GM_NB mma tiles, CW * PW warps. The block stages the input window once, in ELEM:
//   - the input tile + halo, IH rows x IW columns of the slice's GB = max(1, CB / Mg) groups'
//     channels, zeros outside the image. A row's columns are split by phase (column c at slot
//     (c % SW) * IWS + c / SW, IWS = ceil(IW / SW), IWP = SW * IWS slots a row), so the pixels a
//     stride-SW tile row reads at one tap are consecutive slots; slots CINP elements apart, CINP =
//     GB * cpg (+ 8 when GB * cpg / 8 is even): CINP / 8 odd, 8 consecutive slots on 8 distinct
//     16-byte bank groups;
//   - the weights of its CB channels, rows KP = roundup(K, 16) + 8 elements apart (KP / 8 odd),
//     zeros past K;
// with 16-byte cp.async copies (`vec_in`: X and W 16-byte aligned; else element by element through
// registers). GM_PERSIST 0: one tile a block, the copies in up to GM_PHASES commit groups by kernel
// row: group j holds the input rows and the weight columns that kernel row j is the first to need,
// so the MMAs of kernel row j run while the rows after it are in flight. GM_PERSIST 1: a block
// loops over tiles blockIdx.y, + gridDim.y, ... of all NBATCH images; the weights are staged once,
// the windows alternate between two buffers, the next tile's window in flight (its own commit
// group) while the block computes the current one. K is walked in steps of 16: as cpg % 8 == 0, each half
// (8 k) of a step lies in one tap, so a lane's fragments come from ldmatrix.x4 (A: 16 pixels x 16 k,
// each row 16 bytes of one pixel at one tap) and ldmatrix.x4 / .x2 (B: two / one n8 tiles).
// Stores: channel pairs as one 32-bit word (`vec_out`: Y 4-byte aligned, LDY even), else element by
// element; output pixel q's channels at Y + q * LDY (M, or a Concat's channel total where Y is placed in
// its slice), the epilogue's inputs at the dense index q * M + channel (gm_store).
//
// grid (ceil(M / CB), ceil(OH/TH) * ceil(OW/TW), NB), GM_PERSIST (ceil(M / CB), blocks a slice, 1):
// the channel slices of a tile are consecutive blocks, so the slices' narrow reads of the same
// pixels meet in L2 (whole lines from DRAM); block 32 * CW * PW threads, dynamic shared memory
// 2 * ((1 + GM_PERSIST) * IH*IWP*CINP + CB*KP) bytes (conv_grouped_mma.py: MmaPlan).
#include "conv_grouped_mma.cuh"

#define GM_PHASES 3    // cp.async commit groups (kernel rows 0, 1, the rest) without GM_PERSIST
#ifndef GM_PERSIST
#define GM_PERSIST 0   // blocks loop over tiles, double-buffered windows (else one tile, GM_PHASES)
#endif
#define GM_MIN_BLOCKS (GM_PERSIST ? 2 : 3)   // __launch_bounds__ (PERSIST at 3 spills with GM_NB 4)

// r[i] = matrix i's (row lane / 4, columns 2 (lane % 4) + {0, 1}); lane 8 i + j gives row j of matrix i
__device__ __forceinline__ void gm_ldsm_x4(u32* r, const ELEM* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"((u32)__cvta_generic_to_shared(p)));
}

// matrices 0 and 1 (lanes 0-15 give the rows)
__device__ __forceinline__ void gm_ldsm_x2(u32* r, const ELEM* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"((u32)__cvta_generic_to_shared(p)));
}

// 16 bytes global -> shared (cp.async, sm_80+); `ok` false writes zeros and reads nothing
__device__ __forceinline__ void gm_cp16(ELEM* dst, const ELEM* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"((u32)__cvta_generic_to_shared(dst)), "l"(src),
               "r"(ok ? 16 : 0) : "memory");
}

__device__ __forceinline__ void gm_cp_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}

// wait until at most `pending` (0 to GM_PHASES - 1) of this thread's commit groups are in flight
__device__ __forceinline__ void gm_cp_wait(int pending) {
  if (pending >= 2)
    asm volatile("cp.async.wait_group 2;" ::: "memory");
  else if (pending == 1)
    asm volatile("cp.async.wait_group 1;" ::: "memory");
  else
    asm volatile("cp.async.wait_group 0;" ::: "memory");
}

extern "C" __global__ void __launch_bounds__(256, GM_MIN_BLOCKS) conv_grouped_mma_pipe_nhwc(GM_PARAMS) {
  GM_BLOCK(blockIdx.x)
  const int CIN = (GB < G - g0 ? GB : G - g0) * cpg, CINP = GB * cpg + ((GB * cpg / 8) % 2 ? 0 : 8);
  const int IH = (TH - 1) * SH + (KH - 1) * DH + 1, IW = (TW - 1) * SW + (KW - 1) * DW + 1;
  const int IWS = (IW + SW - 1) / SW, IWP = SW * IWS, XS = IH * IWP * CINP;
  ELEM* xs = (ELEM*)gm_smem;                       // [GM_PERSIST + 1][IH][IWP][CINP]
  ELEM* ws = xs + (i64)(GM_PERSIST + 1) * XS;      // [CB][KP]

  // input rows [r0, r1) of image n's window for the tile at (oh0, ow0) into xb: 16-byte cp.async
  // chunks of 8 channels where `vec_in` (C, cpg, K multiples of 8; X and W 16-byte aligned), else
  // element by element through registers
  auto stage_rows = [&](ELEM* xb, int n, int oh0, int ow0, int r0, int r1) {
    const int ih0 = oh0 * SH - PH, iw0 = ow0 * SW - PW, cin = GB * cpg, nc = vec_in ? cin / 8 : cin;
    const ELEM* xn = X + (i64)n * H * W * C + ci0;
    for (int i = r0 * IW * nc + t; i < r1 * IW * nc; i += T) {
      const int k = i % nc, pix = i / nc, r = pix / IW, c = pix % IW, ih = ih0 + r, iw = iw0 + c;
      const i64 slot = ((i64)r * IWP + (c % SW) * IWS + c / SW) * CINP;
      const bool inside = ih >= 0 && ih < H && iw >= 0 && iw < W;
      if (vec_in) {
        const bool ok = k * 8 < CIN && inside;
        gm_cp16(xb + slot + k * 8, ok ? xn + ((i64)ih * W + iw) * C + k * 8 : X, ok);
      } else {
        st(xb, slot + k, k < CIN && inside ? (float)ld(xn, ((i64)ih * W + iw) * C + k) : 0.f);
      }
    }
  };
  // weight columns [k0, k1) (multiples of 8; zeros past K) of the slice's CB rows
  auto stage_weights = [&](int k0, int k1) {
    const int step = vec_in ? 8 : 1, kc = (k1 - k0) / step;
    for (int i = t; i < CB * kc; i += T) {
      const int k = k0 + (i % kc) * step, row = i / kc, co = m0 + row;
      const bool ok = co < M && k < K;
      if (vec_in)
        gm_cp16(ws + (i64)row * KP + k, ok ? Wt + (i64)co * K + k : Wt, ok);
      else
        st(ws, (i64)row * KP + k, ok ? (float)ld(Wt, (i64)co * K + k) : 0.f);
    }
  };

  const int CWn = CW, cw = warp % CWn, pw = warp / CWn;
  const int nl0 = cw * 8 * NB;               // the warp's first channel in the slice
  const int jg = (m0 + nl0) / Mg - g0;       // its group in the slice
  // A: lane l gives row l % 16 of each m16 tile at k half l / 16 (ldmatrix.x4's matrices 0-3 are
  // rows 0-7 / 8-15 at k 0-7, then at k 8-15: the fragment's a[0..3])
  const int ah = lane / 16;
  int rowoff[WM];
#pragma unroll
  for (int mi = 0; mi < WM; ++mi) {
    const int p = pw * 16 * WM + mi * 16 + lane % 16, pr = p / TW, pc = p % TW;
    rowoff[mi] = (pr < TH ? pr * SH * IWP + pc : 0) * CINP + jg * cpg;
  }
  // B: lane l gives channel l % 8 of n8 tile l / 16 (x4: two tiles) at k half (l / 8) % 2
  const ELEM* wl = ws + (i64)(nl0 + (lane / 16) * 8 + lane % 8) * KP + ((lane / 8) % 2) * 8;
  const ELEM* wl2 = ws + (i64)(nl0 + lane % 8) * KP + ((lane / 8) % 2) * 8;   // .x2: lanes 0-15 count
  float acc[WM][NB][4];
  // the MMAs of k steps [k0, k1) on the window in xb
  auto steps = [&](const ELEM* xb, int k0, int k1) {
    for (int kk = k0; kk < k1; kk += 16) {
      // the lane's half of the step (8 k) lies in one tap: its input offset (none past K)
      const int kl = kk + 8 * ah, tap = kl / cpg, ci = kl - tap * cpg, kh = tap / KW, kw = tap % KW;
      const bool ok = kl < K, ok1 = kk + 8 < K;
      const int off = ok ? (kh * DH * IWP + ((kw * DW) % SW) * IWS + (kw * DW) / SW) * CINP + ci : 0;
      u32 b[NB][2];
#pragma unroll
      for (int ni = 0; ni + 1 < NB; ni += 2) {
        u32 r[4];
        gm_ldsm_x4(r, wl + (i64)ni * 8 * KP + kk);
        b[ni][0] = r[0];
        b[ni][1] = r[1];
        b[ni + 1][0] = r[2];
        b[ni + 1][1] = r[3];
      }
      if (NB % 2) gm_ldsm_x2(b[NB - 1], wl2 + (i64)(NB - 1) * 8 * KP + kk);
#pragma unroll
      for (int mi = 0; mi < WM; ++mi) {
        u32 a[4];
        gm_ldsm_x4(a, xb + rowoff[mi] + off);
        if (!ok1) a[2] = a[3] = 0u;
#pragma unroll
        for (int ni = 0; ni < NB; ++ni) gm_mma(acc[mi][ni], a, b[ni]);
      }
    }
  };

#if GM_PERSIST
  // tiles i = blockIdx.y, + gridDim.y, ... of the NBATCH images' ceil(OH / TH) x tiles_w each: the
  // weights and the first window in group 0, then each iteration commits the next tile's window
  // into the other buffer before computing this one
  const int tiles = (OH + TH - 1) / TH * tiles_w, total = tiles * NBATCH;
  int i = (int)blockIdx.y;
  stage_weights(0, KP);
  if (i < total) {
    GM_TILE(i % tiles)
    stage_rows(xs, i / tiles, oh0, ow0, 0, IH);
  }
  gm_cp_commit();
  for (int it = 0; i < total; ++it, i += (int)gridDim.y) {
    const int next = i + (int)gridDim.y;
    if (next < total) {
      GM_TILE(next % tiles)
      stage_rows(xs + ((it + 1) & 1) * XS, next / tiles, oh0, ow0, 0, IH);
    }
    gm_cp_commit();
    gm_cp_wait(1);     // all but the newest group: this tile's window (and the weights) landed
    __syncthreads();
    GM_TILE(i % tiles)
    gm_zero(acc);
    steps(xs + (it & 1) * XS, 0, K);
    gm_store(acc, Bias, Y, i / tiles, OH, OW, M, TH, TW, oh0, ow0, pw * 16 * WM, m0 + nl0, lane, vec_out,
             LDY GM_EPI_ARG);
    __syncthreads();   // every warp is done with this buffer before the next iteration refills it
  }
#else
  // phases: steps [kb[j], kb[j + 1]) touch kernel rows <= j only; input rows [rb[j], rb[j + 1]) and
  // weight columns [kb[j], kb[j + 1]) are the ones phase j is the first to read
  GM_TILE(blockIdx.y)
  const int n = (int)blockIdx.z, NPH = KH < GM_PHASES ? KH : GM_PHASES, KR = KW * cpg;
  int kb[GM_PHASES + 1], rb[GM_PHASES + 1];
  kb[0] = 0;
  rb[0] = 0;
#pragma unroll
  for (int j = 1; j <= GM_PHASES; ++j) {
    const int kj = j * KR / 16 * 16, rj = (TH - 1) * SH + (j - 1) * DH + 1;
    kb[j] = j >= NPH ? KP : (kj < K ? kj : K);
    rb[j] = j >= NPH ? IH : (rj < IH ? rj : IH);
  }
#pragma unroll
  for (int j = 0; j < GM_PHASES; ++j) {
    if (j >= NPH) break;
    stage_rows(xs, n, oh0, ow0, rb[j], rb[j + 1]);
    stage_weights(kb[j], kb[j + 1]);
    gm_cp_commit();
  }
  gm_zero(acc);
#pragma unroll
  for (int j = 0; j < GM_PHASES; ++j) {
    if (j >= NPH) break;
    gm_cp_wait(NPH - 1 - j);
    __syncthreads();
    steps(xs, kb[j], j + 1 == NPH ? K : kb[j + 1]);
  }
  gm_store(acc, Bias, Y, n, OH, OW, M, TH, TW, oh0, ow0, pw * 16 * WM, m0 + nl0, lane, vec_out, LDY GM_EPI_ARG);
#endif
}

// Grouped convolution, channels last, on tensor cores: ai.polykit ConvNHWC with group > 1, cpg =
// C / group a multiple of 8 input channels a group and Mg = M / group a multiple of 8 output
// channels a group; float16 or bfloat16 storage (ELEM half_t / bf16_t), fp32 accumulation; bias and
// the layer's fused epilogue (epilogue_hook.cuh) applied before the store. 2-D, any kernel size,
// strides, dilations and pads.
//
// X is (NB, H, W, C), W is (M, KH, KW, cpg) (KRSC), Y is (NB, OH, OW, M), bias M.
// Per group an implicit GEMM: D[pixel][m] = sum_k A[pixel][k] * B[k][m], k = tap * cpg + ci (the
// KRSC weight's own order), K = KH*KW*cpg padded to 16, on mma.sync.m16n8k16 (A row-major, B
// column-major: the weight row of an output channel is B's column).
//
// Work: a block computes TP = TH * TW output pixels (a TH x TW spatial tile of one image) x CB output
// channels, CB a multiple of Mg (whole groups) or a divisor of it. Warp w takes channel chunk
// w % CW (8 * GM_NB channels of one group) and pixel chunk w / CW (16 * GM_WM pixels): GM_WM x GM_NB
// mma tiles, CW * PW warps. The block stages in shared memory, in ELEM:
//   - the input tile + halo, IH x IW pixels of the slice's GB = max(1, CB / Mg) groups' channels,
//     pixels CINP = GB * cpg + 8 elements apart (16-byte copies where `vec_in`), zeros outside;
//   - the weights of its CB channels, rows KP = roundup(K, 16) + 8 elements apart, zeros past K;
// then walks K in steps of 16: as cpg % 8 == 0, each half (8 k) of a step lies in one tap, so a
// lane's A registers are 32-bit pairs of consecutive channels of one pixel at one tap.
// Stores: channel pairs as one 32-bit word (`vec_out`: Y 4-byte aligned, LDY even), else element by
// element; output pixel q's channels at Y + q * LDY (M, or a Concat's channel total where Y is placed in
// its slice), the epilogue's inputs at the dense index q * M + channel (gm_store).
//
// grid (ceil(OH/TH) * ceil(OW/TW), ceil(M / CB), NB), block 32 * CW * PW threads, dynamic shared
// memory 2 * (IH*IW*CINP + CB*KP) bytes (conv_grouped_mma.py: MmaPlan).
#include "conv_grouped_mma.cuh"

extern "C" __global__ void __launch_bounds__(256) conv_grouped_mma_nhwc(GM_PARAMS) {
  GM_BLOCK(blockIdx.y)
  GM_TILE(blockIdx.x)
  const int n = (int)blockIdx.z;
  const int gid = lane / 4, tig = lane % 4;
  const int CIN = (GB < G - g0 ? GB : G - g0) * cpg, CINP = GB * cpg + 8;
  const int IH = (TH - 1) * SH + (KH - 1) * DH + 1, IW = (TW - 1) * SW + (KW - 1) * DW + 1;
  ELEM* xs = (ELEM*)gm_smem;                 // [IH * IW][CINP]
  ELEM* ws = xs + (i64)IH * IW * CINP;       // [CB][KP]

  const int ih0 = oh0 * SH - PH, iw0 = ow0 * SW - PW, npix = IH * IW;
  const ELEM* xn = X + (i64)n * H * W * C + ci0;
  if (vec_in) {  // 16-byte chunks of 8 channels (C, cpg, K multiples of 8; X and W 16-byte aligned)
    const int nc = GB * cpg / 8;
    for (int i = t; i < npix * nc; i += T) {
      const int k8 = i % nc, pix = i / nc, r = pix / IW, c = pix % IW, ih = ih0 + r, iw = iw0 + c;
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (k8 * 8 < CIN && ih >= 0 && ih < H && iw >= 0 && iw < W) v = *(const uint4*)(xn + ((i64)ih * W + iw) * C + k8 * 8);
      *(uint4*)(xs + (i64)pix * CINP + k8 * 8) = v;
    }
    const int kc = KP / 8;
    for (int i = t; i < CB * kc; i += T) {
      const int k8 = i % kc, row = i / kc, co = m0 + row;
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (co < M && k8 * 8 < K) v = *(const uint4*)(Wt + (i64)co * K + k8 * 8);
      *(uint4*)(ws + (i64)row * KP + k8 * 8) = v;
    }
  } else {
    for (int i = t; i < npix * GB * cpg; i += T) {
      const int k = i % (GB * cpg), pix = i / (GB * cpg), r = pix / IW, c = pix % IW, ih = ih0 + r, iw = iw0 + c;
      float v = 0.f;
      if (k < CIN && ih >= 0 && ih < H && iw >= 0 && iw < W) v = (float)ld(xn, ((i64)ih * W + iw) * C + k);
      st(xs, (i64)pix * CINP + k, v);
    }
    for (int i = t; i < CB * KP; i += T) {
      const int k = i % KP, row = i / KP, co = m0 + row;
      st(ws, i, co < M && k < K ? (float)ld(Wt, (i64)co * K + k) : 0.f);
    }
  }
  __syncthreads();

  const int CWn = CW, cw = warp % CWn, pw = warp / CWn;
  const int nl0 = cw * 8 * NB;               // the warp's first channel in the slice
  const int jg = (m0 + nl0) / Mg - g0;       // its group in the slice
  // the input-tile offset of each of the lane's A rows (pixels gid and gid + 8 of each m16 tile)
  int rowoff[WM][2];
#pragma unroll
  for (int mi = 0; mi < WM; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int p = pw * 16 * WM + mi * 16 + gid + 8 * h, pr = p / TW, pc = p % TW;
      rowoff[mi][h] = (pr < TH ? (pr * SH * IW + pc * SW) * CINP : 0) + jg * cpg + 2 * tig;
    }
  float acc[WM][NB][4];
  gm_zero(acc);

  const ELEM* wl = ws + (i64)(nl0 + gid) * KP + 2 * tig;
  for (int k0 = 0; k0 < K; k0 += 16) {
    // each half of the step (8 k) lies in one tap: its input offset (or none past K)
    int off[2];
    bool ok[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int kb = k0 + 8 * h, tap = kb / cpg, ci = kb - tap * cpg;
      ok[h] = kb < K;
      off[h] = ok[h] ? ((tap / KW) * DH * IW + (tap % KW) * DW) * CINP + ci : 0;
    }
    u32 b[NB][2];
#pragma unroll
    for (int ni = 0; ni < NB; ++ni) {
      const ELEM* wp = wl + (i64)ni * 8 * KP + k0;
      b[ni][0] = *(const u32*)wp;
      b[ni][1] = *(const u32*)(wp + 8);
    }
#pragma unroll
    for (int mi = 0; mi < WM; ++mi) {
      u32 a[4];
      a[0] = ok[0] ? *(const u32*)(xs + rowoff[mi][0] + off[0]) : 0u;
      a[1] = ok[0] ? *(const u32*)(xs + rowoff[mi][1] + off[0]) : 0u;
      a[2] = ok[1] ? *(const u32*)(xs + rowoff[mi][0] + off[1]) : 0u;
      a[3] = ok[1] ? *(const u32*)(xs + rowoff[mi][1] + off[1]) : 0u;
#pragma unroll
      for (int ni = 0; ni < NB; ++ni) gm_mma(acc[mi][ni], a, b[ni]);
    }
  }

  gm_store(acc, Bias, Y, n, OH, OW, M, TH, TW, oh0, ow0, pw * 16 * WM, m0 + nl0, lane, vec_out, LDY GM_EPI_ARG);
}

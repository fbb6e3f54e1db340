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
// with 16-byte cp.async copies (`vec_in`: X and W 16-byte aligned) in up to GM_PHASES commit
// groups by kernel row: group j holds the input rows and the weight columns that kernel row j is
// the first to need, so the MMAs of kernel row j run while the rows after it are in flight (the
// element path stages everything at once). K is walked in steps of 16: as cpg % 8 == 0, each half
// (8 k) of a step lies in one tap, so a lane's fragments come from ldmatrix.x4 (A: 16 pixels x 16 k,
// each row 16 bytes of one pixel at one tap) and ldmatrix.x4 / .x2 (B: two / one n8 tiles).
// Stores: channel pairs as one 32-bit word (`vec_out`: Y 4-byte aligned), else element by element.
//
// grid (ceil(M / CB), ceil(OH/TH) * ceil(OW/TW), NB): the channel slices of a tile are consecutive
// blocks, so the slices' narrow reads of the same pixels meet in L2 (whole lines from DRAM); block
// 32 * CW * PW threads, dynamic shared memory 2 * (IH*IWP*CINP + CB*KP) bytes (conv_grouped_mma.py:
// MmaPlan).
#include "conv_grouped_mma.cuh"

#define GM_PHASES 3    // cp.async commit groups (kernel rows 0, 1, the rest)

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

extern "C" __global__ void __launch_bounds__(256, 3) conv_grouped_mma_pipe_nhwc(GM_PARAMS) {
  GM_BLOCK(blockIdx.y, blockIdx.x)
  const int CIN = (GB < G - g0 ? GB : G - g0) * cpg, CINP = GB * cpg + ((GB * cpg / 8) % 2 ? 0 : 8);
  const int IH = (TH - 1) * SH + (KH - 1) * DH + 1, IW = (TW - 1) * SW + (KW - 1) * DW + 1;
  const int IWS = (IW + SW - 1) / SW, IWP = SW * IWS;
  ELEM* xs = (ELEM*)gm_smem;                 // [IH][IWP][CINP]
  ELEM* ws = xs + (i64)IH * IWP * CINP;      // [CB][KP]

  // phases: steps [kb[j], kb[j + 1]) touch kernel rows <= j only; input rows [rb[j], rb[j + 1]) and
  // weight columns [kb[j], kb[j + 1]) are the ones phase j is the first to read
  const int NPH = KH < GM_PHASES ? KH : GM_PHASES, KR = KW * cpg;
  int kb[GM_PHASES + 1], rb[GM_PHASES + 1];
  kb[0] = 0;
  rb[0] = 0;
#pragma unroll
  for (int j = 1; j <= GM_PHASES; ++j) {
    const int kj = j * KR / 16 * 16, rj = (TH - 1) * SH + (j - 1) * DH + 1;
    kb[j] = j >= NPH ? KP : (kj < K ? kj : K);
    rb[j] = j >= NPH ? IH : (rj < IH ? rj : IH);
  }

  const int ih0 = oh0 * SH - PH, iw0 = ow0 * SW - PW;
  const ELEM* xn = X + (i64)n * H * W * C + ci0;
  if (vec_in) {  // 16-byte chunks of 8 channels (C, cpg, K multiples of 8; X and W 16-byte aligned)
    const int nc = GB * cpg / 8;
#pragma unroll
    for (int j = 0; j < GM_PHASES; ++j) {
      if (j >= NPH) break;
      for (int i = rb[j] * IW * nc + t; i < rb[j + 1] * IW * nc; i += T) {
        const int k8 = i % nc, pix = i / nc, r = pix / IW, c = pix % IW, ih = ih0 + r, iw = iw0 + c;
        const bool ok = k8 * 8 < CIN && ih >= 0 && ih < H && iw >= 0 && iw < W;
        gm_cp16(xs + ((i64)r * IWP + (c % SW) * IWS + c / SW) * CINP + k8 * 8,
                ok ? xn + ((i64)ih * W + iw) * C + k8 * 8 : X, ok);
      }
      const int kc0 = kb[j] / 8, kc = kb[j + 1] / 8 - kc0;
      for (int i = t; i < CB * kc; i += T) {
        const int k8 = kc0 + i % kc, row = i / kc, co = m0 + row;
        const bool ok = co < M && k8 * 8 < K;
        gm_cp16(ws + (i64)row * KP + k8 * 8, ok ? Wt + (i64)co * K + k8 * 8 : Wt, ok);
      }
      gm_cp_commit();
    }
  } else {
    for (int i = t; i < IH * IW * GB * cpg; i += T) {
      const int k = i % (GB * cpg), pix = i / (GB * cpg), r = pix / IW, c = pix % IW, ih = ih0 + r, iw = iw0 + c;
      float v = 0.f;
      if (k < CIN && ih >= 0 && ih < H && iw >= 0 && iw < W) v = (float)ld(xn, ((i64)ih * W + iw) * C + k);
      st(xs, ((i64)r * IWP + (c % SW) * IWS + c / SW) * CINP + k, v);
    }
    for (int i = t; i < CB * KP; i += T) {
      const int k = i % KP, row = i / KP, co = m0 + row;
      st(ws, i, co < M && k < K ? (float)ld(Wt, (i64)co * K + k) : 0.f);
    }
  }

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
  gm_zero(acc);

#pragma unroll
  for (int j = 0; j < GM_PHASES; ++j) {
    if (j >= NPH) break;
    gm_cp_wait(NPH - 1 - j);
    __syncthreads();
    for (int k0 = kb[j]; k0 < (j + 1 == NPH ? K : kb[j + 1]); k0 += 16) {
      // the lane's half of the step (8 k) lies in one tap: its input offset (none past K)
      const int kl = k0 + 8 * ah, tap = kl / cpg, ci = kl - tap * cpg, kh = tap / KW, kw = tap % KW;
      const bool ok = kl < K, ok1 = k0 + 8 < K;
      const int off = ok ? (kh * DH * IWP + ((kw * DW) % SW) * IWS + (kw * DW) / SW) * CINP + ci : 0;
      u32 b[NB][2];
#pragma unroll
      for (int ni = 0; ni + 1 < NB; ni += 2) {
        u32 r[4];
        gm_ldsm_x4(r, wl + (i64)ni * 8 * KP + k0);
        b[ni][0] = r[0];
        b[ni][1] = r[1];
        b[ni + 1][0] = r[2];
        b[ni + 1][1] = r[3];
      }
      if (NB % 2) gm_ldsm_x2(b[NB - 1], wl2 + (i64)(NB - 1) * 8 * KP + k0);
#pragma unroll
      for (int mi = 0; mi < WM; ++mi) {
        u32 a[4];
        gm_ldsm_x4(a, xs + rowoff[mi] + off);
        if (!ok1) a[2] = a[3] = 0u;
#pragma unroll
        for (int ni = 0; ni < NB; ++ni) gm_mma(acc[mi][ni], a, b[ni]);
      }
    }
  }

  gm_store(acc, Bias, Y, n, OH, OW, M, TH, TW, oh0, ow0, pw * 16 * WM, m0 + nl0, lane, vec_out GM_EPI_ARG);
}

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
// Stores: channel pairs as one 32-bit word (`vec_out`: Y 4-byte aligned), else element by element.
//
// grid (ceil(OH/TH) * ceil(OW/TW), ceil(M / CB), NB), block 32 * CW * PW threads, dynamic shared
// memory 2 * (IH*IW*CINP + CB*KP) bytes (conv_grouped_mma.py: MmaPlan).
#include "dtypes.cuh"
#include "epilogue_hook.cuh"

#ifndef GM_WM
#define GM_WM 2        // m16 tiles (16 pixels each) a warp
#endif
#ifndef GM_NB
#define GM_NB 1        // n8 tiles (8 output channels of one group each) a warp
#endif
#ifndef GM_BF16
#define GM_BF16 0      // bfloat16 operands (else float16)
#endif

#define GM_BASE_PARAMS                                                                                             \
  const ELEM *X, const ELEM *Wt, const ELEM *Bias, ELEM *Y, int H, int W, int C, int M, int G, int OH, int OW,    \
      int KH, int KW, int SH, int SW, int PH, int PW, int DH, int DW, int TH, int TW, int CB, int CW, int tiles_w, \
      int vec_in, int vec_out
#define GM_PARAMS GM_BASE_PARAMS EPI_PARAMS
#define GM_BASE_ARGS X, Wt, Bias, Y, H, W, C, M, G, OH, OW, KH, KW, SH, SW, PH, PW, DH, DW, TH, TW, CB, CW, tiles_w, \
      vec_in, vec_out
#define GM_ARGS GM_BASE_ARGS EPI_COMMA_ARGS

// c[4] += a[4] (16 x 16, row) * b[2] (16 x 8, col)
__device__ __forceinline__ void gm_mma(float* c, const u32* a, const u32* b) {
#if GM_BF16
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

extern "C" __global__ void __launch_bounds__(256) conv_grouped_mma_nhwc(GM_PARAMS) {
  extern __shared__ __align__(16) unsigned char gm_smem[];
  constexpr int WM = GM_WM, NB = GM_NB;
#if HAS_EPILOGUE
  const EpiState E = make_epi(EPI_ARGS);
#endif
  const int T = blockDim.x, t = threadIdx.x, warp = t / 32, lane = t % 32;
  const int gid = lane / 4, tig = lane % 4;
  const int tile_w = (int)(blockIdx.x % (unsigned)tiles_w), tile_h = (int)(blockIdx.x / (unsigned)tiles_w);
  const int oh0 = tile_h * TH, ow0 = tile_w * TW, n = (int)blockIdx.z;
  const int cpg = C / G, Mg = M / G, K = KH * KW * cpg, KP = (K + 15) / 16 * 16 + 8;
  const int m0 = (int)blockIdx.y * CB, g0 = m0 / Mg;
  const int GB = CB >= Mg ? CB / Mg : 1, ci0 = g0 * cpg;
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
#pragma unroll
  for (int mi = 0; mi < WM; ++mi)
#pragma unroll
    for (int ni = 0; ni < NB; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.f;

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

#pragma unroll
  for (int mi = 0; mi < WM; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int p = pw * 16 * WM + mi * 16 + gid + 8 * h, pr = p / TW, pc = p % TW;
      const int oh = oh0 + pr, ow = ow0 + pc;
      if (pr >= TH || oh >= OH || ow >= OW) continue;
#pragma unroll
      for (int ni = 0; ni < NB; ++ni) {
        const int co = m0 + nl0 + ni * 8 + 2 * tig;
        if (co >= M) continue;
        const i64 oi = (((i64)n * OH + oh) * OW + ow) * M + co;
        float y[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          y[e] = acc[mi][ni][2 * h + e] + (Bias ? (float)ld(Bias, co + e) : 0.f);
#if HAS_EPILOGUE
          y[e] = apply_epilogue(E, y[e], oi + e, co + e);
#endif
        }
        if (vec_out) {
          ELEM out[2];
          st(out, 0, y[0]);
          st(out, 1, y[1]);
          *(u32*)(Y + oi) = *(const u32*)out;
        } else {
          st(Y, oi, y[0]);
          st(Y, oi + 1, y[1]);
        }
      }
    }
}

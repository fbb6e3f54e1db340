// conv_grouped_mma.cu and conv_grouped_mma_pipe.cu (grouped ConvNHWC on mma.sync m16n8k16): the
// compile-time warp shape, the kernels' parameters, the mma and the store of a warp's accumulators.
#pragma once
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
      int NBATCH, int vec_in, int vec_out, i64 LDY
#define GM_PARAMS GM_BASE_PARAMS EPI_PARAMS
#define GM_BASE_ARGS X, Wt, Bias, Y, H, W, C, M, G, OH, OW, KH, KW, SH, SW, PH, PW, DH, DW, TH, TW, CB, CW, tiles_w, \
      NBATCH, vec_in, vec_out, LDY
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

// the accumulators of a warp's GM_WM x GM_NB tiles, zeroed
__device__ __forceinline__ void gm_zero(float (&acc)[GM_WM][GM_NB][4]) {
#pragma unroll
  for (int mi = 0; mi < GM_WM; ++mi)
#pragma unroll
    for (int ni = 0; ni < GM_NB; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.f;
}

#if HAS_EPILOGUE
#define GM_EPI_PARAM , const EpiState& E
#define GM_EPI_ARG , E
#define GM_EPI_STATE const EpiState E = make_epi(EPI_ARGS);
#else
#define GM_EPI_PARAM
#define GM_EPI_ARG
#define GM_EPI_STATE
#endif

// A block's shared memory, warp and lane, group geometry and channel slice (`slice_idx`; m0 its
// first output channel, g0 its first group, GB its groups), E the epilogue's state
#define GM_BLOCK(slice_idx) \
  extern __shared__ __align__(16) unsigned char gm_smem[]; \
  constexpr int WM = GM_WM, NB = GM_NB; \
  GM_EPI_STATE \
  const int T = blockDim.x, t = threadIdx.x, warp = t / 32, lane = t % 32; \
  const int cpg = C / G, Mg = M / G, K = KH * KW * cpg, KP = (K + 15) / 16 * 16 + 8; \
  const int m0 = (int)(slice_idx) * CB, g0 = m0 / Mg; \
  const int GB = CB >= Mg ? CB / Mg : 1, ci0 = g0 * cpg;

// The warp's GM_WM x GM_NB tiles (its pixels from p0 of the TH x TW tile at (oh0, ow0), its channels
// from c0) + bias through the epilogue into Y: channel pairs as one 32-bit word (`vec_out`: Y 4-byte
// aligned, LDY even), else element by element; pixels past the tile or the output and channels past M
// skipped. Output pixel q's channels start at Y + q * LDY (M, or a channels-last Concat's channel
// total where Y is placed in its slice: conv_depthwise.tile_enqueue's row_stride); the epilogue's
// inputs keep the dense index q * M + channel.
__device__ __forceinline__ void gm_store(const float (&acc)[GM_WM][GM_NB][4], const ELEM* Bias, ELEM* Y, int n,
                                         int OH, int OW, int M, int TH, int TW, int oh0, int ow0, int p0, int c0,
                                         int lane, int vec_out, i64 LDY
                                         GM_EPI_PARAM) {
  const int gid = lane / 4, tig = lane % 4;
#pragma unroll
  for (int mi = 0; mi < GM_WM; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int p = p0 + mi * 16 + gid + 8 * h, pr = p / TW, pc = p % TW;
      const int oh = oh0 + pr, ow = ow0 + pc;
      if (pr >= TH || oh >= OH || ow >= OW) continue;
#pragma unroll
      for (int ni = 0; ni < GM_NB; ++ni) {
        const int co = c0 + ni * 8 + 2 * tig;
        if (co >= M) continue;
        const i64 pix = ((i64)n * OH + oh) * OW + ow, oi = pix * M + co, yi = pix * LDY + co;
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
          *(u32*)(Y + yi) = *(const u32*)out;
        } else {
          st(Y, yi, y[0]);
          st(Y, yi + 1, y[1]);
        }
      }
    }
}

// the origin (oh0, ow0) of tile `tile_idx` (row-major over ceil(OH / TH) x tiles_w tiles)
#define GM_TILE(tile_idx) \
  const int oh0 = (int)((tile_idx) / (unsigned)tiles_w) * TH, ow0 = (int)((tile_idx) % (unsigned)tiles_w) * TW;

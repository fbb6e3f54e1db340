// Grouped convolution, channels last: ai.polykit ConvNHWC with 1 < group < C (cpg = C / group >= 2
// input channels a group, Mg = M / group output channels a group), 2-D (a 1-D conv is H = 1), any
// kernel size, strides, dilations and pads; fp32 accumulation; bias and the layer's fused epilogue
// (epilogue_hook.cuh) applied before the store.
//
// ELEM (define): storage type of X, W, B, Y (float, half_t or bf16_t).
// X is (NB, H, W, C), W is (M, KH, KW, cpg) (KRSC), Y is (NB, OH, OW, M), bias M.
// Pads are the begin pads (PH, PW); the end pads only shape OH / OW, which the host passes.
//
// Work: a block computes a tile of TH output rows x TWT * GC_P output columns x CB output channels
// of one image; CB is a multiple of Mg (whole groups) or a divisor of it (a slice of one group), so
// the block reads the input channels of GB = max(1, CB / Mg) groups. Thread t has channel vector
// v = t % VB (VB = CB / GC_V; GC_V output channels of one group: GC_V divides Mg), column
// tw = (t / VB) % TWT and row th = t / (VB * TWT); it computes the GC_P output columns tw,
// tw + TWT, ... of its row (TWT apart: neighbouring lanes read neighbouring pixels) x GC_V channels in
// fp32 registers. The block first stages, as fp32,
//   - the slice's weights [tap][quad][CB][4]: a group's cpg input channels in NQ = ceil(cpg / 4)
//     quads (zeros past cpg), so a thread reads the 4 input channels of a quad for one output
//     channel as one float4, and
//   - the input tile (output tile + halo: IH = (TH-1)*SH + (KH-1)*DH + 1 rows, IW = (TWT*GC_P-1)*SW
//     + (KW-1)*DW + 1 columns), a pixel's GB groups NQ * 4 floats each (zeros past cpg), pixels CINP
//     floats apart (the host picks CINP >= GB*NQ*4 against bank conflicts), zeros outside the image;
//     read with 16-byte loads of 8 channels (vec_in: C % 8 == 0, X 16-byte aligned, and the slice's
//     channels start and end on multiples of 8) or element by element,
// then each thread walks the taps and quads: GC_V float4 weights and GC_P float4 inputs feed
// 4 * GC_P * GC_V FMAs.
// Stores: GC_V channels in 16-, 8- or 4-byte pieces (vec_out: Y 16-byte aligned; GC_V divides M, so
// a thread's channels never straddle a piece), the epilogue's 8-wide form with GC_V 8 when its
// inputs allow, else element by element.
//
// grid (ceil(OH/TH) * tiles_w, ceil(M / CB), NB), block VB * TWT * TH <= GC_THREADS, dynamic
// shared memory 16 * (KH*KW*NQ*CB + IH*IW*CINP/4) bytes (conv_grouped.py: GroupedPlan).
#include "dtypes.cuh"
#include "epilogue_hook.cuh"

#ifndef GC_V
#define GC_V 8         // output channels a thread, all of one group
#endif
#ifndef GC_P
#define GC_P 4         // output columns a thread
#endif
#ifndef GC_THREADS
#define GC_THREADS 256
#endif
#ifndef GC_MIN_BLOCKS
#define GC_MIN_BLOCKS 1
#endif

#define GC_BASE_PARAMS                                                                                             \
  const ELEM *X, const ELEM *Wt, const ELEM *Bias, ELEM *Y, int H, int W, int C, int M, int G, int OH, int OW,    \
      int KH, int KW, int SH, int SW, int PH, int PW, int DH, int DW, int TH, int TWT, int CB, int tiles_w,        \
      int CINP, int vec_in, int vec_out
#define GC_PARAMS GC_BASE_PARAMS EPI_PARAMS
#define GC_BASE_ARGS X, Wt, Bias, Y, H, W, C, M, G, OH, OW, KH, KW, SH, SW, PH, PW, DH, DW, TH, TWT, CB, tiles_w, \
      CINP, vec_in, vec_out
#define GC_ARGS GC_BASE_ARGS EPI_COMMA_ARGS

// GC_V values rounded to ELEM stored at p: whole pieces of up to 16 bytes (p aligned to the
// piece) with `vec`, else element by element
__device__ __forceinline__ void gc_store(ELEM* p, const float (&y)[GC_V], bool vec) {
  constexpr int BYTES = GC_V * (int)sizeof(ELEM);
  if constexpr (BYTES >= 4) {
    if (vec) {
      ELEM out[GC_V];
#pragma unroll
      for (int j = 0; j < GC_V; ++j) st(out, j, y[j]);
      if constexpr (BYTES % 16 == 0) {
#pragma unroll
        for (int k = 0; k < BYTES / 16; ++k) ((uint4*)p)[k] = ((const uint4*)out)[k];
      } else if constexpr (BYTES == 8) {
        *(uint2*)p = *(const uint2*)out;
      } else {
        *(unsigned*)p = *(const unsigned*)out;
      }
      return;
    }
  }
#pragma unroll
  for (int j = 0; j < GC_V; ++j) st(p, j, y[j]);
}

extern "C" __global__ void __launch_bounds__(GC_THREADS, GC_MIN_BLOCKS) conv_grouped_nhwc(GC_PARAMS) {
  extern __shared__ __align__(16) unsigned char gc_smem[];
  constexpr int V = GC_V, P = GC_P;
#if HAS_EPILOGUE
  const EpiState E = make_epi(EPI_ARGS);
#endif
  const int T = blockDim.x, t = threadIdx.x;  // T == VB * TWT * TH
  const int VB = CB / V;
  const int v = t % VB, q = t / VB, tw = q % TWT, th = q / TWT;
  const int tile_w = (int)(blockIdx.x % (unsigned)tiles_w), tile_h = (int)(blockIdx.x / (unsigned)tiles_w);
  const int oh0 = tile_h * TH, ow0 = tile_w * TWT * P;
  const int n = (int)blockIdx.z;
  const int cpg = C / G, Mg = M / G, NQ = (cpg + 3) / 4, GS = NQ * 4;  // GS: floats of a staged group
  const int m0 = (int)blockIdx.y * CB, g0 = m0 / Mg;
  const int GB = CB >= Mg ? CB / Mg : 1, ci0 = g0 * cpg;
  const int CIN = (GB < G - g0 ? GB : G - g0) * cpg;  // the slice's input channels
  const int IH = (TH - 1) * SH + (KH - 1) * DH + 1, IW = (TWT * P - 1) * SW + (KW - 1) * DW + 1;
  const int KHW = KH * KW;
  float* ws = (float*)gc_smem;            // [KHW][NQ][CB][4]
  float* xs = ws + (i64)KHW * NQ * CB * 4;  // [IH * IW][CINP]

  const int ih0 = oh0 * SH - PH, iw0 = ow0 * SW - PW;
  const ELEM* xn = X + (i64)n * H * W * C + ci0;
  const int npix = IH * IW;
  if (vec_in && ci0 % 8 == 0 && CIN % 8 == 0) {  // chunks of 8 channels: 16-byte loads (two for float)
    constexpr int PER = 16 / (int)sizeof(ELEM);  // elements a 16-byte load
    const int nc = CIN / 8;
    for (int i = t; i < npix * nc; i += T) {
      const int k8 = i % nc, pix = i / nc, r = pix / IW, c = pix % IW;
      const int ih = ih0 + r, iw = iw0 + c;
      const bool inside = ih >= 0 && ih < H && iw >= 0 && iw < W;
      const ELEM* src = xn + ((i64)ih * W + iw) * C + k8 * 8;
      float* dst = xs + (i64)pix * CINP;
#pragma unroll
      for (int h = 0; h < 8 / PER; ++h) {
        uint4 raw = make_uint4(0u, 0u, 0u, 0u);
        if (inside) raw = *(const uint4*)(src + h * PER);
        const ELEM* e = (const ELEM*)&raw;
#pragma unroll
        for (int j = 0; j < PER; ++j) {
          const int k = k8 * 8 + h * PER + j;
          dst[k / cpg * GS + k % cpg] = (float)ld(e, j);
        }
      }
    }
  } else {
    for (int i = t; i < npix * CIN; i += T) {
      const int k = i % CIN, pix = i / CIN, r = pix / IW, c = pix % IW;
      const int ih = ih0 + r, iw = iw0 + c;
      float val = 0.f;
      if (ih >= 0 && ih < H && iw >= 0 && iw < W) val = (float)ld(xn, ((i64)ih * W + iw) * C + k);
      xs[(i64)pix * CINP + k / cpg * GS + k % cpg] = val;
    }
  }
  if (GS != cpg || CIN < GB * cpg) {  // zeros in the quads' tails and past the last group
    const int pad = GB * GS;
    for (int i = t; i < npix * pad; i += T) {
      const int s = i % pad, pix = i / pad, j = s / GS, ci = s % GS;
      if (ci >= cpg || j * cpg >= CIN) xs[(i64)pix * CINP + s] = 0.f;
    }
  }
  // the weights: a thread's consecutive i read consecutive input channels of one output channel and tap
  for (int i = t; i < CB * KHW * GS; i += T) {
    const int ci = i % GS, rest = i / GS, tap = rest % KHW, cl = rest / KHW, co = m0 + cl;
    ws[((tap * NQ + ci / 4) * CB + cl) * 4 + (ci & 3)] =
        co < M && ci < cpg ? (float)ld(Wt, ((i64)co * KHW + tap) * cpg + ci) : 0.f;
  }
  __syncthreads();

  float acc[P][V];
#pragma unroll
  for (int p = 0; p < P; ++p)
#pragma unroll
    for (int j = 0; j < V; ++j) acc[p][j] = 0.f;

  const int cv = v * V;                    // the thread's first channel in the slice
  const int jg = (m0 + cv) / Mg - g0;     // its group in the slice
  const float* xg = xs + jg * GS;
  for (int kh = 0; kh < KH; ++kh) {
    const int row = th * SH + kh * DH;
    for (int kw = 0; kw < KW; ++kw) {
      const float* wt = ws + ((i64)(kh * KW + kw) * NQ * CB + cv) * 4;
      const float* xp = xg + ((i64)row * IW + tw * SW + kw * DW) * CINP;
      for (int qd = 0; qd < NQ; ++qd) {
        float4 w[V];
#pragma unroll
        for (int j = 0; j < V; ++j) w[j] = *(const float4*)(wt + ((i64)qd * CB + j) * 4);
#pragma unroll
        for (int p = 0; p < P; ++p) {
          const float4 x = *(const float4*)(xp + (i64)p * TWT * SW * CINP + qd * 4);
#pragma unroll
          for (int j = 0; j < V; ++j) {
            acc[p][j] = fmaf(x.x, w[j].x, acc[p][j]);
            acc[p][j] = fmaf(x.y, w[j].y, acc[p][j]);
            acc[p][j] = fmaf(x.z, w[j].z, acc[p][j]);
            acc[p][j] = fmaf(x.w, w[j].w, acc[p][j]);
          }
        }
      }
    }
  }

  const int oh = oh0 + th, co0 = m0 + cv;
  if (oh >= OH || co0 >= M) return;
  float bias[V];
#pragma unroll
  for (int j = 0; j < V; ++j) bias[j] = Bias ? (float)ld(Bias, co0 + j) : 0.f;
  bool vec = vec_out != 0;
#if HAS_EPILOGUE && EPI_VEC
  EpiCols8 cols;
  if constexpr (V == 8) {
    vec = vec && epi_vec_ok(E);
    if (vec) load_cols8(E, cols, co0);
  }
#endif
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int ow = ow0 + tw + p * TWT;
    if (ow >= OW) continue;
    const i64 oi = (((i64)n * OH + oh) * OW + ow) * M + co0;
    float y[V];
#pragma unroll
    for (int j = 0; j < V; ++j) y[j] = acc[p][j] + bias[j];
#if HAS_EPILOGUE
#if EPI_VEC
    if constexpr (V == 8) {
      if (vec) {
        EpiRows8 rows;
        load_rows8(E, rows, oi);
        apply_epilogue8(E, cols, rows, *(float(*)[8])y);  // V == 8 here; the cast keeps other V compiling
        gc_store(Y + oi, y, true);
        continue;
      }
    }
#endif
#pragma unroll
    for (int j = 0; j < V; ++j) y[j] = apply_epilogue(E, y[j], oi + j, co0 + j);
#endif
    gc_store(Y + oi, y, vec);
  }
}

// Depthwise convolution, channels last: ai.polykit ConvNHWC with group == C (every output channel
// co reads the one input channel co / KM, KM = M / C the channel multiplier), 2-D (a 1-D conv is
// H = 1), any kernel size, strides, dilations and pads; fp32 accumulation; bias and the layer's
// fused epilogue (epilogue_hook.cuh) applied before the store.
//
// ELEM (define): storage type of X, W, B, Y (float, half_t or bf16_t).
// X is (NB, H, W, C), W is (M, KH, KW, 1) (KRSC with C/group = 1), Y is (NB, OH, OW, M), bias M.
// Pads are the begin pads (PH, PW); the end pads only shape OH / OW, which the host passes.
//
// Work: a block computes a tile of TH output rows x TWT * DW_P output columns x VB * 8 output
// channels of one image. Thread t has channel vector v = t % VB (8 output channels), column group
// tw = (t / VB) % TWT (DW_P consecutive columns) and row th = t / (VB * TWT): DW_P outputs x 8
// channels in fp32 registers. The block first stages
//   - the slice's weights as fp32, [tap][half h][VB][4] (a thread reads its 8 channels of a tap as
//     two float4; lanes of one v read the same address: a broadcast), read from W's run of the slice's
//     channels in 16-byte chunks, up to DW_W_BATCH loads a thread in flight at once (vec_in & DW_VEC_W:
//     W 16-byte aligned; else element by element), and
//   - the input tile (output tile + halo: IH = (TH-1)*SH + (KH-1)*DH + 1 rows, IW = (TWT*DW_P-1)*SW
//     + (KW-1)*DW + 1 columns) as 16-byte chunks of 8 channels (fp32: two planes of 4 channels),
//     zeros outside the image, with 16-byte cp.async copies, all of a thread's in flight at once
//     (vec_in & DW_VEC_X: KM == 1, C % 8 == 0, X 16-byte aligned; else element by element: tail
//     channels, multipliers),
// then each thread walks the kernel rows: with DW_KW > 0 (kernel width DW_KW, W stride DW_SW,
// W dilation 1, all compile-time) it loads each of the (DW_P-1)*DW_SW + DW_KW input columns its
// outputs touch once per row, converts it to fp32 once and feeds every output that uses it (the
// row's DW_KW weight vectors stay in registers); with DW_KW == 0 (any width, stride, dilation) it
// loads one input chunk per output and tap.
// Shared-memory columns are skewed against bank conflicts: tile column c sits at slot
// c + c / G, G = DW_P * SW (a column group's first column), rows IWP slots apart (the host picks
// IWP so that the 8 lanes of a 16-byte load phase hit 8 different bank groups).
// Stores: 16 bytes per 8 channels (vec_out: M % 8 == 0, LDY % 8 == 0, Y 16-byte aligned, and the
// epilogue's vector form when its inputs allow), else element by element. Output pixel q's channels
// start at Y + q * LDY (a runtime argument: M, or a channels-last Concat's channel total where Y is
// placed in its slice, conv_depthwise.py); the epilogue's inputs keep the dense index q * M + channel.
//
// grid (ceil(OH/TH) * tiles_w, ceil(M / (VB*8)), NB), block VB * TWT * TH <= DW_THREADS,
// dynamic shared memory KH*KW*VB*32 + NPL*IH*IWP*VB*16 bytes (conv_depthwise.py: DepthwisePlan).
#include "dtypes.cuh"
#include "epilogue_hook.cuh"

#ifndef DW_P
#define DW_P 8         // output columns a thread
#endif
#ifndef DW_KW
#define DW_KW 0        // compile-time kernel width (0: run-time width, stride and dilation)
#endif
#ifndef DW_SW
#define DW_SW 1        // compile-time W stride (with DW_KW > 0)
#endif
#ifndef DW_THREADS
#define DW_THREADS 128
#endif
#ifndef DW_MIN_BLOCKS
#define DW_MIN_BLOCKS 1
#endif

#define DW_BASE_PARAMS                                                                                             \
  const ELEM *X, const ELEM *Wt, const ELEM *Bias, ELEM *Y, int H, int W, int C, int M, int OH, int OW, int KH,   \
      int KW, int SH, int SW, int PH, int PW, int DH, int DW, int TH, int TWT, int VB, int tiles_w, int IWP,       \
      int vec_in, int vec_out, i64 LDY
#define DW_PARAMS DW_BASE_PARAMS EPI_PARAMS
#define DW_BASE_ARGS X, Wt, Bias, Y, H, W, C, M, OH, OW, KH, KW, SH, SW, PH, PW, DH, DW, TH, TWT, VB, tiles_w, IWP, \
      vec_in, vec_out, LDY
#define DW_ARGS DW_BASE_ARGS EPI_COMMA_ARGS

// 16-byte planes of an 8-channel vector: 1 for 16-bit storage, 2 for float
#define NPL ((int)sizeof(ELEM) / 2)

// element bits <-> fp32 (16-bit storage: the low 16 bits of `bits`)
__device__ __forceinline__ float dw_from_bits(u32 bits, half_t*) {
  half_t h;
  h.x = (unsigned short)bits;
  return h2f(h);
}
__device__ __forceinline__ float dw_from_bits(u32 bits, bf16_t*) { return __uint_as_float(bits << 16); }
__device__ __forceinline__ u32 dw_to_bits(float v, half_t*) { return f2h(v).x; }
__device__ __forceinline__ u32 dw_to_bits(float v, bf16_t*) { return f2b(v).x; }
// float storage moves whole words (its branches of the callers below); these only keep them compiling
__device__ __forceinline__ float dw_from_bits(u32 bits, float*) { return __uint_as_float(bits); }
__device__ __forceinline__ u32 dw_to_bits(float v, float*) { return __float_as_uint(v); }

// the 8 channels of a chunk (NPL planes, `plane` chunks apart) as fp32
__device__ __forceinline__ void dw_load_x(const unsigned char* xs, int plane, int chunk, float (&x)[8]) {
  const uint4 a = *(const uint4*)(xs + (i64)chunk * 16);
  if constexpr (sizeof(ELEM) == 4) {
    const uint4 b = *(const uint4*)(xs + ((i64)plane + chunk) * 16);
    x[0] = __uint_as_float(a.x); x[1] = __uint_as_float(a.y); x[2] = __uint_as_float(a.z); x[3] = __uint_as_float(a.w);
    x[4] = __uint_as_float(b.x); x[5] = __uint_as_float(b.y); x[6] = __uint_as_float(b.z); x[7] = __uint_as_float(b.w);
  } else {
    const u32 w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      x[2 * k] = dw_from_bits(w[k] & 0xffffu, (ELEM*)0);
      x[2 * k + 1] = dw_from_bits(w[k] >> 16, (ELEM*)0);
    }
  }
}

// the 8 fp32 weights of one tap for vector v: [half][VB][4] from `wt` = the tap's first float
__device__ __forceinline__ void dw_load_w(const float* wt, int VB, int v, float (&w)[8]) {
  const float4 a = *(const float4*)(wt + v * 4), b = *(const float4*)(wt + (VB + v) * 4);
  w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w; w[4] = b.x; w[5] = b.y; w[6] = b.z; w[7] = b.w;
}

// 16 bytes global -> shared without a register round trip (cp.async, sm_80+); `ok` false writes
// zeros and reads nothing
__device__ __forceinline__ void dw_cp16(unsigned char* dst, const unsigned char* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"((u32)__cvta_generic_to_shared(dst)), "l"(src),
               "r"(ok ? 16 : 0) : "memory");
}
__device__ __forceinline__ void dw_cp_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

__device__ __forceinline__ void dw_fma8(float (&acc)[8], const float (&x)[8], const float (&w)[8]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] = fmaf(x[i], w[i], acc[i]);
}

// 8 values rounded to ELEM, one 16-byte store (two for float) at p (16-byte aligned)
__device__ __forceinline__ void dw_store8(ELEM* p, const float (&v)[8]) {
  if constexpr (sizeof(ELEM) == 4) {
    ((uint4*)p)[0] = make_uint4(__float_as_uint(v[0]), __float_as_uint(v[1]), __float_as_uint(v[2]), __float_as_uint(v[3]));
    ((uint4*)p)[1] = make_uint4(__float_as_uint(v[4]), __float_as_uint(v[5]), __float_as_uint(v[6]), __float_as_uint(v[7]));
  } else {
    u32 w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) w[k] = dw_to_bits(v[2 * k], (ELEM*)0) | (dw_to_bits(v[2 * k + 1], (ELEM*)0) << 16);
    *(uint4*)p = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// vec_in's bits: the input tile's 16-byte copies (KM == 1, C % 8 == 0, X 16-byte aligned) and the
// weights' 16-byte loads (W 16-byte aligned)
#define DW_VEC_X 1
#define DW_VEC_W 2
// 8-element chunks of the weight run a thread holds in registers at once (all their loads in flight)
#define DW_W_BATCH 4

// channel ch's float of tap 0 in the fp32 weights [tap][half][VB][4]
__device__ __forceinline__ unsigned dw_w_slot(unsigned ch, int VB) {
  return ((ch >> 2 & 1) * VB + (ch >> 3)) * 4 + (ch & 3);
}

// The fp32 weights [tap][half][VB][4] of output channels m0 .. m0 + 8 VB - 1 (zeros past M) from W's run
// of those channels, 8 VB * KHW elements starting at m0 * KHW (a multiple of 8: 16-byte aligned with W):
// chunk c (8 elements from element 8c of the run) is one 16-byte load (two for float); a thread issues the
// loads of up to DW_W_BATCH chunks, T apart, before it converts any (one L2 round trip, not one per
// element), then walks each chunk's elements with (channel, tap) stepped, not divided. A chunk reaching past
// M * KHW reads element by element.
__device__ __forceinline__ void dw_stage_weights(const ELEM* Wt, float* ws, int M, int KHW, int VB, int m0, int t,
                                                 int T) {
  const int chunks = VB * KHW;
  const i64 run = (i64)m0 * KHW, end = (i64)M * KHW;
  for (int c0 = t; c0 < chunks; c0 += DW_W_BATCH * T) {
    uint4 raw[DW_W_BATCH][NPL];
#pragma unroll
    for (int k = 0; k < DW_W_BATCH; ++k) {
      const i64 e0 = run + 8 * (i64)(c0 + k * T);
      const bool whole = c0 + k * T < chunks && e0 + 8 <= end;
#pragma unroll
      for (int h = 0; h < NPL; ++h) raw[k][h] = whole ? ((const uint4*)(Wt + e0))[h] : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int k = 0; k < DW_W_BATCH; ++k) {
      const int c = c0 + k * T;
      if (c >= chunks) break;
      const i64 e0 = run + 8 * (i64)c;
      float w[8];
      if (e0 + 8 <= end) {
        const u32 w32[8] = {raw[k][0].x, raw[k][0].y, raw[k][0].z, raw[k][0].w,
                            raw[k][NPL - 1].x, raw[k][NPL - 1].y, raw[k][NPL - 1].z, raw[k][NPL - 1].w};
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if constexpr (sizeof(ELEM) == 4) w[j] = __uint_as_float(w32[j]);
          else w[j] = dw_from_bits(j & 1 ? w32[j / 2] >> 16 : w32[j / 2] & 0xffffu, (ELEM*)0);
        }
      } else {  // the run's last chunk, past M * KHW (M % 8 != 0)
#pragma unroll
        for (int j = 0; j < 8; ++j) w[j] = e0 + j < end ? (float)ld(Wt, e0 + j) : 0.f;
      }
      // element j of the chunk is (channel ch, tap) of the slice: its slot is tap * 8 VB + dw_w_slot(ch, VB)
      unsigned ch = 8u * c / (unsigned)KHW, tap = 8u * c - ch * (unsigned)KHW;
      float* wp = ws + tap * 8 * VB + dw_w_slot(ch, VB);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        *wp = w[j];
        wp += 8 * VB;
        if (++tap == (unsigned)KHW) tap = 0, wp = ws + dw_w_slot(++ch, VB);
      }
    }
  }
}

extern "C" __global__ void __launch_bounds__(DW_THREADS, DW_MIN_BLOCKS) conv_depthwise_nhwc(DW_PARAMS) {
  extern __shared__ __align__(16) unsigned char dw_smem[];
  constexpr int P = DW_P;
#if HAS_EPILOGUE
  const EpiState E = make_epi(EPI_ARGS);
#endif
  const int T = blockDim.x, t = threadIdx.x;  // T == VB * TWT * TH
  const int v = t % VB, q = t / VB, tw = q % TWT, th = q / TWT;
  const int tile_w = (int)(blockIdx.x % (unsigned)tiles_w), tile_h = (int)(blockIdx.x / (unsigned)tiles_w);
  const int oh0 = tile_h * TH, ow0 = tile_w * TWT * P;
  const int CB = VB * 8, m0 = (int)blockIdx.y * CB, n = (int)blockIdx.z;
#if DW_KW
  constexpr int G = P * DW_SW;  // skew unit: a column group's first input column
#else
  const int G = P * SW;
#endif
  const int IH = (TH - 1) * SH + (KH - 1) * DH + 1, IW = (TWT * P - 1) * SW + (KW - 1) * DW + 1;
  const int KHW = KH * KW, plane = IH * IWP * VB;
  float* ws = (float*)dw_smem;                       // [KHW][2][VB][4] fp32 weights
  unsigned char* xs = dw_smem + (i64)KHW * CB * 4;  // NPL planes of `plane` 16-byte chunks

  const int ih0 = oh0 * SH - PH, iw0 = ow0 * SW - PW;
  const ELEM* xn = X + (i64)n * H * W * C;
  if (vec_in & DW_VEC_X) {  // KM == 1, C % 8 == 0: a thread copies chunks of its own vector v, T / VB pixels apart
    const int npix = IH * IW, step = T / VB, sr = step / IW, sc = step % IW;
    const bool vec_ok = m0 + v * 8 < M;
    for (int pix = t / VB, r = pix / IW, c = pix % IW; pix < npix; pix += step, r += sr, c += sc) {
      if (c >= IW) { c -= IW; ++r; }
      const int ih = ih0 + r, iw = iw0 + c;
      const bool ok = vec_ok && (unsigned)ih < (unsigned)H && (unsigned)iw < (unsigned)W;
      const ELEM* src = xn + (ok ? (ih * W + iw) * C + m0 + v * 8 : 0);  // an image's H * W * C < 2^31
      unsigned char* dst = xs + (i64)((r * IWP + c + c / G) * VB + v) * 16;
#pragma unroll
      for (int h = 0; h < NPL; ++h) dw_cp16(dst + (i64)h * plane * 16, (const unsigned char*)src + 16 * h, ok);
    }
  }
  // the weights while the copies fly
  if (vec_in & DW_VEC_W) {  // the slice's weights are one run of CB * KHW elements (W is (M, KH, KW, 1))
    dw_stage_weights(Wt, ws, M, KHW, VB, m0, t, T);
  } else {  // element by element; channel fastest: a warp's stores hit distinct banks
    for (int i = t; i < KHW * CB; i += T) {
      const int ch = i % CB, tap = i / CB, co = m0 + ch;
      ws[((tap * 2 + (ch & 7) / 4) * VB + ch / 8) * 4 + (ch & 3)] = co < M ? (float)ld(Wt, (i64)co * KHW + tap) : 0.f;
    }
  }
  if (!(vec_in & DW_VEC_X)) {  // element by element: channel co of the slice reads input channel co / KM (0 past M)
    const int KM = M / C;
    const int total = IH * IW * CB;
    for (int i = t; i < total; i += T) {
      const int e = i % CB, pix = i / CB, c = pix % IW, r = pix / IW;
      const int ih = ih0 + r, iw = iw0 + c, co = m0 + e;
      ELEM val = ELEM();
      if (co < M && ih >= 0 && ih < H && iw >= 0 && iw < W) val = xn[((i64)ih * W + iw) * C + co / KM];
      const int byte = (e & 7) * (int)sizeof(ELEM);  // where element e % 8 sits in its vector
      *(ELEM*)(xs + ((i64)(byte / 16) * plane + (r * IWP + c + c / G) * VB + e / 8) * 16 + byte % 16) = val;
    }
  }
  dw_cp_wait_all();
  __syncthreads();

  float acc[P][8];
#pragma unroll
  for (int p = 0; p < P; ++p)
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[p][i] = 0.f;

  for (int kh = 0; kh < KH; ++kh) {
    const int row = th * SH + kh * DH;
    const float* wrow = ws + kh * KW * 2 * VB * 4;  // the row's first tap
#if DW_KW
    float w[DW_KW][8];
#pragma unroll
    for (int kw = 0; kw < DW_KW; ++kw) dw_load_w(wrow + kw * 2 * VB * 4, VB, v, w[kw]);
    const int base = (row * IWP + tw * (G + 1)) * VB + v;  // chunk of the group's first column
#pragma unroll
    for (int j = 0; j < (P - 1) * DW_SW + DW_KW; ++j) {  // input column j of the group, each loaded once
      float x[8];
      dw_load_x(xs, plane, base + (j + j / G) * VB, x);
#pragma unroll
      for (int kw = 0; kw < DW_KW; ++kw) {
        const int d = j - kw;  // output p = d / DW_SW reads column j at tap kw
        if (d >= 0 && d % DW_SW == 0 && d / DW_SW < P) dw_fma8(acc[d / DW_SW], x, w[kw]);
      }
    }
#else
    for (int kw = 0; kw < KW; ++kw) {
      float w[8];
      dw_load_w(wrow + kw * 2 * VB * 4, VB, v, w);
#pragma unroll
      for (int p = 0; p < P; ++p) {
        const int col = (tw * P + p) * SW + kw * DW;
        float x[8];
        dw_load_x(xs, plane, (row * IWP + col + col / G) * VB + v, x);
        dw_fma8(acc[p], x, w);
      }
    }
#endif
  }

  const int oh = oh0 + th, co0 = m0 + v * 8;
  if (oh >= OH || co0 >= M) return;
  float bias[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) bias[i] = Bias && co0 + i < M ? (float)ld(Bias, co0 + i) : 0.f;
  bool vec = vec_out != 0;
#if HAS_EPILOGUE && EPI_VEC
  vec = vec && epi_vec_ok(E);
  EpiCols8 cols;
  if (vec) load_cols8(E, cols, co0);
#endif
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int ow = ow0 + tw * P + p;
    if (ow >= OW) continue;
    const i64 pix = ((i64)n * OH + oh) * OW + ow, oi = pix * M + co0, yi = pix * LDY + co0;
    float y[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) y[i] = acc[p][i] + bias[i];
    if (vec) {
#if HAS_EPILOGUE && EPI_VEC
      EpiRows8 rows;
      load_rows8(E, rows, oi);
      apply_epilogue8(E, cols, rows, y);
#elif HAS_EPILOGUE
#pragma unroll
      for (int i = 0; i < 8; ++i) y[i] = apply_epilogue(E, y[i], oi + i, co0 + i);
#endif
      dw_store8(Y + yi, y);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        if (co0 + i >= M) continue;
#if HAS_EPILOGUE
        y[i] = apply_epilogue(E, y[i], oi + i, co0 + i);
#endif
        st(Y, yi + i, y[i]);
      }
    }
  }
}

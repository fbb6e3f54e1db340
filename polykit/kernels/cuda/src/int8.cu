// INT8 layers (ai.polykit QMatMul, QConv, QConvNHWC; docs/INT8.md) on the mma.sync s8 main loop
// of int8_mma.cuh: exact int32 centered sums, then per output channel n
//   v = float(acc) * scale[n] + bias[n]                (float32, each step rounded, no fma: the cpu
//                                                       reference's arithmetic, bit for bit)
//   v = epilogue(v)                                    (float32, epilogue.py, when HAS_EPILOGUE)
//   Y = v, or saturate(rint(v / y_scale) + y_zero_point) as int8 / uint8 (QuantizeLinear's rounding)
// GEMM view: M = rows of the activation (QMatMul: every row of X [..., M, K]; convolutions: output
// pixels (nb, oh, ow)), N = output channels, K = the reduction.
//   int8_matmul     X [M, K] row-major, W [K, N] row-major (QMatMul's B, a constant or not), Y [M, N]
//   int8_conv_nhwc  X [NB, H, W, C] with C % 16 == 0 (to_channels_last pads it), W [N, KH, KW, C] (KRSC,
//                   a K-major [N, K] matrix), Y [NB, OH, OW, N]; K = KH * KW * C, 16 bytes a load
//   int8_conv_nchw  X [NB, C, H, W], W [N, C, KH, KW] ([N, K]), Y [NB, N, OH, OW]; X gathered byte by byte
//   int8_matmul_splitk / int8_splitk_reduce  int8_matmul split along K (int8_splitk.py: few output
//                   tiles, a long K): slice z = blockIdx.z sums K range [z * kslice, (z + 1) * kslice)
//                   centered (its own zero-point corrections: they are linear in the range) into
//                   partial [splits, M, N] int32; the reduce adds the slices (integers: exact in any
//                   order) and stores each element through Out::put, one thread an element.
// Zero points, scale, bias and the requantization parameters are read on the device: XZ, YZ one
// byte; WZ, Scale, Bias one value, or one per channel (step 1). flags: FLAG_* of int8_out.cuh.
// Launch: grid (ceil(N/128), ceil(M/128), 1), block 256 (the split-K kernel: splits in z; the reduce:
// 1-D grid-stride, block 256).
#include "int8_mma.cuh"

#include "epilogue_hook.cuh"
#include "int8_out.cuh"

#define INT8_PARAMS                                                                                       \
  const u8 *X, const u8 *Wt, const u8 *XZ, const u8 *WZ, const float *Scale, const float *Bias,            \
      const float *YScale, const u8 *YZ, void *Y, i64 M, i64 N, i64 K, i64 C, i64 H, i64 W, i64 OH, i64 OW, \
      i64 KH, i64 KW, i64 SH, i64 SW, i64 PH, i64 PW, i64 DH, i64 DW, int flags, int wz_step, int scale_step, \
      int bias_step EPI_PARAMS

// byte b of a zero-point word, 4 copies
__device__ __forceinline__ u32 splat(u32 b) { return (b & 0xff) * 0x01010101u; }

// the weight zero point of column n, in the signed domain
struct WeightZero {
  const u8* p;
  int step;
  bool u8_;
  __device__ __forceinline__ int operator()(i64 n) const {
    const u8 b = p[n * step];
    return u8_ ? (int)b - 128 : (int)(i8)b;
  }
};

// the shared part of every entry point's setup; `afill` / `bfill`: the raw bytes that are 0 in the
// signed domain, `xz`: the activation zero point's raw byte
struct Common {
  Out out;
  WeightZero zw;
  int za;
  u32 amask, bmask, xz;
};

__device__ __forceinline__ Common common_of(INT8_PARAMS) {
  Common c;
  const bool xu8 = flags & FLAG_X_U8, wu8 = flags & FLAG_W_U8;
  c.xz = XZ[0];
  c.za = xu8 ? (int)c.xz - 128 : (int)(i8)c.xz;
  c.amask = xu8 ? 0x80808080u : 0u;
  c.bmask = wu8 ? 0x80808080u : 0u;
  c.zw.p = WZ; c.zw.step = wz_step; c.zw.u8_ = wu8;
  c.out = int8_out(Scale, Bias, YScale, YZ, Y, flags, scale_step, bias_step);
#if HAS_EPILOGUE
  c.out.epi = make_epi(EPI_ARGS);
#endif
  return c;
}

// B of QMatMul: [K, N] row-major, gathered down a column
__device__ __forceinline__ uint4 column16(const u8* B, i64 N, i64 K, i64 n, i64 k, u32 fill) {
  return bytes16([&](int i) { return k + i < K ? (u32)B[(k + i) * N + n] : fill; });
}

// X rows ldx bytes apart (K, or the whole reduction when this is one K slice of it: X and B then
// start at the slice); the centered sums go to Y through Out, or to `partial` (split-K) as they are
struct MatmulP {
  const u8 *X, *B;
  i64 M, N, K, ldx;
  bool vec;
  u32 afill, bfill;
  Out o;
  int* partial;
  typedef const u8* Row;
  __device__ __forceinline__ Row arow(i64 m) const { return m < M ? X + m * ldx : nullptr; }
  __device__ __forceinline__ uint4 a16(Row row, i64 k) const {
    return row ? row16(row, k, K, vec, afill) : make_uint4(afill, afill, afill, afill);
  }
  __device__ __forceinline__ uint4 b16(i64 n, i64 k) const { return column16(B, N, K, n, k, bfill); }
  __device__ __forceinline__ void store(i64 m, i64 n, int acc) const {
    if (partial)
      partial[m * N + n] = acc;
    else
      o.put(m * N + n, n, n, acc);
  }
};

// a convolution's output pixel: its image and window origin (ok = false past the last pixel)
struct Pixel {
  const u8* image;
  int ih0, iw0;
  bool ok;
};

struct ConvGeometry {
  i64 C, H, W, OH, OW, KH, KW, SH, SW, PH, PW, DH, DW;
  __device__ __forceinline__ Pixel pixel(const u8* X, i64 m, i64 M) const {
    Pixel p;
    p.ok = m < M;
    const i64 mm = p.ok ? m : 0, osp = OH * OW, nb = mm / osp, s = mm - nb * osp, oh = s / OW, ow = s - oh * OW;
    p.image = X + nb * C * H * W;
    p.ih0 = (int)(oh * SH - PH);
    p.iw0 = (int)(ow * SW - PW);
    return p;
  }
};

// the implicit GEMM of a 2-D convolution; NHWC: X [NB, H, W, C] with C % 16 == 0 (a 16-byte chunk
// of K is 16 channels of one tap), else X [NB, C, H, W] gathered byte by byte
template <bool NHWC>
struct ConvP {
  const u8 *X, *Wt;
  i64 M, N, K;
  ConvGeometry g;
  bool vec;
  u32 afill, bfill, zfill;
  Out o;
  typedef Pixel Row;
  __device__ __forceinline__ Row arow(i64 m) const { return g.pixel(X, m, M); }
  __device__ __forceinline__ bool inside(int ih, int iw) const {
    return ih >= 0 && ih < (int)g.H && iw >= 0 && iw < (int)g.W;
  }
  __device__ __forceinline__ uint4 a16(const Row& px, i64 k) const {
    if (NHWC) {
      if (!px.ok || k >= K) return make_uint4(afill, afill, afill, afill);
      const u32 tap = (u32)k / (u32)g.C, c = (u32)k - tap * (u32)g.C;
      const u32 r = tap / (u32)g.KW, s = tap - r * (u32)g.KW;
      const int ih = px.ih0 + (int)r * (int)g.DH, iw = px.iw0 + (int)s * (int)g.DW;
      if (!inside(ih, iw)) return make_uint4(zfill, zfill, zfill, zfill);
      return *(const uint4*)(px.image + ((i64)ih * g.W + iw) * g.C + c);
    }
    const u32 taps = (u32)(g.KH * g.KW);
    return bytes16([&](int i) {
      const i64 kk = k + i;
      if (!px.ok || kk >= K) return afill;
      const u32 c = (u32)kk / taps, t = (u32)kk - c * taps, r = t / (u32)g.KW, s = t - r * (u32)g.KW;
      const int ih = px.ih0 + (int)r * (int)g.DH, iw = px.iw0 + (int)s * (int)g.DW;
      return inside(ih, iw) ? (u32)px.image[((i64)c * g.H + ih) * g.W + iw] : zfill;
    });
  }
  __device__ __forceinline__ uint4 b16(i64 n, i64 k) const { return row16(Wt + n * K, k, K, vec, bfill); }
  __device__ __forceinline__ void store(i64 m, i64 n, int acc) const {
    if (NHWC) {
      o.put(m * N + n, n, n, acc);
      return;
    }
    const i64 osp = g.OH * g.OW, nb = m / osp, s = m - nb * osp;
    o.put((nb * N + n) * osp + s, s % g.OW, n, acc);
  }
};

// INT8_ENTRIES (define, int8.py's `entries`): the entry points a unit compiles, a mask of 1 int8_matmul, 2 the
// split-K pair (int8_matmul_splitk and its reduce), 4 int8_conv_nhwc, 8 int8_conv_nchw; all of them without it (CI's
// plain variants). A layer's unit compiles its own: an int8_matmul unit compiled all five in 7.2 s of NVRTC 13.5 and
// its own alone in 1.5 s (2026-12-08; an int8_conv_nhwc unit's 7.8 s are nearly all its own kernel's).
#ifndef INT8_ENTRIES
#define INT8_ENTRIES 15
#endif

#define INT8_SETUP                                                                                       \
  const Common cm = common_of(X, Wt, XZ, WZ, Scale, Bias, YScale, YZ, Y, M, N, K, C, H, W, OH, OW, KH, KW, \
                              SH, SW, PH, PW, DH, DW, flags, wz_step, scale_step, bias_step EPI_COMMA_ARGS)
#define CONV_GEOMETRY ConvGeometry{C, H, W, OH, OW, KH, KW, SH, SW, PH, PW, DH, DW}

#if INT8_ENTRIES & 1
extern "C" __global__ void __launch_bounds__(256) int8_matmul(INT8_PARAMS) {
  INT8_SETUP;
  const MatmulP p = {X, Wt, M, N, K, K, (flags & FLAG_VEC_X) != 0, cm.amask, cm.bmask, cm.out, nullptr};
  int8_mma_gemm(p, cm.za, cm.zw, cm.amask, cm.bmask);
}
#endif

#if INT8_ENTRIES & 2
// kslice: a multiple of the 64-byte K step (16-byte loads stay aligned within a slice)
extern "C" __global__ void __launch_bounds__(256) int8_matmul_splitk(INT8_PARAMS, int* partial, i64 kslice) {
  INT8_SETUP;
  const i64 k0 = (i64)blockIdx.z * kslice, kz = min(kslice, K - k0);
  const MatmulP p = {X + k0, Wt + k0 * N, M, N, kz, K, (flags & FLAG_VEC_X) != 0, cm.amask, cm.bmask, cm.out,
                     partial + (i64)blockIdx.z * M * N};
  int8_mma_gemm(p, cm.za, cm.zw, cm.amask, cm.bmask);
}

extern "C" __global__ void __launch_bounds__(256) int8_splitk_reduce(INT8_PARAMS, const int* partial, i64 splits) {
  INT8_SETUP;
  const i64 total = M * N;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
    u32 acc = 0;  // wrapping: the slices' centered sums add up to the exact int32 total
    for (i64 z = 0; z < splits; ++z) acc += (u32)partial[z * total + i];
    const i64 n = i % N;
    cm.out.put(i, n, n, (int)acc);
  }
}
#endif

template <bool NHWC>
__device__ __forceinline__ void conv(const Common& cm, const u8* X, const u8* Wt, i64 M, i64 N, i64 K,
                                     const ConvGeometry& g, bool vec) {
  const ConvP<NHWC> p = {X, Wt, M, N, K, g, vec, cm.amask, cm.bmask, splat(cm.xz), cm.out};
  int8_mma_gemm(p, cm.za, cm.zw, cm.amask, cm.bmask);
}

#if INT8_ENTRIES & 4
extern "C" __global__ void __launch_bounds__(256) int8_conv_nhwc(INT8_PARAMS) {
  INT8_SETUP;
  conv<true>(cm, X, Wt, M, N, K, CONV_GEOMETRY, (flags & FLAG_VEC_W) != 0);
}
#endif

#if INT8_ENTRIES & 8
extern "C" __global__ void __launch_bounds__(256) int8_conv_nchw(INT8_PARAMS) {
  INT8_SETUP;
  conv<false>(cm, X, Wt, M, N, K, CONV_GEOMETRY, (flags & FLAG_VEC_W) != 0);
}
#endif

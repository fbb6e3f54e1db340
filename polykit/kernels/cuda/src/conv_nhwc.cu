// Channels-last 2-D convolution (ai.polykit ConvNHWC, docs/FUSION.md "Channels last"):
// implicit GEMM on the shared main loops of gemm_core.cuh.
//
// ELEM (define): storage type of X, W, B, Y (float or half_t); fp32 accumulation.
// Parameters: conv_common.cuh (as conv.cu's), with unit D / OD / KD (the D-axis values are unused).
// X is (NB, H, W, C), W is (M, KH, KW, C/G) (KRSC), Y is (NB, OH, OW, M); bias (may be null) M.
// Per group z: Y[z] (Mg x NB*OH*OW) = W[z] (Mg x KH*KW*Cg) * im2col(X)[z], the GEMM's
//   M = output channels of the group, N = pixels (nb, oh, ow), K = (kh, kw, c) with c fastest,
// so W[z] is a plain row-major [Mg, K] matrix. Element (m, n) goes to Y[n * LDY + z * Mg + m]; the
// epilogue sees the dense NHWC linear index n * M + z * Mg + m (its extra inputs are laid out like a
// dense Y). LDY (runtime argument): elements between consecutive pixels' rows of Y, M for a dense Y,
// a Concat's channel total when Y is placed in its slice (polykit.compiler.builder.concat_placement).
// LDX (runtime argument): elements between consecutive pixels of X, C for a dense X, a Concat's
// channel total when X is placed in its slice and this conv reads it too (a skip connection).
// D2S_H, D2S_W (depth_to_space.cuh: a ConvNHWC with depth_to_space): the geometry args describe the
// conv's own output [NB, OH, OW, M] (conv.py: conv_args) and each element is stored at its
// rearranged address in Y [NB, OH * D2S_H, OW * D2S_W, M / (D2S_H * D2S_W)], LDY elements between
// its pixels. The epilogue still sees the dense index (a layer with epilogue inputs is not folded).
#include "conv_common.cuh"
#include "depth_to_space.cuh"

#define CONV_NHWC_PARAMS CONV_BASE_PARAMS, i64 splits, float *partial, i64 LDY, i64 LDX EPI_PARAMS
#define CONV_NHWC_ARGS CONV_BASE_ARGS, splits, partial, LDY, LDX EPI_COMMA_ARGS

struct ConvNhwcP {
  const ELEM *X, *Wt, *Bias; ELEM* Y;
  i64 M, N, K;          // the GEMM: per-group out channels, pixels, KH*KW*Cg
  i64 C, Cg, M_, LDY, LDX, OSP, OW, SH, SW, PH, PW;
  u32 Cgu, KWu;         // K decomposition in 32 bits (K < 2^31; checked by the host)
  int Hi, Wi, DHi, DWi;
#if HAS_EPILOGUE
  EpiState epi;
#endif
  __device__ __forceinline__ float a(i64 z, i64 m, i64 k) const { return (float)ld(Wt, (z * M + m) * K + k); }
  // column n = (nb, oh, ow): where its image's group channels start, and the window's origin
  struct Col {
    i64 base;
    int ih0, iw0;
  };
  __device__ __forceinline__ Col col(i64 z, i64 n) const {
    const i64 nb = n / OSP, s = n - nb * OSP;
    const i64 oh = s / OW, ow = s - oh * OW;
    Col c;
    c.base = nb * Hi * Wi * LDX + z * Cg;
    c.ih0 = (int)(oh * SH - PH); c.iw0 = (int)(ow * SW - PW);
    return c;
  }
  // row k = (kh, kw, c)
  __device__ __forceinline__ float b(i64, i64 k, const Col& col) const {
    const u32 r = (u32)k / Cgu, c = (u32)k - r * Cgu;
    const u32 kh = r / KWu, kw = r - kh * KWu;
    const int ih = col.ih0 + (int)kh * DHi, iw = col.iw0 + (int)kw * DWi;
    if (ih < 0 || ih >= Hi || iw < 0 || iw >= Wi) return 0.f;
    return (float)ld(X, col.base + ((i64)ih * Wi + iw) * LDX + c);
  }
  __device__ __forceinline__ void store(i64 z, i64 m, i64 n, float acc) const {
    const i64 co = z * M + m;
    if (Bias) acc += (float)ld(Bias, co);
#if HAS_EPILOGUE
    acc = apply_epilogue(epi, acc, n * M_ + co, co);  // NHWC: the output channel is the last axis
#endif
#if D2S
    st(Y, d2s_row(n, OW, LDY) + d2s_col(co, M_ / (D2S_H * D2S_W), OW, LDY), acc);
#else
    st(Y, n * LDY + co, acc);
#endif
  }
};

__device__ __forceinline__ ConvNhwcP conv_nhwc_problem(CONV_NHWC_PARAMS) {
  ConvNhwcP p;
  p.X = X; p.Wt = Wt; p.Bias = Bias; p.Y = Y;
  p.C = C; p.Cg = C / G; p.M_ = M; p.M = M / G; p.LDY = LDY; p.LDX = LDX;
  p.OSP = OH * OW; p.OW = OW; p.SH = SH; p.SW = SW; p.PH = PH; p.PW = PW;
  p.N = NB * p.OSP; p.K = KH * KW * p.Cg;
  p.Cgu = (u32)p.Cg; p.KWu = (u32)KW;
  p.Hi = (int)H; p.Wi = (int)W; p.DHi = (int)DH; p.DWi = (int)DW;
#if HAS_EPILOGUE
  p.epi = make_epi(EPI_ARGS);
#endif
  return p;
}

// implicit GEMM with N = NB*OH*OW pixels, M = M/G out channels, groups (and K slices) on grid z
extern "C" __global__ void __launch_bounds__(256) conv_nhwc_igemm_simt(CONV_NHWC_PARAMS) {
  igemm_simt(conv_nhwc_problem(CONV_NHWC_ARGS), splits, partial);
}
extern "C" __global__ void __launch_bounds__(256) conv_nhwc_igemm_simt_wide(CONV_NHWC_PARAMS) {
  igemm_simt_wide(conv_nhwc_problem(CONV_NHWC_ARGS), splits, partial);
}
extern "C" __global__ void __launch_bounds__(256) conv_nhwc_igemm_mma(CONV_NHWC_PARAMS) {
  igemm_mma(conv_nhwc_problem(CONV_NHWC_ARGS), splits, partial);
}
extern "C" __global__ void __launch_bounds__(256) conv_nhwc_splitk_reduce(CONV_NHWC_PARAMS) {
  igemm_splitk_reduce(conv_nhwc_problem(CONV_NHWC_ARGS), splits, partial);
}

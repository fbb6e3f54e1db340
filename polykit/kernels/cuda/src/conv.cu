// Convolutions (NCHW, 1-3 spatial dims mapped onto D x H x W with unit leading dims).
//
// ELEM (define): storage type of X, W, B, Y (float or half_t); fp32 accumulation.
// Parameters: conv_common.cuh. X is (NB, C, D, H, W), W is (M, C/G, KD, KH, KW).
#include "conv_common.cuh"

// Implicit GEMM per group z: Y[z] (Mg x NB*OD*OH*OW) = W[z] (Mg x Cg*KD*KH*KW) * im2col(X)[z];
// the im2col matrix is never stored: b(z, k, n) gathers from X (0 in the padding).
struct ConvP {
  const ELEM *X, *Wt, *Bias; ELEM* Y;
  i64 NB, C, D, H, W, M, OD, OH, OW, KD, KH, KW, SD, SH, SW, PD, PH, PW, DD, DH, DW, G;
  i64 Cg, Mg, M_, N, K, KSP, OSP;
  u32 KSPu, KHWu, KWu;
  int Di, Hi, Wi, DDi, DHi, DWi;
#if HAS_EPILOGUE
  EpiState epi;
#endif
  __device__ __forceinline__ float a(i64 z, i64 m, i64 k) const { return (float)ld(Wt, (z * Mg + m) * K + k); }
  // column n = (nb, od, oh, ow): its image's channel-group base and the window's origin
  struct Col {
    i64 base;
    int id0, ih0, iw0;
  };
  __device__ __forceinline__ Col col(i64 z, i64 n) const {
    const i64 nb = n / OSP; i64 s = n - nb * OSP;
    const i64 od = s / (OH * OW); s -= od * OH * OW;
    const i64 oh = s / OW, ow = s - oh * OW;
    Col c;
    c.base = (nb * C + z * Cg) * D * H * W;
    c.id0 = (int)(od * SD - PD); c.ih0 = (int)(oh * SH - PH); c.iw0 = (int)(ow * SW - PW);
    return c;
  }
  // row k = (c, kd, kh, kw), decomposed in 32 bits (K < 2^31; checked by the host)
  __device__ __forceinline__ float b(i64, i64 k, const Col& col) const {
    u32 c = (u32)k, kd = 0, kh = 0, kw = 0;
    if (KSPu != 1) {
      c = (u32)k / KSPu; u32 r = (u32)k - c * KSPu;
      kd = r / KHWu; r -= kd * KHWu;
      kh = r / KWu; kw = r - kh * KWu;
    }
    const int id = col.id0 + (int)kd * DDi, ih = col.ih0 + (int)kh * DHi, iw = col.iw0 + (int)kw * DWi;
    if (id < 0 || id >= Di || ih < 0 || ih >= Hi || iw < 0 || iw >= Wi) return 0.f;
    return (float)ld(X, col.base + (i64)c * D * H * W + ((i64)id * Hi + ih) * Wi + iw);
  }
  __device__ __forceinline__ void store(i64 z, i64 m, i64 n, float acc) const {
    const i64 nb = N < 0x7fffffffLL ? (i64)((u32)n / (u32)OSP) : n / OSP;
    const i64 co = z * Mg + m, s = n - nb * OSP;
    if (Bias) acc += (float)ld(Bias, co);
    const i64 oi = (nb * M_ + co) * OSP + s;
#if HAS_EPILOGUE
    acc = apply_epilogue(epi, acc, oi, (i64)((u32)s % (u32)OW));  // col: ow, the output's last axis
#endif
    st(Y, oi, acc);
  }
};

__device__ __forceinline__ ConvP make_conv(CONV_BASE_PARAMS) {
  ConvP p;
  p.X = X; p.Wt = Wt; p.Bias = Bias; p.Y = Y;
  p.NB = NB; p.C = C; p.D = D; p.H = H; p.W = W; p.M_ = M; p.OD = OD; p.OH = OH; p.OW = OW;
  p.KD = KD; p.KH = KH; p.KW = KW; p.SD = SD; p.SH = SH; p.SW = SW; p.PD = PD; p.PH = PH; p.PW = PW;
  p.DD = DD; p.DH = DH; p.DW = DW; p.G = G;
  p.Cg = C / G; p.Mg = M / G; p.KSP = KD * KH * KW; p.OSP = OD * OH * OW;
  p.K = p.Cg * p.KSP; p.N = NB * p.OSP;
  p.M = p.Mg;  // the GEMM's M is the per-group out channel count
  p.KSPu = (u32)p.KSP; p.KHWu = (u32)(KH * KW); p.KWu = (u32)KW;
  p.Di = (int)D; p.Hi = (int)H; p.Wi = (int)W; p.DDi = (int)DD; p.DHi = (int)DH; p.DWi = (int)DW;
  return p;
}

__device__ __forceinline__ ConvP conv_problem(CONV_IGEMM_PARAMS) {
  ConvP p = make_conv(CONV_BASE_ARGS);
#if HAS_EPILOGUE
  p.epi = make_epi(EPI_ARGS);
#endif
  return p;
}

// implicit GEMM with N = NB*OD*OH*OW pixels, M = M/G out channels, groups (and K slices) on grid z
extern "C" __global__ void __launch_bounds__(256) conv_igemm_simt(CONV_IGEMM_PARAMS) {
  igemm_simt(conv_problem(CONV_IGEMM_ARGS), splits, partial);
}
extern "C" __global__ void __launch_bounds__(256) conv_igemm_simt_wide(CONV_IGEMM_PARAMS) {
  igemm_simt_wide(conv_problem(CONV_IGEMM_ARGS), splits, partial);
}
extern "C" __global__ void __launch_bounds__(256) conv_igemm_mma(CONV_IGEMM_PARAMS) {
  igemm_mma(conv_problem(CONV_IGEMM_ARGS), splits, partial);
}
extern "C" __global__ void __launch_bounds__(256) conv_splitk_reduce(CONV_IGEMM_PARAMS) {
  igemm_splitk_reduce(conv_problem(CONV_IGEMM_ARGS), splits, partial);
}

// Direct convolution, one thread per output element (grid-stride over NB*M*OD*OH*OW):
// the depthwise path (C/G small, so a GEMM tile would be mostly padding).
// grid (min(ceil(total/256), 65535*8)), block 256
extern "C" __global__ void __launch_bounds__(256) conv_direct(CONV_PARAMS) {
#if HAS_EPILOGUE
  const EpiState epi = make_epi(EPI_ARGS);
#endif
  const i64 OSP = OD * OH * OW, total = NB * M * OSP, Cg = C / G, Mg = M / G;
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
    const i64 nb = i / (M * OSP); i64 r = i - nb * M * OSP;
    const i64 co = r / OSP; i64 s = r - co * OSP;
    const i64 od = s / (OH * OW); s -= od * OH * OW;
    const i64 oh = s / OW, ow = s - oh * OW;
    const i64 g = co / Mg;
    float acc = Bias ? (float)ld(Bias, co) : 0.f;
    for (i64 c = 0; c < Cg; ++c) {
      const ELEM* xc = X + (nb * C + g * Cg + c) * D * H * W;
      const ELEM* wc = Wt + (co * Cg + c) * KD * KH * KW;
      for (i64 kd = 0; kd < KD; ++kd) {
        const i64 id = od * SD - PD + kd * DD;
        if (id < 0 || id >= D) continue;
        for (i64 kh = 0; kh < KH; ++kh) {
          const i64 ih = oh * SH - PH + kh * DH;
          if (ih < 0 || ih >= H) continue;
          for (i64 kw = 0; kw < KW; ++kw) {
            const i64 iw = ow * SW - PW + kw * DW;
            if (iw < 0 || iw >= W) continue;
            acc = fmaf((float)ld(xc, (id * H + ih) * W + iw), (float)ld(wc, (kd * KH + kh) * KW + kw), acc);
          }
        }
      }
    }
#if HAS_EPILOGUE
    acc = apply_epilogue(epi, acc, i, ow);
#endif
    st(Y, i, acc);
  }
}

// ConvTranspose, gather form: one thread per output element y[nb, co, od, oh, ow] sums
// x[nb, ci, i] * w[ci, co % Mg, k] over the input positions i with i*S - P + k*Dil == o.
// W is (C, M/G, KD, KH, KW); (D, H, W) are the input's spatial dims, (OD, OH, OW) the output's.
// grid (min(ceil(total/256), 65535*8)), block 256
extern "C" __global__ void __launch_bounds__(256) conv_transpose_direct(CONV_PARAMS) {
  const i64 OSP = OD * OH * OW, total = NB * M * OSP, Cg = C / G, Mg = M / G;
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
    const i64 nb = i / (M * OSP); i64 r = i - nb * M * OSP;
    const i64 co = r / OSP; i64 s = r - co * OSP;
    const i64 od = s / (OH * OW); s -= od * OH * OW;
    const i64 oh = s / OW, ow = s - oh * OW;
    const i64 g = co / Mg, cm = co - g * Mg;
    float acc = Bias ? (float)ld(Bias, co) : 0.f;
    for (i64 kd = 0; kd < KD; ++kd) {
      const i64 td = od + PD - kd * DD;
      if (td < 0 || td % SD) continue;
      const i64 id = td / SD;
      if (id >= D) continue;
      for (i64 kh = 0; kh < KH; ++kh) {
        const i64 th = oh + PH - kh * DH;
        if (th < 0 || th % SH) continue;
        const i64 ih = th / SH;
        if (ih >= H) continue;
        for (i64 kw = 0; kw < KW; ++kw) {
          const i64 tw = ow + PW - kw * DW;
          if (tw < 0 || tw % SW) continue;
          const i64 iw = tw / SW;
          if (iw >= W) continue;
          for (i64 c = 0; c < Cg; ++c) {
            const i64 ci = g * Cg + c;
            acc = fmaf((float)ld(X, (((nb * C + ci) * D + id) * H + ih) * W + iw),
                       (float)ld(Wt, (((ci * Mg + cm) * KD + kd) * KH + kh) * KW + kw), acc);
          }
        }
      }
    }
    st(Y, i, acc);
  }
}

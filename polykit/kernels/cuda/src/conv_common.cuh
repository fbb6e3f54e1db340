// What the convolution families (conv.cu, conv_nhwc.cu) share: the kernel parameters, so the
// host builds one argument list for all of them (conv.py: conv_args), and the bodies of the
// implicit-GEMM entry points over a family's problem type (gemm_core.cuh's contract).
//
// ELEM (define): storage type of X, W, B, Y. Geometry args (all i64): batch NB, channels C,
// input D H W, out channels M, output OD OH OW, kernel KD KH KW, strides SD SH SW, begin pads
// PD PH PW, dilations DD DH DW, group G. Bias (may be null) has M elements.
#pragma once
#include "gemm_core.cuh"

// the fused-epilogue hook (HAS_EPILOGUE, EPI_PARAMS, ...; epilogue_hook.cuh)
#include "epilogue_hook.cuh"

#define CONV_BASE_PARAMS                                                                                 \
  const ELEM *X, const ELEM *Wt, const ELEM *Bias, ELEM *Y, i64 NB, i64 C, i64 D, i64 H, i64 W, i64 M,     \
      i64 OD, i64 OH, i64 OW, i64 KD, i64 KH, i64 KW, i64 SD, i64 SH, i64 SW, i64 PD, i64 PH, i64 PW, i64 DD, \
      i64 DH, i64 DW, i64 G
#define CONV_PARAMS CONV_BASE_PARAMS EPI_PARAMS
// implicit GEMM kernels also take the split-K count and partial buffer (gemm_core.cuh)
#define CONV_IGEMM_PARAMS CONV_BASE_PARAMS, i64 splits, float *partial EPI_PARAMS
#define CONV_BASE_ARGS X, Wt, Bias, Y, NB, C, D, H, W, M, OD, OH, OW, KD, KH, KW, SD, SH, SW, PD, PH, PW, DD, DH, DW, G
#define CONV_IGEMM_ARGS CONV_BASE_ARGS, splits, partial EPI_COMMA_ARGS

// grid (ceil(N/64), ceil(M/64), G * splits), block 256: fp32 FMA tiles
template <class P>
__device__ __forceinline__ void igemm_simt(const P& p, i64 splits, float* partial) {
  simt_gemm<P, 64, 64, 16, 4, 4>(p, k_slice(p.K, splits, 16), splits > 1 ? partial : nullptr);
}

// grid (ceil(N/128), ceil(M/128), G * splits), block 256: fp32 FMA tiles, 8 x 8 outputs a thread
template <class P>
__device__ __forceinline__ void igemm_simt_wide(const P& p, i64 splits, float* partial) {
  simt_gemm<P, 128, 128, 16, 8, 8>(p, k_slice(p.K, splits, 16), splits > 1 ? partial : nullptr);
}

// grid (ceil(N/128), ceil(M/128), G * splits), block 256: fp16 operands on tensor cores
template <class P>
__device__ __forceinline__ void igemm_mma(const P& p, i64 splits, float* partial) {
  mma_gemm<P>(p, k_slice(p.K, splits, MMA_BK), splits > 1 ? partial : nullptr);
}

// after a split launch of either: grid (ceil(M * N / 256) capped, 1, G), block 256
template <class P>
__device__ __forceinline__ void igemm_splitk_reduce(const P& p, i64 splits, const float* partial) {
  splitk_reduce<P>([&](i64) { return p; }, splits, partial);
}

// The kernel parameters every convolution family shares (conv.cu, conv_nhwc.cu), so the host
// builds one argument list for all of them (conv.py: conv_args).
//
// ELEM (define): storage type of X, W, B, Y. Geometry args (all i64): batch NB, channels C,
// input D H W, out channels M, output OD OH OW, kernel KD KH KW, strides SD SH SW, begin pads
// PD PH PW, dilations DD DH DW, group G. Bias (may be null) has M elements.
#pragma once
#include "gemm_core.cuh"

// Epilogue hook: generated modules (epilogue.py) define HAS_EPILOGUE 1, EPI_PARAMS (extra
// kernel parameters, leading comma), EPI_ARGS, struct EpiState, make_epi(...) and
// float apply_epilogue(const EpiState&, float v, i64 out_index) before the family's text.
#ifndef HAS_EPILOGUE
#define HAS_EPILOGUE 0
#define EPI_PARAMS
#define EPI_COMMA_ARGS
#endif

#define CONV_BASE_PARAMS                                                                                 \
  const ELEM *X, const ELEM *Wt, const ELEM *Bias, ELEM *Y, i64 NB, i64 C, i64 D, i64 H, i64 W, i64 M,     \
      i64 OD, i64 OH, i64 OW, i64 KD, i64 KH, i64 KW, i64 SD, i64 SH, i64 SW, i64 PD, i64 PH, i64 PW, i64 DD, \
      i64 DH, i64 DW, i64 G
#define CONV_PARAMS CONV_BASE_PARAMS EPI_PARAMS
// implicit GEMM kernels also take the split-K count and partial buffer (gemm_core.cuh)
#define CONV_IGEMM_PARAMS CONV_BASE_PARAMS, i64 splits, float *partial EPI_PARAMS
#define CONV_BASE_ARGS X, Wt, Bias, Y, NB, C, D, H, W, M, OD, OH, OW, KD, KH, KW, SD, SH, SW, PD, PH, PW, DD, DH, DW, G
#define CONV_IGEMM_ARGS CONV_BASE_ARGS, splits, partial EPI_COMMA_ARGS

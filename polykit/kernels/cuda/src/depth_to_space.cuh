// Depth-to-space stores (ai.polykit ConvNHWC's depth_to_space [bH, bW], ops/nn/channels_last.py):
// D2S_H, D2S_W (defines, 1 unless a layer sets them; kernels/cuda/gemm/epilogue.py: store_defines).
// The conv's own output [NB, OH, OW, bH * bW * C] lands in Y [NB, OH * bH, OW * bW, C], pixels LDY
// elements apart: element (pixel r = (nb, oh, ow), channel j = (dy, dx, c)) at d2s_row(r) + d2s_col(j),
// one term per row and one per column (conv_nhwc.cu, gemm_sm90_epilogue.cuh).
#pragma once
#ifndef D2S_H
#define D2S_H 1
#endif
#ifndef D2S_W
#define D2S_W 1
#endif
#define D2S (D2S_H * D2S_W > 1)

// Y's offset of conv pixel r's first block, OW the conv's output width: r - ow = (nb * OH + oh) * OW
__device__ __forceinline__ i64 d2s_row(i64 r, i64 OW, i64 LDY) {
  const i64 ow = r % OW;
  return ((r - ow) * (D2S_H * D2S_W) + ow * D2S_W) * LDY;
}
// the offset of channel j = (dy, dx, c), c < cb (channels a block), from its pixel's first block
__device__ __forceinline__ i64 d2s_col(i64 j, i64 cb, i64 OW, i64 LDY) {
  const i64 blk = j / cb, c = j - blk * cb, dy = blk / D2S_W;
  return (dy * OW * D2S_W + (blk - dy * D2S_W)) * LDY + c;
}

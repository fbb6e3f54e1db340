// WeightOnlyMatMul (ai.polykit; compiler/ops/quant/weight_only.py): Y = X @ dequantize(W)^T + B for
// the small-M shapes (decode, M = 1..16 rows) where reading the weight is the cost. The weight
// stays packed (4 or 8 bits an element) and is dequantized in the main loop, on CUDA cores
// (correctness first: no tensor-core mma yet).
//
// Layouts: X [M, K] row-major (ELEM: float, half_t or bf16_t; a layer's leading dims folded into M);
// W uint8 [N, ldw]: row n holds W[n, 0..K-1] K-contiguous, 4-bit types two a byte (element k in
// byte k / 2, the low nibble for even k), 8-bit one a byte, ldw a multiple of 16 (zero padded);
// scale [N, nb] ELEM and zero point [N, nb] int8 / uint8 (or null: 0), nb = ceil(K / block);
// B [N] ELEM or null; Y [M, N] ELEM.
// Weight types (runtime `wtype`, uniform): WT_I4, WT_U4 (4-bit integers), WT_F4 (float4 e2m1),
// WT_I8, WT_U8.
// Numerics: w = (value - zero point) * scale computed exactly in float32 (a 9-bit integer times
// an ELEM scale) and rounded once to ELEM: DequantizeLinear's value, bit for bit (__fmul_rn: never
// contracted into the accumulating fma); products accumulate in float32 (fmaf); Y = ELEM(acc + float(B)),
// rounded once. The summation order differs from the cpu reference's BLAS: equal to float32
// rounding, not bit for bit.
// Geometry: blockDim.x = 32 * WARPS; warp w of block x owns output columns
// n0 = (blockIdx.x * WARPS + w) * COLS .. n0 + COLS - 1, for row tiles m0 = blockIdx.y * ROWS,
// stepping by gridDim.y * ROWS (any M). Lanes split K in 16-byte chunks of the packed rows (32
// elements of 4 bits, 16 of 8), lane l taking chunks l, l + 32, ... (a warp reads 512 contiguous
// bytes of a row per step: coalesced); then a shuffle reduction, and lane (j * ROWS + m) % 32
// writes Y[m0 + m, n0 + j].
// Defines: ELEM, ROWS (rows a tile, 1..16), COLS (columns a warp), WARPS.
#include "dtypes.cuh"

#ifndef ELEM
#define ELEM float
#endif
#ifndef ROWS
#define ROWS 1
#endif
#ifndef COLS
#define COLS 2
#endif
#ifndef WARPS
#define WARPS 4
#endif

enum { WT_I4, WT_U4, WT_F4, WT_I8, WT_U8 };

// the value of a weight code as float32 (exact), branch free: integers are (code ^ flip) - flip
// (flip 8 for int4, 0x80 for int8, 0 unsigned); float4 e2m1 has sign bit 3, exponent bits 2..1 and
// mantissa bit 0 (exponent 0: 0 or the subnormal 0.5)
struct WoDecode {
  u32 flip;
  bool fp4;
  __device__ __forceinline__ explicit WoDecode(int wtype)
      : flip(wtype == WT_I4 ? 8u : wtype == WT_I8 ? 0x80u : 0u), fp4(wtype == WT_F4) {}
  __device__ __forceinline__ float operator()(u32 code) const {
    const u32 e = (code >> 1) & 3u, m = code & 1u;
    const u32 mag = e ? ((e + 126u) << 23) | (m << 22) : (m ? 0x3f000000u : 0u);
    const float f4 = __uint_as_float(mag | ((code & 8u) << 28));
    return fp4 ? f4 : (float)((int)(code ^ flip) - (int)flip);
  }
};

__device__ __forceinline__ float wo_zero(const void* zero, int zsigned, i64 i) {
  if (!zero) return 0.f;
  return zsigned ? (float)((const signed char*)zero)[i] : (float)((const u8*)zero)[i];
}

// acc[m] += x[m0 + m, k] * w for the ROWS rows of the tile
__device__ __forceinline__ void wo_fma(float (&acc)[ROWS], const ELEM* __restrict__ x, int k, int K, int m0, int M,
                                       float w) {
#pragma unroll
  for (int m = 0; m < ROWS; ++m)
    if (m0 + m < M) acc[m] = fmaf(ld(x, (i64)(m0 + m) * K + k), w, acc[m]);
}

// one 16-byte chunk of the packed row of column n: elements k0 .. k0 + PER - 1 (those < K). A chunk
// inside one scale block (block_size a multiple of PER, the usual 32 / 64 / 128) takes the unrolled
// path; others look the block up per element.
template <int BITS>
__device__ __forceinline__ void wo_chunk(float (&acc)[ROWS], const ELEM* __restrict__ x, uint4 bits, int k0,
                                         int K, int m0, int M, const ELEM* __restrict__ srow, const void* zero,
                                         i64 zrow, int zsigned, int block, WoDecode decode) {
  constexpr int PER = 128 / BITS;
  constexpr u32 MASK = (1u << BITS) - 1u;
  constexpr int PER_WORD = 32 / BITS;
  const int last = min(k0 + PER, K) - 1;
  if (k0 / block == last / block && last == k0 + PER - 1) {
    const float s = ld(srow, k0 / block), z = wo_zero(zero, zsigned, zrow + k0 / block);
#pragma unroll 1
    for (int i = 0; i < 4; ++i) {  // a word at a time: the code stays small with 16-row tiles
      const u32 word = i == 0 ? bits.x : i == 1 ? bits.y : i == 2 ? bits.z : bits.w;
#pragma unroll
      for (int e = 0; e < PER_WORD; ++e)
        wo_fma(acc, x, k0 + i * PER_WORD + e, K, m0, M,
               round_as<ELEM>(__fmul_rn(decode((word >> (e * BITS)) & MASK) - z, s)));
    }
    return;
  }
#pragma unroll 1
  for (int k = k0; k <= last; ++k) {
    const int e = k - k0, i = e / PER_WORD;
    const u32 word = i == 0 ? bits.x : i == 1 ? bits.y : i == 2 ? bits.z : bits.w;
    const float s = ld(srow, k / block), z = wo_zero(zero, zsigned, zrow + k / block);
    wo_fma(acc, x, k, K, m0, M, round_as<ELEM>(__fmul_rn(decode((word >> ((e % PER_WORD) * BITS)) & MASK) - z, s)));
  }
}

template <int BITS>
__device__ __forceinline__ void wo_tile(const ELEM* __restrict__ x, const u8* __restrict__ w,
                                        const ELEM* __restrict__ scale, const void* __restrict__ zero,
                                        const ELEM* __restrict__ bias, ELEM* __restrict__ y, int M, int N, int K,
                                        int ldw, int block, int nb, WoDecode decode, int zsigned, int n0, int m0, int lane) {
  constexpr int PER = 128 / BITS;
  const int chunks = (K + PER - 1) / PER;
  float acc[COLS][ROWS];
#pragma unroll
  for (int j = 0; j < COLS; ++j)
#pragma unroll
    for (int m = 0; m < ROWS; ++m) acc[j][m] = 0.f;
  for (int c = lane; c < chunks; c += 32) {
#pragma unroll
    for (int j = 0; j < COLS; ++j) {
      const int n = n0 + j;
      if (n < N) {
        const uint4 bits = *reinterpret_cast<const uint4*>(w + (i64)n * ldw + (i64)c * 16);
        wo_chunk<BITS>(acc[j], x, bits, c * PER, K, m0, M, scale + (i64)n * nb, zero, (i64)n * nb, zsigned, block,
                       decode);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < COLS; ++j)
#pragma unroll
    for (int m = 0; m < ROWS; ++m) {
      float v = acc[j][m];
#pragma unroll
      for (int off = 16; off; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
      const int n = n0 + j;
      if (lane == (j * ROWS + m) % 32 && n < N && m0 + m < M)
        st(y, (i64)(m0 + m) * N + n, bias ? __fadd_rn(v, ld(bias, n)) : v);
    }
}

extern "C" __global__ void __launch_bounds__(32 * WARPS)
weight_only_matmul(const ELEM* __restrict__ x, const u8* __restrict__ w, const ELEM* __restrict__ scale,
                   const void* __restrict__ zero, const ELEM* __restrict__ bias, ELEM* __restrict__ y, int M, int N,
                   int K, int ldw, int block, int nb, int wtype) {
  const int lane = threadIdx.x & 31;
  const int n0 = (blockIdx.x * WARPS + (threadIdx.x >> 5)) * COLS;
  if (n0 >= N) return;  // a whole warp leaves together: no block-wide synchronization follows
  const WoDecode decode(wtype);
  const int zsigned = wtype == WT_I4 || wtype == WT_I8;
  for (int m0 = blockIdx.y * ROWS; m0 < M; m0 += gridDim.y * ROWS) {
    if (wtype <= WT_F4)
      wo_tile<4>(x, w, scale, zero, bias, y, M, N, K, ldw, block, nb, decode, zsigned, n0, m0, lane);
    else
      wo_tile<8>(x, w, scale, zero, bias, y, M, N, K, ldw, block, nb, decode, zsigned, n0, m0, lane);
  }
}

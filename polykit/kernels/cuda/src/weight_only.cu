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

// ---------------------------------------------------------------------------------------------
// weight_only_gemv: the bandwidth-bound kernel (tactics cuda.weight_only.bw_m<ROWS>_k<KSPLIT>_c<cols>).
// Same layouts and numerics as weight_only_matmul (w rounded once to ELEM, fmaf into float32 per
// row); only the summation order differs (still float32 rounding of the reference).
// Geometry: a block of CGROUPS * KSPLIT warps owns BCOLS = CGROUPS * 4 * CPT output columns and a
// tile of ROWS activation rows (m0 = blockIdx.y * ROWS, stepping by gridDim.y * ROWS: any M).
// Warp w: column group g = w / KSPLIT, K split s = w % KSPLIT. Lane = slot * 8 + q: slot (0..3)
// holds CPT columns n = blockIdx.x * BCOLS + (g * 4 + slot) * CPT + j; q (0..7) the chunk of a
// 128-byte slice of the packed row (8 chunks of 16 bytes: SE = 8 * PER elements, PER = 32 for
// 4 bits, 16 for 8). Step t covers KSPLIT consecutive slices (KSPLIT * SE elements): warp split s
// takes slice t * KSPLIT + s, lane q its chunk c = (t * KSPLIT + s) * 8 + q (8 lanes read 128
// contiguous bytes of a row: coalesced). Per step the block stages X[m0 .. m0 + ROWS - 1] of the
// step's elements in shared memory once as float (16-byte global loads where X's rows are
// 16-byte aligned; zeros past K and M), each lane's next step's CPT chunks are loaded before the
// staging (registers double-buffered: 2 * CPT 16-byte loads in flight a lane), and a chunk's
// codes are decoded once and applied to all ROWS rows (acc[CPT][ROWS] in registers; the scale and
// zero point read once a chunk when it lies in one block and inside K, per element otherwise).
// Reduction, fixed order (deterministic): the 8 lanes q of a slot by shuffle-xor 4, 2, 1; then
// the KSPLIT warp partials through shared memory, summed s = 0, 1, .. in order by warp split 0,
// whose lanes write Y (+ bias, one rounding to ELEM).
// Shared memory: xs[ROWS][KSPLIT * 8][PER + 4] floats (the 4 pad floats make the 8 lanes' float4
// reads conflict free) + part[KSPLIT][CGROUPS * 4 * CPT][ROWS]; at ROWS = 16, KSPLIT = 2:
// 36,864 + 2,048 bytes at 16 columns a block (under the 48 KiB static limit).
// Cost per output column and row tile (K = 4096, int4, block 128, half X): bytes K / 2 of packed
// weight (2,048) + 2 * K / block of scale (64) + K / block of zero point (32) from DRAM, and the
// tile's X (ROWS * K * 2) from L2 once per block of BCOLS columns. Instructions per weight element
// (counted from the source, not read from SASS): ~8 a lane to decode and dequantize (shift, and,
// xor, sub, i2f, fsub, fmul, the two cvt of the ELEM rounding for half / bfloat16; amortized: the
// scale / zero point loads a chunk), then 1.25 a row (one fma, a quarter of a 16-byte shared
// load): ~8 + 1.25 * ROWS, i.e. K * (8 + 1.25 * ROWS) / 32 warp-instructions a column.
// Predicted at N = K = 4096 (not measured): H100 SXM (132 SMs, ~3.0 TB/s, ~850 warp-instructions
// an ns): M = 1: 8.8 MB / 3.0 TB/s ~ 3 us of DRAM, 16.8 M elements * 9.25 / 32 ~ 4.9 M
// warp-instructions ~ 5.8 us of issue: ~6-9 us with launch and the K chain; M = 16 (one 16-row
// tile): 16.8 M * 28 / 32 ~ 14.7 M warp-instructions ~ 17 us (CUDA-core bound). H200 (4.8 TB/s,
// same SMs): the same issue-bound times. kernels/cuda/int8/weight_only.py's gemv_us is this model.
// Registers (ptxas, sm_90, no spills): 80-128 a thread at ROWS <= 8 (16 warps an SM), 194-208 at
// ROWS = 16 (8 warps an SM): GV_MIN_BLOCKS.
// Defines: ELEM, ROWS (1..16), KSPLIT, CGROUPS, CPT.
#ifndef KSPLIT
#define KSPLIT 1
#endif
#ifndef CGROUPS
#define CGROUPS 2
#endif
#ifndef CPT
#define CPT 2
#endif
#define GV_WARPS (CGROUPS * KSPLIT)
#define GV_BCOLS (CGROUPS * 4 * CPT)
// blocks an SM must hold: 16 warps (up to 128 registers a thread; without a minimum ptxas capped
// some tiles at 64 and spilled the accumulators), 8 warps at 16 rows (their 16 x CPT accumulators
// spill at 128 registers)
#define GV_SM_WARPS (ROWS >= 16 ? 8 : 16)
#define GV_MIN_BLOCKS (GV_SM_WARPS / GV_WARPS > 0 ? GV_SM_WARPS / GV_WARPS : 1)
#define GV_XS (ROWS * KSPLIT * 8 * 36)  // floats: sized for 4 bits (PER + 4 = 36 >= 16 + 4)

// the value of a weight code (exact float32), the type known at compile time
template <int WT>
__device__ __forceinline__ float gv_value(u32 code) {
  if (WT == WT_F4) {
    const u32 e = (code >> 1) & 3u, m = code & 1u;
    const u32 mag = e ? ((e + 126u) << 23) | (m << 22) : (m ? 0x3f000000u : 0u);
    return __uint_as_float(mag | ((code & 8u) << 28));
  }
  constexpr u32 flip = WT == WT_I4 ? 8u : WT == WT_I8 ? 0x80u : 0u;
  return (float)((int)(code ^ flip) - (int)flip);
}

// element e (unrolled) of 16 bytes of ELEM as float, from registers (no local copy)
__device__ __forceinline__ u32 gv_word(uint4 u, int i) { return i == 0 ? u.x : i == 1 ? u.y : i == 2 ? u.z : u.w; }
template <class T> __device__ __forceinline__ float gv_elem(uint4 u, int e);
template <> __device__ __forceinline__ float gv_elem<float>(uint4 u, int e) { return __uint_as_float(gv_word(u, e)); }
template <> __device__ __forceinline__ float gv_elem<half_t>(uint4 u, int e) {
  half_t h;
  h.x = (unsigned short)(gv_word(u, e >> 1) >> ((e & 1) * 16));
  return h2f(h);
}
template <> __device__ __forceinline__ float gv_elem<bf16_t>(uint4 u, int e) {
  return __uint_as_float((gv_word(u, e >> 1) >> ((e & 1) * 16)) << 16);
}

// stage X[m0 + m, kb .. kb + KSPLIT * SE - 1] as float into xs[m][chunk][PER + 4] (zeros past K, M)
template <int PER>
__device__ __forceinline__ void gv_stage(float* xs, const ELEM* __restrict__ x, int M, int K, int m0, int kb,
                                         bool vec_ok) {
  constexpr int SE = 8 * PER, STEP = KSPLIT * SE, VEC = 16 / (int)sizeof(ELEM);
  for (int i = threadIdx.x; i < ROWS * STEP / VEC; i += 32 * GV_WARPS) {
    const int m = i / (STEP / VEC), e0 = (i % (STEP / VEC)) * VEC, k = kb + e0;
    float* dst = xs + (m * KSPLIT * 8 + e0 / PER) * (PER + 4) + e0 % PER;
    const i64 row = (i64)(m0 + m) * K;
    if (m0 + m < M && vec_ok && k + VEC <= K) {
      const uint4 u = *reinterpret_cast<const uint4*>(x + row + k);
#pragma unroll
      for (int e = 0; e < VEC; e += 4)  // 16-byte shared stores (dst is 16-byte aligned: e0 % 4 == 0)
        *reinterpret_cast<float4*>(dst + e) =
            make_float4(gv_elem<ELEM>(u, e), gv_elem<ELEM>(u, e + 1), gv_elem<ELEM>(u, e + 2), gv_elem<ELEM>(u, e + 3));
    } else {
#pragma unroll
      for (int e = 0; e < VEC; ++e) dst[e] = m0 + m < M && k + e < K ? ld(x, row + k + e) : 0.f;
    }
  }
}

// acc[m] += x[m, chunk elements] * w for one chunk's decoded codes, all ROWS rows
template <int WT, int BITS>
__device__ __forceinline__ void gv_chunk(float (&acc)[ROWS], const float* xc, uint4 bits, int k0, int K,
                                         const ELEM* __restrict__ srow, const void* zero, i64 zrow, int block) {
  constexpr int PER = 128 / BITS, PER_WORD = 32 / BITS;
  constexpr u32 MASK = (1u << BITS) - 1u;
  constexpr bool ZS = WT == WT_I4 || WT == WT_I8;
  const int last = min(k0 + PER, K) - 1;
  const bool whole = k0 / block == last / block && last == k0 + PER - 1;
  float s = 0.f, z = 0.f;
  if (whole) s = ld(srow, k0 / block), z = wo_zero(zero, ZS, zrow + k0 / block);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const u32 word = i == 0 ? bits.x : i == 1 ? bits.y : i == 2 ? bits.z : bits.w;
#pragma unroll
    for (int e4 = 0; e4 < PER_WORD; e4 += 4) {
      float w[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int k = k0 + i * PER_WORD + e4 + e;
        float se = s, ze = z;
        if (!whole) {  // straddles a block or K's end: per element (zero past K: X is zero there)
          const bool in = k < K;
          se = in ? ld(srow, k / block) : 0.f;
          ze = in ? wo_zero(zero, ZS, zrow + k / block) : 0.f;
        }
        w[e] = round_as<ELEM>(__fmul_rn(gv_value<WT>((word >> ((e4 + e) * BITS)) & MASK) - ze, se));
      }
#pragma unroll
      for (int m = 0; m < ROWS; ++m) {
        const float4 xv = *reinterpret_cast<const float4*>(xc + m * KSPLIT * 8 * (PER + 4) + i * PER_WORD + e4);
        acc[m] = fmaf(xv.x, w[0], acc[m]);
        acc[m] = fmaf(xv.y, w[1], acc[m]);
        acc[m] = fmaf(xv.z, w[2], acc[m]);
        acc[m] = fmaf(xv.w, w[3], acc[m]);
      }
    }
  }
}

template <int WT>
__device__ __forceinline__ void gv_body(float* xs, float* part, const ELEM* __restrict__ x, const u8* __restrict__ w,
                                        const ELEM* __restrict__ scale, const void* __restrict__ zero,
                                        const ELEM* __restrict__ bias, ELEM* __restrict__ y, int M, int N, int K,
                                        int ldw, int block, int nb) {
  constexpr int BITS = WT <= WT_F4 ? 4 : 8, PER = 128 / BITS, STEP = KSPLIT * 8 * PER;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = warp / KSPLIT, s = warp % KSPLIT, slot = lane >> 3, q = lane & 7;
  const int nbase = blockIdx.x * GV_BCOLS + (g * 4 + slot) * CPT;
  const int chunks = ldw / 16, steps = (K + STEP - 1) / STEP;
  const bool vec_ok = ((size_t)x % 16 == 0) && ((i64)K * (i64)sizeof(ELEM)) % 16 == 0;
  const float* xc = xs + (s * 8 + q) * (PER + 4);
  for (int m0 = blockIdx.y * ROWS; m0 < M; m0 += gridDim.y * ROWS) {
    float acc[CPT][ROWS];
#pragma unroll
    for (int j = 0; j < CPT; ++j)
#pragma unroll
      for (int m = 0; m < ROWS; ++m) acc[j][m] = 0.f;
    uint4 cur[CPT];
#pragma unroll
    for (int j = 0; j < CPT; ++j) {
      const int c = s * 8 + q;
      cur[j] = nbase + j < N && c < chunks ? *reinterpret_cast<const uint4*>(w + (i64)(nbase + j) * ldw + (i64)c * 16)
                                           : make_uint4(0u, 0u, 0u, 0u);
    }
    for (int t = 0; t < steps; ++t) {
      uint4 nxt[CPT];
      const int cn = ((t + 1) * KSPLIT + s) * 8 + q;
#pragma unroll
      for (int j = 0; j < CPT; ++j)  // issued before the staging: in flight while X is staged and used
        nxt[j] = t + 1 < steps && nbase + j < N && cn < chunks
                     ? *reinterpret_cast<const uint4*>(w + (i64)(nbase + j) * ldw + (i64)cn * 16)
                     : make_uint4(0u, 0u, 0u, 0u);
      __syncthreads();  // the previous step's readers are done with xs
      gv_stage<PER>(xs, x, M, K, m0, t * STEP, vec_ok);
      __syncthreads();
      const int c = (t * KSPLIT + s) * 8 + q, k0 = c * PER;
      if (k0 < K) {
#pragma unroll
        for (int j = 0; j < CPT; ++j) {
          const int n = nbase + j;
          if (n < N) gv_chunk<WT, BITS>(acc[j], xc, cur[j], k0, K, scale + (i64)n * nb, zero, (i64)n * nb, block);
        }
      }
#pragma unroll
      for (int j = 0; j < CPT; ++j) cur[j] = nxt[j];
    }
    // the 8 lanes of a slot: shuffle-xor 4, 2, 1 (every lane of the slot ends with the same sum)
#pragma unroll
    for (int j = 0; j < CPT; ++j)
#pragma unroll
      for (int m = 0; m < ROWS; ++m)
#pragma unroll
        for (int off = 4; off; off >>= 1) acc[j][m] += __shfl_xor_sync(0xffffffffu, acc[j][m], off);
    if (q == 0) {
#pragma unroll
      for (int j = 0; j < CPT; ++j)
#pragma unroll
        for (int m = 0; m < ROWS; ++m) part[(s * GV_BCOLS + (g * 4 + slot) * CPT + j) * ROWS + m] = acc[j][m];
    }
    __syncthreads();
    if (s == 0) {  // warp split 0 of each column group sums the KSPLIT partials in order and writes Y
      for (int i = lane; i < 4 * CPT * ROWS; i += 32) {
        const int col = g * 4 * CPT + i / ROWS, m = i % ROWS, n = blockIdx.x * GV_BCOLS + col;
        float v = part[col * ROWS + m];
#pragma unroll
        for (int p = 1; p < KSPLIT; ++p) v += part[(p * GV_BCOLS + col) * ROWS + m];
        if (n < N && m0 + m < M) st(y, (i64)(m0 + m) * N + n, bias ? __fadd_rn(v, ld(bias, n)) : v);
      }
    }
    __syncthreads();  // part and xs are reused by the next row tile
  }
}

extern "C" __global__ void __launch_bounds__(32 * GV_WARPS, GV_MIN_BLOCKS)
weight_only_gemv(const ELEM* __restrict__ x, const u8* __restrict__ w, const ELEM* __restrict__ scale,
                 const void* __restrict__ zero, const ELEM* __restrict__ bias, ELEM* __restrict__ y, int M, int N,
                 int K, int ldw, int block, int nb, int wtype) {
  __shared__ __align__(16) float xs[GV_XS];
  __shared__ float part[KSPLIT * GV_BCOLS * ROWS];
  switch (wtype) {  // uniform: each weight type gets its own decode, unrolled
    case WT_I4: gv_body<WT_I4>(xs, part, x, w, scale, zero, bias, y, M, N, K, ldw, block, nb); break;
    case WT_U4: gv_body<WT_U4>(xs, part, x, w, scale, zero, bias, y, M, N, K, ldw, block, nb); break;
    case WT_F4: gv_body<WT_F4>(xs, part, x, w, scale, zero, bias, y, M, N, K, ldw, block, nb); break;
    case WT_I8: gv_body<WT_I8>(xs, part, x, w, scale, zero, bias, y, M, N, K, ldw, block, nb); break;
    default: gv_body<WT_U8>(xs, part, x, w, scale, zero, bias, y, M, N, K, ldw, block, nb); break;
  }
}

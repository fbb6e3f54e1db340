// INT8 tensor-core main loop (mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32, sm_80+) shared by
// the INT8 layer entry points of int8.cu (docs/INT8.md, "The contract of a cuda INT8 tactic").
//
// A problem P is the product D (M x N) = A (M x K) * B (K x N) of 8-bit operands:
//   P::Row P.arow(m)                   what the A loader needs of row m (once per thread)
//   uint4  P.a16(row, k)               16 raw bytes of A's row at k..k+15 (the reduction axis)
//   uint4  P.b16(n, k)                 16 raw bytes of B's column n at k..k+15 (B is "col": K-major)
//   void   P.store(m, n, i32 acc)      the exact centered sum of (m, n): dequantize, epilogue, store
// Loaders fill what lies past K with the byte that is 0 in the signed domain below (0x80 for
// uint8, 0 for int8), and a convolution's padding taps with the activation's zero point (a real
// zero of the centered product).
//
// Signed domain: uint8 bytes turn into int8 by x ^ 0x80 (= x - 128) as they are staged into shared
// memory, so one s8.s8 instruction serves int8 and uint8 operands; zero points move with them
// (za_s = za - 128). The centered product then follows from
//   sum (a - za)(w - zw) = sum a w - zw[n] * rowsum(a)[m] - za * colsum(w)[n] + K za zw[n]
// with every term in the signed domain. rowsum is needed only when some zw[n] of the block is not
// 0 (uint8 or asymmetric weights), colsum only when za is not 0: both are counted from the mma
// fragments themselves (dp4a) under a block-uniform flag, so symmetric int8 pays nothing. int32
// arithmetic wraps; the centered sum itself fits (|(a-za)(w-zw)| <= 255^2, K <= MAX_INT8_K).
//
// Block: 8 warps as 2 (M) x 4 (N); block tile 128 x 128 x 64 bytes of K, warp tile 64 x 32 =
// 4 x 4 mma tiles, two k32 steps per tile. Both operands are staged K-contiguous
// (As[m][k], Bs[n][k]) in two shared buffers, rows padded to 80 bytes (fragment loads are free of
// bank conflicts); the next tile is loaded into registers while the current one is multiplied.
// Fragment layouts follow the PTX ISA's m16n8k32 figures (.s8: 4 bytes of k per 32-bit register).
// Grid: (ceil(N/128), ceil(M/128), 1); 256 threads.
#pragma once
#include "dtypes.cuh"

#define I8_BM 128
#define I8_BN 128
#define I8_BK 64
#define I8_ROW 80  // padded row pitch of the shared tiles, bytes

__device__ __forceinline__ void mma_s8_16832(int* c, const u32* a, const u32* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ int sum4(u32 x) { return __dp4a((int)x, 0x01010101, 0); }

__device__ __forceinline__ uint4 xor16(uint4 v, u32 mask) {
  v.x ^= mask; v.y ^= mask; v.z ^= mask; v.w ^= mask;
  return v;
}

// 16 bytes from byte_at(0..15) (each a value in 0..255), packed little-endian
template <class F>
__device__ __forceinline__ uint4 bytes16(const F& byte_at) {
  u32 w[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    u32 v = 0;
#pragma unroll
    for (int b = 0; b < 4; ++b) v |= (byte_at(q * 4 + b) & 0xffu) << (8 * b);
    w[q] = v;
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// 16 bytes of a K-contiguous row at k (row points at the row's k = 0): one 16-byte load when the
// whole chunk lies inside K and `vec` (row and k 16-byte aligned), else byte by byte; past K: fill.
__device__ __forceinline__ uint4 row16(const u8* row, i64 k, i64 K, bool vec, u32 fill) {
  if (vec && k + 16 <= K) return *(const uint4*)(row + k);
  return bytes16([&](int i) { return k + i < K ? (u32)row[k + i] : fill; });
}

// the centered-sum corrections of one output element, in the signed domain (wrapping int32)
__device__ __forceinline__ int centered(int acc, int rs, int cs, int za, int zw, int K) {
  return (int)((u32)acc - (u32)zw * (u32)rs - (u32)za * (u32)cs + (u32)K * (u32)za * (u32)zw);
}

// `za`: the activation zero point, `zw(n)`: the weight zero point of column n, both already in the
// signed domain; amask / bmask: 0x80808080 for uint8 operands, else 0.
template <class P, class ZW>
__device__ __forceinline__ void int8_mma_gemm(const P& p, int za, const ZW& zw, u32 amask, u32 bmask) {
  __shared__ __align__(16) u8 As[2][I8_BM][I8_ROW];
  __shared__ __align__(16) u8 Bs[2][I8_BN][I8_ROW];
  __shared__ int any_zw;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int wm = warp / 4, wn = warp % 4, grp = lane / 4, tig = lane % 4;
  const i64 m0 = (i64)blockIdx.y * I8_BM, n0 = (i64)blockIdx.x * I8_BN;
  if (tid == 0) any_zw = 0;
  __syncthreads();
  if (tid < I8_BN && n0 + tid < p.N && zw(n0 + tid) != 0) any_zw = 1;
  __syncthreads();
  const bool need_rs = any_zw != 0, need_cs = za != 0;
  // loader layout: chunk c = tid + i * 256 (i = 0, 1) is row c / 4, bytes (c % 4) * 16 of a tile
  const int lrow = tid / 4, lk = (tid % 4) * 16;
  typename P::Row arow[2];
  i64 bn[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    arow[i] = p.arow(m0 + lrow + i * 64);
    bn[i] = n0 + lrow + i * 64;
  }
  uint4 ra[2], rb[2];
  auto load = [&](i64 k0) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      ra[i] = xor16(p.a16(arow[i], k0 + lk), amask);
      rb[i] = bn[i] < p.N ? xor16(p.b16(bn[i], k0 + lk), bmask) : make_uint4(0, 0, 0, 0);
    }
  };
  auto stage = [&](int buf) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      *(uint4*)&As[buf][lrow + i * 64][lk] = ra[i];
      *(uint4*)&Bs[buf][lrow + i * 64][lk] = rb[i];
    }
  };
  int acc[4][4][4];
  int rs[4][2], cs[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    rs[i][0] = rs[i][1] = cs[i] = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[i][j][r] = 0;
  }
  const i64 tiles = (p.K + I8_BK - 1) / I8_BK;
  if (tiles > 0) {
    load(0);
    stage(0);
  }
  __syncthreads();
  for (i64 t = 0; t < tiles; ++t) {
    const int buf = (int)(t & 1);
    if (t + 1 < tiles) load((t + 1) * I8_BK);
#pragma unroll
    for (int ks = 0; ks < I8_BK; ks += 32) {
      u32 af[4][4], bf[4][2];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = wm * 64 + i * 16 + grp, c = ks + tig * 4;
        af[i][0] = *(const u32*)&As[buf][r][c];
        af[i][1] = *(const u32*)&As[buf][r + 8][c];
        af[i][2] = *(const u32*)&As[buf][r][c + 16];
        af[i][3] = *(const u32*)&As[buf][r + 8][c + 16];
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int n = wn * 32 + j * 8 + grp, c = ks + tig * 4;
        bf[j][0] = *(const u32*)&Bs[buf][n][c];
        bf[j][1] = *(const u32*)&Bs[buf][n][c + 16];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) mma_s8_16832(acc[i][j], af[i], bf[j]);
      if (need_rs) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          rs[i][0] += sum4(af[i][0]) + sum4(af[i][2]);
          rs[i][1] += sum4(af[i][1]) + sum4(af[i][3]);
        }
      }
      if (need_cs) {
#pragma unroll
        for (int j = 0; j < 4; ++j) cs[j] += sum4(bf[j][0]) + sum4(bf[j][1]);
      }
    }
    if (t + 1 < tiles) stage(buf ^ 1);
    __syncthreads();
  }
  // the four lanes of a group (tig) hold parts of the same rows (A) / column (B): sum them
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int s = 1; s <= 2; s <<= 1) {
      rs[i][0] += __shfl_xor_sync(0xffffffffu, rs[i][0], s);
      rs[i][1] += __shfl_xor_sync(0xffffffffu, rs[i][1], s);
      cs[i] += __shfl_xor_sync(0xffffffffu, cs[i], s);
    }
  const int K = (int)p.K;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    // column n = j * 8 + tig * 2 + e of the warp tile: its colsum lives in the lanes of group tig * 2 + e
    const int cs0 = __shfl_sync(0xffffffffu, cs[j], (tig * 2) * 4);
    const int cs1 = __shfl_sync(0xffffffffu, cs[j], (tig * 2 + 1) * 4);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const i64 m = m0 + wm * 64 + i * 16 + grp + (r >= 2 ? 8 : 0);
        const i64 n = n0 + wn * 32 + j * 8 + tig * 2 + (r & 1);
        if (m < p.M && n < p.N)
          p.store(m, n, centered(acc[i][j][r], rs[i][r >> 1], (r & 1) ? cs1 : cs0, za, zw(n), K));
      }
  }
}

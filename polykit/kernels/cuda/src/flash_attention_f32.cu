// fp32 attention on tf32 tensor cores (FlashAttention-2 form, mma.sync m16n8k8 tf32, sm_80+):
//   O[b, h] = softmax(Q[b, h] K[b, h]^T * scale [+ mask]) V[b, h], float storage, fp32 softmax.
// SPLIT3 1 (3xTF32, fp32 accuracy): every operand x = big + small, both tf32 (cvt.rna; small =
// x - big), and a b ~ a_small b_big + a_big b_small + a_big b_big (the dropped a_small b_small
// is below 2^-22 |a b|). SPLIT3 0: one tf32 product (the --tf32 variant). The tensor cores'
// fp32 accumulation truncates, so the products of each 16-deep slice go to a zeroed partial
// that the CUDA cores add to the running scores / outputs with round-to-nearest.
//
// Addressing as flash_attention.cu: Q, K, V, O are [b][h][s][d] through element strides (sb, sh,
// ss), d contiguous ([B, H, S, D] and [B, S, H, D] alike; stride 0 broadcasts; query head h reads
// key/value head h / kv_groups), head size HD
// (64 or 128) for Q, K and V, every row 16-byte aligned; the optional mask [b][h][q][k] through
// strides (mb, mh, mq, mk), kind 1 additive float, 2 bool keep-mask (flash_common.cuh); grid z
// over an outer and an inner batch dim (B1 * B2, outer strides qbo .. mbo) as flash_attention.cu.
//
// Block: 4 warps, 64 query rows (16 a warp). The Q tile, and K/V tiles of BKV keys (double-
// buffered), are staged in shared memory by cp.async, 16-byte chunks XOR-swizzled so that every
// fragment load is a conflict-free 16-byte ld.shared. Operands are split as they are read: Q
// kept in registers across the key loop (split, 2 x HD more) spilled the HD 128 kernel, and the
// cvt asm is volatile so the compiler does not hoist the Q splits out of the key loop (that
// alone took the HD 64 kernel to 255 registers and spills; now 148, HD 128 202 with NVRTC 13.5).
// Fragment orders (an mma's k index may be permuted when A and B agree; output columns too
// when the store agrees):
//  - S = Q K^T, d slice 16p..16p+15: lane (g, t) loads Q[row][16p + 4t ..+3] and K[key][same];
//    k-step 0 takes elements 0, 1 as k = t, t + 4; k-step 1 takes elements 2, 3.
//  - O += P V, keys 8kb..8kb+7: k = t, t + 4 are keys 8kb + 2t, 2t + 1, which are exactly the
//    score accumulators lane (g, t) holds (no shuffles); V rows 8kb + 2t, 2t + 1 are loaded as
//    d 32q + 4g ..+3, element j the B column g of output block 4q + j, so a lane ends holding
//    output d 32q + 8t ..+3 (from column 2t) and 32q + 8t + 4 ..+3 (2t + 1): 16-byte stores.
// Deterministic (fixed order everywhere).
// Launch: grid (ceil(S / 64), H, B), block 128, dynamic shared memory (64 + 4 * BKV) * HD * 4 B.
#include "flash_common.cuh"

#ifndef SPLIT3
#define SPLIT3 1
#endif
#define BQ 64
#define CHUNKS (HD / 4)  // 16-byte chunks per row
#define TILE (BKV * HD * 4)
static_assert(HD % 32 == 0 && BKV % 16 == 0, "head size a multiple of 32, key tile of 16");

// byte offset of chunk c of row r: K tiles flip bit 2 on odd rows (a quarter-warp reads 4
// chunks of 2 rows), V tiles XOR bits 1-2 with (r / 2) % 4 (it reads 2 chunks of 4 rows 2 apart)
__device__ __forceinline__ u32 swz_k(int r, int c) { return (u32)(r * HD * 4 + ((c ^ ((r & 1) << 2)) << 4)); }
__device__ __forceinline__ u32 swz_v(int r, int c) { return (u32)(r * HD * 4 + ((c ^ (((r >> 1) & 3) << 1)) << 4)); }

// rows [row0, row0 + ROWS) of a [.., s, HD] operand -> tile; rows past `rows` are zeros
template <int ROWS, bool V_SWIZZLE>
__device__ __forceinline__ void load_tile(unsigned char* tile, const float* base, i64 ss, int row0, int rows) {
  for (int i = threadIdx.x; i < ROWS * CHUNKS; i += 128) {
    const int r = i / CHUNKS, c = i % CHUNKS;
    const bool ok = row0 + r < rows;
    const float* src = base + (ok ? (i64)(row0 + r) * ss : 0) + c * 4;
    cp16(fa_smem(tile + (V_SWIZZLE ? swz_v(r, c) : swz_k(r, c))), src, ok);
  }
}

__device__ __forceinline__ u32 to_tf32(float x) {
  u32 r;
  asm volatile("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}
// x -> big (x rounded to tf32) and small (the rest rounded to tf32; 0 without SPLIT3)
__device__ __forceinline__ void split(float x, u32& big, u32& small) {
  big = to_tf32(x);
  small = SPLIT3 ? to_tf32(x - __uint_as_float(big)) : 0u;
}
__device__ __forceinline__ void mma_tf32(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// A fragment of one k-step, split: big[4], small[4]
struct FragA {
  u32 big[4], small[4];
  __device__ __forceinline__ void set(int i, float x) { split(x, big[i], small[i]); }
};
// d += a b (the small products first); b0 / b1 the B fragment's fp32 values
__device__ __forceinline__ void mma3(float (&d)[4], const FragA& a, float b0, float b1) {
  u32 bb0, bs0, bb1, bs1;
  split(b0, bb0, bs0);
  split(b1, bb1, bs1);
  if (SPLIT3) {
    mma_tf32(d, a.small, bb0, bb1);
    mma_tf32(d, a.big, bs0, bs1);
  }
  mma_tf32(d, a.big, bb0, bb1);
}
__device__ __forceinline__ float at(const float4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

extern "C" __global__ void __launch_bounds__(128) flash_attention_f32(
    const float* __restrict__ Q, const float* __restrict__ K, const float* __restrict__ V, float* __restrict__ O,
    const void* __restrict__ mask, int S, int Skv, i64 qb, i64 qh, i64 qs, i64 kb, i64 kh, i64 ks, i64 vb, i64 vh,
    i64 vs, i64 ob, i64 oh, i64 os, i64 mb, i64 mh, i64 mq, i64 mk, float scale, int mask_kind, int nan_to_zero,
    int kv_groups, int causal_off, int B2, i64 qbo, i64 kbo, i64 vbo, i64 obo, i64 mbo) {
  extern __shared__ __align__(128) unsigned char fa_sm[];
  unsigned char* sQ = fa_sm;
  unsigned char* sK = sQ + BQ * HD * 4;  // 2 buffers
  unsigned char* sV = sK + 2 * TILE;  // 2 buffers
  // grid z runs over an outer batch dim (B1) and an inner one (B2), each with its own strides
  const int zo = blockIdx.z / B2, b = blockIdx.z % B2, h = blockIdx.y, q0 = blockIdx.x * BQ;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  const int hkv = h / kv_groups;
  const float* k = K + b * kb + zo * kbo + hkv * kh;
  const float* v = V + b * vb + zo * vbo + hkv * vh;
  const int tiles = flash_key_tiles((Skv + BKV - 1) / BKV, BKV, q0, BQ, S, causal_off);
  const int row_a = q0 + warp * 16 + g;  // this thread's two query rows: row_a, row_a + 8

  load_tile<BQ, false>(sQ, Q + b * qb + zo * qbo + h * qh, qs, q0, S);
  if (tiles > 0) {
    load_tile<BKV, false>(sK, k, ks, 0, Skv);
    load_tile<BKV, true>(sV, v, vs, 0, Skv);
  }
  cp_commit();

  float o[HD / 8][4];
  flash_zero(o);
  FlashRows rows;
  rows.init();
  const FlashMask fmask = {mask, b * mb + zo * mbo + h * mh, mq, mk, mask_kind};

  for (int t = 0; t < tiles; ++t) {
    const int buf = t & 1;
    if (t + 1 < tiles) {  // prefetch the next K/V tile into the other buffer
      load_tile<BKV, false>(sK + (buf ^ 1) * TILE, k, ks, (t + 1) * BKV, Skv);
      load_tile<BKV, true>(sV + (buf ^ 1) * TILE, v, vs, (t + 1) * BKV, Skv);
    }
    cp_commit();
    cp_wait<1>();
    __syncthreads();
    const unsigned char* tK = sK + buf * TILE;
    const unsigned char* tV = sV + buf * TILE;

    // S = Q K^T for BKV keys: s[nb][4], n-block nb = keys 8 nb .. 8 nb + 7
    float s[BKV / 8][4];
#pragma unroll
    for (int nb = 0; nb < BKV / 8; ++nb) s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.f;
#pragma unroll
    for (int p = 0; p < HD / 16; ++p) {
      // Q rows g, g + 8 of the warp: k-steps 2p (elements 0, 1) and 2p + 1 (elements 2, 3)
      const float4 x = *(const float4*)(sQ + swz_k(warp * 16 + g, 4 * p + t4));
      const float4 y = *(const float4*)(sQ + swz_k(warp * 16 + g + 8, 4 * p + t4));
      FragA a0, a1;
      a0.set(0, x.x); a0.set(1, y.x); a0.set(2, x.y); a0.set(3, y.y);
      a1.set(0, x.z); a1.set(1, y.z); a1.set(2, x.w); a1.set(3, y.w);
#pragma unroll
      for (int nb = 0; nb < BKV / 8; ++nb) {
        const float4 kv = *(const float4*)(tK + swz_k(nb * 8 + g, 4 * p + t4));
        float part[4] = {0.f, 0.f, 0.f, 0.f};
        mma3(part, a0, kv.x, kv.y);
        mma3(part, a1, kv.z, kv.w);
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nb][e] += part[e];
      }
    }

    // scale, mask, bounds; online softmax; o rescaled (flash_common.cuh)
    flash_softmax_tile<float, true>(s, o, rows, t * BKV, Skv, row_a, S, fmask, scale, t4);

    // O += P V, 16 keys (two k-steps) a partial: P from the score accumulators as A fragments
#pragma unroll
    for (int kp = 0; kp < BKV / 16; ++kp) {
      FragA pa[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const float* x = s[2 * kp + i];  // keys 2t, 2t + 1 of rows a and b: k = t, t + 4
        pa[i].set(0, x[0]); pa[i].set(1, x[2]); pa[i].set(2, x[1]); pa[i].set(3, x[3]);
      }
#pragma unroll
      for (int q = 0; q < HD / 32; ++q) {
        float4 vv[2][2];  // [k-step][key 2t, 2t + 1]: d 32q + 4g ..+3
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int e = 0; e < 2; ++e) vv[i][e] = *(const float4*)(tV + swz_v((2 * kp + i) * 8 + 2 * t4 + e, 8 * q + g));
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          float part[4] = {0.f, 0.f, 0.f, 0.f};
          mma3(part, pa[0], at(vv[0][0], j), at(vv[0][1], j));
          mma3(part, pa[1], at(vv[1][0], j), at(vv[1][1], j));
#pragma unroll
          for (int e = 0; e < 4; ++e) o[4 * q + j][e] += part[e];
        }
      }
    }
    __syncthreads();  // this buffer is refilled by the next iteration's prefetch
  }

  // normalize and store rows row_a, row_a + 8, 16 bytes at d 32q + 8t and + 4; undefined -> NaN (or 0)
  const FlashOut fo = flash_finish(rows, nan_to_zero);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (row_a + 8 * i >= S) continue;
    float* dst = O + b * ob + zo * obo + h * oh + (i64)(row_a + 8 * i) * os + 8 * t4;
#pragma unroll
    for (int q = 0; q < HD / 32; ++q)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int c = 2 * i + e;
        *(float4*)(dst + 32 * q + 4 * e) =
            make_float4(fo.out(i, o[4 * q][c]), fo.out(i, o[4 * q + 1][c]), fo.out(i, o[4 * q + 2][c]),
                        fo.out(i, o[4 * q + 3][c]));
      }
  }
}

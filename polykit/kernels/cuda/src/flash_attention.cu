// Attention on tensor cores (FlashAttention-2 form, mma.sync m16n8k16, sm_80+):
//   O[b, h] = softmax(Q[b, h] K[b, h]^T * scale [+ mask]) V[b, h]
// ELEM = half_t | bf16_t storage, fp32 scores, softmax statistics and accumulators.
//
// Q, K, V, O are addressed as [b][h][s][d] through element strides (sb, sh, ss) per tensor, d
// contiguous: [B, H, S, D] and [B, S, H, D] (heads not yet transposed) are both direct reads, and
// so are strided views of a packed projection (the pointer at the view's first element, a row
// stride of 3 H D); stride 0 broadcasts. Grouped-query heads: query head h reads key/value head
// h / kv_groups (kv_groups 1: the same head; H / Hkv when K and V hold Hkv heads). Head size HD (a multiple of 32 up to 256, a define) for Q, K and V. Any S and
// Skv: rows past them load as zeros, keys past Skv are masked off, rows past S are not stored. The mask (optional)
// is [b][h][q][k] through strides (mb, mh, mq, mk): mask_kind 1 additive (ELEM, added to the
// scaled scores), 2 bool keep-mask (0 -> -inf). A row whose softmax is undefined (every score
// -inf, or a NaN score) gives NaN, or 0 with nan_to_zero (the unfused graph's Where(IsNaN)).
//
// Block: 4 warps, BQ = 64 ROWS query rows; warp w owns ROWS m-tiles of 16 rows (ROWS a define, 1 or
// 2: rows 16 (w ROWS + m) .. + 15 for m-tile m), so every K and V fragment one ldmatrix brings from
// shared memory feeds ROWS m-tiles' MMAs. K/V tiles of BKV keys (a define: 64, 32 for heads over 128,
// so shared memory stays under 99 KiB and the scores' registers shrink; 128 for heads up to 64)
// double-buffered in shared memory by cp.async, 16-byte chunks XOR-swizzled by row (ldmatrix
// without bank conflicts). Per key tile: S = Q K^T (mma, Q fragments held in registers), online
// softmax per row (the 4 threads of a row combine through shuffles in a fixed order), O += P V
// (P re-packed from the score accumulators as the A operand). Deterministic.
// Rank-5 attention ([B1, B2, H, S, D], e.g. windows of a batch with a per-window mask that
// broadcasts over B1): grid z = B1 * B2, and every tensor (mask included) adds zo * (its outer
// stride) for zo = z / B2 to b * (its batch stride) for b = z % B2 (B2 = B and outer strides 0
// for rank <= 4).
// FLASH_Q8 1 (ai.polykit AttentionQuantize): O is float8_e4m3fn (flash_common.cuh's FlashStoreE4m3).
// Launch: grid (ceil(S / BQ), H, B1 * B2), block 128, dynamic shared memory (BQ + 4 * BKV) * HD * 2 B.
#ifndef ROWS
#define ROWS 1
#endif
#define BQ (64 * ROWS)
#ifndef BKV
#define BKV 64
#endif
// the mask pass's rows one at a time where two m-tiles or 128-key tiles fill the registers (flash_common.cuh)
#define FLASH_MASK_ROW_UNROLL (ROWS == 2 || BKV == 128 ? 1 : 2)
#include "flash_common.cuh"
#define CHUNKS (HD / 8)  // 16-byte chunks per row
template <class T> struct MmaName;
template <> struct MmaName<half_t> {
  __device__ static __forceinline__ void mma(float* c, const u32* a, const u32* b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
  __device__ static __forceinline__ u32 pack(float lo, float hi) {
    return (u32)f2h(lo).x | ((u32)f2h(hi).x << 16);
  }
};
template <> struct MmaName<bf16_t> {
  __device__ static __forceinline__ void mma(float* c, const u32* a, const u32* b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
  __device__ static __forceinline__ u32 pack(float lo, float hi) {
    return (u32)f2b(lo).x | ((u32)f2b(hi).x << 16);
  }
};
typedef MmaName<ELEM> Mma;

// byte offset of 16-byte chunk c of row r in a tile of HD-wide rows, XOR-swizzled so that chunk c of 8
// consecutive rows (one ldmatrix 8x8) lies in 8 distinct 16-byte bank groups: on the low 3 bits of c
// when a row is whole 128-byte lines (8k chunks); else (8k + 4 chunks: HD 32, 96, ..., rows
// alternate between line halves) on c's low 2 bits by the row pair
static_assert(HD % 32 == 0 && HD <= 256 && (BKV == 32 || BKV == 64 || (BKV == 128 && HD <= 64)),
              "head size 32..256, key tiles of 32 or 64 (128 up to head size 64)");
static_assert(ROWS == 1 || ROWS == 2, "one or two m-tiles a warp");
__device__ __forceinline__ u32 swz(int r, int c) {
#if CHUNKS % 8 == 0
  return (u32)(r * HD * 2 + ((c ^ (r & 7)) << 4));
#else
  return (u32)(r * HD * 2 + ((c ^ ((r >> 1) & 3)) << 4));
#endif
}

__device__ __forceinline__ void ldsm_x4(u32* r, u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(u32* r, u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
// rows [row0, row0 + N) of a [.., s, HD] operand -> swizzled tile; rows past `rows` are zeros
// (a fixed trip count, unrolled: the chunk's row and column divide by a constant once per tile)
template <int N>
__device__ __forceinline__ void load_tile(unsigned char* tile, const ELEM* base, i64 ss, int row0, int rows) {
  constexpr int TOTAL = N * CHUNKS, STEPS = (TOTAL + 127) / 128;
#pragma unroll
  for (int j = 0; j < STEPS; ++j) {
    const int i = threadIdx.x + 128 * j;
    if (TOTAL % 128 != 0 && i >= TOTAL) break;
    const int r = i / CHUNKS, c = i % CHUNKS;
    const bool ok = row0 + r < rows;
    const ELEM* src = base + (ok ? (i64)(row0 + r) * ss : 0) + c * 8;
    cp16(fa_smem(tile + swz(r, c)), src, ok);
  }
}

// the kernel's parameters and their names (the host emulation's launch, tests/kernels/cuda/block_emulation.py)
#define FA_PARAMS                                                                                                 \
  const ELEM *__restrict__ Q, const ELEM *__restrict__ K, const ELEM *__restrict__ V, FA_OUT *__restrict__ O,     \
      const void *__restrict__ mask, int S, int Skv, i64 qb, i64 qh, i64 qs, i64 kb, i64 kh, i64 ks, i64 vb,      \
      i64 vh, i64 vs, i64 ob, i64 oh, i64 os, i64 mb, i64 mh, i64 mq, i64 mk, float scale, int mask_kind,         \
      int nan_to_zero, int kv_groups, int causal_off, int B2, i64 qbo, i64 kbo, i64 vbo, i64 obo, i64 mbo FA_Q8_PARAMS
#define FA_ARGS                                                                                                  \
  Q, K, V, O, mask, S, Skv, qb, qh, qs, kb, kh, ks, vb, vh, vs, ob, oh, os, mb, mh, mq, mk, scale, mask_kind,      \
      nan_to_zero, kv_groups, causal_off, B2, qbo, kbo, vbo, obo, mbo FA_Q8_ARGS

extern "C" __global__ void __launch_bounds__(128) flash_attention(FA_PARAMS) {
  extern __shared__ __align__(128) unsigned char fa_sm[];
  unsigned char* sQ = fa_sm;
  unsigned char* sK = sQ + BQ * HD * 2;   // 2 buffers
  unsigned char* sV = sK + 2 * BKV * HD * 2;  // 2 buffers
  // grid z runs over an outer batch dim (B1) and an inner one (B2), each with its own strides
  const int zo = blockIdx.z / B2, b = blockIdx.z % B2, h = blockIdx.y, q0 = blockIdx.x * BQ;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  const ELEM* q = Q + b * qb + zo * qbo + h * qh;
  const int hkv = h / kv_groups;
  const ELEM* k = K + b * kb + zo * kbo + hkv * kh;
  const ELEM* v = V + b * vb + zo * vbo + hkv * vh;
  const int tiles = flash_key_tiles((Skv + BKV - 1) / BKV, BKV, q0, BQ, S, causal_off);

  load_tile<BQ>(sQ, q, qs, q0, S);
  cp_commit();
  if (tiles > 0) {
    load_tile<BKV>(sK, k, ks, 0, Skv);
    load_tile<BKV>(sV, v, vs, 0, Skv);
  }
  cp_commit();
  cp_wait<1>();
  __syncthreads();

  // Q fragments of this warp's m-tiles, all of HD: qf[m][kstep][4]
  u32 qf[ROWS][HD / 16][4];
#pragma unroll
  for (int m = 0; m < ROWS; ++m)
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      const int r = (warp * ROWS + m) * 16 + (lane % 16), c = kk * 2 + lane / 16;
      ldsm_x4(qf[m][kk], fa_smem(sQ + swz(r, c)));
    }

  float o[ROWS][HD / 8][4];
  FlashRows rows[ROWS];
#pragma unroll
  for (int m = 0; m < ROWS; ++m) {
    flash_zero(o[m]);
    rows[m].init();
  }
  const FlashMask fmask = {mask, b * mb + zo * mbo + h * mh, mq, mk, mask_kind};
  // this thread's query rows: row_a + 16 m and row_a + 16 m + 8 of m-tile m
  const int row_a = q0 + warp * ROWS * 16 + g;

  for (int t = 0; t < tiles; ++t) {
    const int buf = t & 1;
    if (t + 1 < tiles) {  // prefetch the next K/V tile into the other buffer
      load_tile<BKV>(sK + (buf ^ 1) * BKV * HD * 2, k, ks, (t + 1) * BKV, Skv);
      load_tile<BKV>(sV + (buf ^ 1) * BKV * HD * 2, v, vs, (t + 1) * BKV, Skv);
    }
    cp_commit();
    cp_wait<1>();
    __syncthreads();
    const unsigned char* tK = sK + buf * BKV * HD * 2;
    const unsigned char* tV = sV + buf * BKV * HD * 2;

    // S = Q K^T for BKV keys: s[m][nb][4], n-block nb = keys 8*nb .. 8*nb+7
    float s[ROWS][BKV / 8][4];
#pragma unroll
    for (int m = 0; m < ROWS; ++m)
#pragma unroll
      for (int nb = 0; nb < BKV / 8; ++nb) s[m][nb][0] = s[m][nb][1] = s[m][nb][2] = s[m][nb][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk)
#pragma unroll
      for (int np = 0; np < BKV / 16; ++np) {  // two n-blocks per ldmatrix.x4, for every m-tile
        u32 bf[4];
        const int r = np * 16 + (lane % 8) + (lane / 16) * 8, c = kk * 2 + (lane / 8) % 2;
        ldsm_x4(bf, fa_smem(tK + swz(r, c)));
#pragma unroll
        for (int m = 0; m < ROWS; ++m) {
          Mma::mma(s[m][2 * np], qf[m][kk], bf);
          Mma::mma(s[m][2 * np + 1], qf[m][kk], bf + 2);
        }
      }

    // scale, mask, bounds; online softmax; o rescaled (flash_common.cuh)
#pragma unroll
    for (int m = 0; m < ROWS; ++m)
      flash_softmax_tile<ELEM, false>(s[m], o[m], rows[m], t * BKV, Skv, row_a + 16 * m, S, fmask, scale, t4);

    // O += P V: P (16 x BKV keys a m-tile) as A fragments, V tile (BKV keys x HD) through ldmatrix.trans
#pragma unroll
    for (int kk = 0; kk < BKV / 16; ++kk) {
      u32 pa[ROWS][4];
#pragma unroll
      for (int m = 0; m < ROWS; ++m) {
        pa[m][0] = Mma::pack(s[m][2 * kk][0], s[m][2 * kk][1]);
        pa[m][1] = Mma::pack(s[m][2 * kk][2], s[m][2 * kk][3]);
        pa[m][2] = Mma::pack(s[m][2 * kk + 1][0], s[m][2 * kk + 1][1]);
        pa[m][3] = Mma::pack(s[m][2 * kk + 1][2], s[m][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < HD / 16; ++dp) {  // two d-blocks per ldmatrix.x4.trans, for every m-tile
        u32 bf[4];
        const int r = kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8, c = dp * 2 + lane / 16;
        ldsm_x4_t(bf, fa_smem(tV + swz(r, c)));
#pragma unroll
        for (int m = 0; m < ROWS; ++m) {
          Mma::mma(o[m][2 * dp], pa[m], bf);
          Mma::mma(o[m][2 * dp + 1], pa[m], bf + 2);
        }
      }
    }
    __syncthreads();  // this buffer is refilled by the next iteration's prefetch
  }

  // normalize and store rows row_a + 16 m, row_a + 16 m + 8; undefined rows -> NaN (or 0)
#if FLASH_Q8
  const FlashStoreE4m3 store = {e4m3_quantizer(y_scale[0]), 0.f};
#pragma unroll
  for (int m = 0; m < ROWS; ++m)
    flash_store_pairs(O + b * ob + zo * obo + h * oh, os, rows[m], o[m], row_a + 16 * m, S, t4, nan_to_zero, store);
#else
#pragma unroll
  for (int m = 0; m < ROWS; ++m)
    flash_store_pairs(O + b * ob + zo * obo + h * oh, os, rows[m], o[m], row_a + 16 * m, S, t4, nan_to_zero);
#endif
}

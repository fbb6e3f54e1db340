// Shared by the flash attention kernels (flash_attention.cu: fp16/bf16 on m16n8k16;
// flash_attention_f32.cu: fp32 on m16n8k8 tf32): 16-byte cp.async staging and FlashAttention-2's
// online softmax over one key tile.
//
// Score and output fragments have the m16n8 accumulator layout of both mma shapes: lane
// (g = lane / 4, t4 = lane % 4) of a warp holds rows g ("row a") and g + 8 ("row b") of the
// warp's 16 query rows and columns 2 t4, 2 t4 + 1 of each 8-wide block: x[j][0..1] row a,
// x[j][2..3] row b. The four lanes of a row combine through shuffles in a fixed order.
#pragma once
#include "dtypes.cuh"

__device__ __forceinline__ u32 fa_smem(const void* p) { return (u32)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void cp16(u32 dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

__device__ __forceinline__ float fa_neg_inf() { return -__int_as_float(0x7f800000); }

// The optional mask, [b][h][q][k] through element strides: kind 1 additive (type M, added to
// the scaled scores), 2 bool keep-mask (0 -> -inf); `base` is b * mb + h * mh.
struct FlashMask {
  const void* ptr;
  i64 base, mq, mk;
  int kind;
};

// Key tiles a block of query rows [q0, q0 + BQ) needs (of `tiles` of bkv keys): all of them, unless
// the layer's mask is known to mask every key k > q + causal_off (the `mask_causal` hint the compiler
// sets where the mask is a causal one, alone or and-ed with others: polykit.compiler.passes.
// mark_causal_masks); then the tiles past the block's last row's diagonal are skipped, and their
// keys, all -inf, would only have added zeros. FLASH_NO_CAUSAL: no hint.
#define FLASH_NO_CAUSAL (1 << 30)
__device__ __forceinline__ int flash_key_tiles(int tiles, int bkv, int q0, int bq, int S, int causal_off) {
  if (causal_off >= FLASH_NO_CAUSAL) return tiles;
  const int last_row = (q0 + bq < S ? q0 + bq : S) - 1;
  const long long keys = (long long)last_row + causal_off + 1;  // keys 0 .. last_row + causal_off
  if (keys <= 0) return 0;
  const long long need = (keys + bkv - 1) / bkv;
  return need < tiles ? (int)need : tiles;
}

// Running softmax statistics of a thread's two rows: m the running maximum of the scores in the
// exponent's units (log2 units for exp2f, natural for expf: flash_scores_tile), l the running sum of
// probabilities. A row whose softmax is undefined (every score -inf, or a NaN / +inf score) is
// `undefined()`: the caller writes NaN, or 0 with nan_probs_to_zero (the unfused graph's Where(IsNaN)).
// A NaN or +inf score needs no test of its own: its probability exp(x - m) is NaN (NaN - m, or
// inf - inf), so l becomes NaN and stays NaN (NaN * corr + psum).
struct FlashRows {
  float m[2], l[2];
  __device__ __forceinline__ void init() {
    m[0] = m[1] = fa_neg_inf();
    l[0] = l[1] = 0.f;
  }
  __device__ __forceinline__ bool undefined(int i) const { return l[i] != l[i] || m[i] == fa_neg_inf(); }
};

// How a thread's two rows turn accumulators into outputs (FlashRows::finish, once a thread): acc / l as
// acc * (1 / l) (one IEEE division a row, not one an element), or `fill` for an undefined row (NaN, or 0
// with nan_to_zero) by a select. A defined row's l is at least 1 (the row maximum's own exp(0), only ever
// rescaled by exp(0) after), and an undefined row divides 1 by 1: the division never takes its slow path
// (the subroutine call whose branch would split a warp), and no output element branches.
struct FlashOut {
  float inv[2], fill;
  bool undef[2];
  __device__ __forceinline__ float out(int i, float acc) const { return undef[i] ? fill : acc * inv[i]; }
};
__device__ __forceinline__ FlashOut flash_finish(const FlashRows& r, int nan_to_zero) {
  FlashOut f;
  f.fill = nan_to_zero ? 0.f : __int_as_float(0x7fffffff);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    f.undef[i] = r.undefined(i);
    f.inv[i] = 1.f / (f.undef[i] ? 1.f : r.l[i]);
  }
  return f;
}

// zeroed output accumulators
template <int NO>
__device__ __forceinline__ void flash_zero(float (&o)[NO][4]) {
#pragma unroll
  for (int j = 0; j < NO; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
}

// how flash_store_pairs puts an output value into element k of a column pair: a 16-bit output stores it as
// itself (FLASH_Q8 passes FlashStoreE4m3)
struct FlashStoreAsIs {
  template <class T> __device__ __forceinline__ void operator()(T* pair, int k, float v) const { st(pair, k, v); }
};

// FLASH_Q8 1 (ai.polykit AttentionQuantize, flash_attention.cu and flash_attention_sm90.cu): O is float8_e4m3fn,
// each output the saturating round-to-nearest-even e4m3 of (the ELEM value the 16-bit kernel stores) / y_scale[0]
// (QuantizeLinear of that output: e4m3_quantize.cuh, the IEEE quotient without a division, a pair a conversion),
// two bytes a store; y_scale is the kernel's last parameter (FA_Q8_PARAMS)
#ifndef FLASH_Q8
#define FLASH_Q8 0
#endif
#if FLASH_Q8
#include "e4m3_quantize.cuh"
#define FA_OUT u8
#define FA_Q8_PARAMS , const float* __restrict__ y_scale
#define FA_Q8_ARGS , y_scale
struct FlashStoreE4m3 {
  E4m3Quantizer quant;
  float held;  // a pair's element 0 (as ELEM stores it), converted with element 1 when that arrives
  __device__ __forceinline__ void operator()(u8* pair, int k, float v) {
    ELEM e[1];  // the value as the 16-bit kernel stores it
    st(e, 0, v);
    if (k == 0) {
      held = ld(e, 0);
      return;
    }
    const unsigned short b = quant.pair(held, ld(e, 0));
    pair[0] = (u8)b;
    pair[1] = (u8)(b >> 8);
  }
};
#else
#define FA_OUT ELEM
#define FA_Q8_PARAMS
#define FA_Q8_ARGS
#endif

// A 16-bit output's rows row_a, row_a + 8 (those < S; `head` is the (b, h) slice, rows os apart):
// acc / l, or NaN (0 with nan_to_zero) for undefined rows (flash_finish), as column pairs 2 t4, 2 t4 + 1
// of every 8-wide block (one 4-byte store each; 2-byte for an e4m3 output)
template <class T, int NO, class Store = FlashStoreAsIs>
__device__ __forceinline__ void flash_store_pairs(T* head, i64 os, const FlashRows& rows, const float (&o)[NO][4],
                                                  int row_a, int S, int t4, int nan_to_zero, Store store = Store()) {
  struct __align__(2 * sizeof(T)) Pair { T v[2]; };
  const FlashOut fo = flash_finish(rows, nan_to_zero);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (row_a + 8 * i >= S) continue;
    T* dst = head + (i64)(row_a + 8 * i) * os + 2 * t4;
#pragma unroll
    for (int j = 0; j < NO; ++j) {
      Pair pair;
      store(pair.v, 0, fo.out(i, o[j][2 * i]));
      store(pair.v, 1, fo.out(i, o[j][2 * i + 1]));
      *(Pair*)(dst + j * 8) = pair;
    }
  }
}

// FLASH_MASK_ROW_UNROLL: the mask pass takes a thread's two rows together (2: all of a tile's mask loads in
// flight at once) or one after the other (1: half of them). flash_attention.cu sets 1 for two m-tiles a
// warp and 128-key tiles, whose scores and accumulators leave no room for the rest (there 2 spills or
// drops to 2 blocks an SM).
// FLASH_MASKED 0: the kernel of a layer without a mask (polykit.kernels.cuda.attention.flash_attention.
// mask_defines): the mask pass is compiled out, and with it the registers its addresses and loads hold
// (flash_sm90 at head 128: 138 instead of 210, two blocks an SM instead of one; the ping-pong consumers'
// 32-byte spill goes too). A masked layer's kernel keeps it (mask_kind 0 still skips it at run time).
#ifndef FLASH_MASKED
#define FLASH_MASKED 1
#endif
#ifndef FLASH_MASK_ROW_UNROLL
#define FLASH_MASK_ROW_UNROLL 2
#endif

// one mask element's effect on its score: kind 1 adds value * unit, kind 2 (u8) sets -inf where 0
template <class M>
__device__ __forceinline__ void flash_mask_apply(float& s, M v, float unit) { s += (float)ld(&v, 0) * unit; }
__device__ __forceinline__ void flash_mask_apply(float& s, u8 keep, float) { s = keep ? s : fa_neg_inf(); }

// The mask's values of one key tile added to (kind 1, times `unit`) or applied to (kind 2: 0 -> -inf) the
// scores s (flash_scores_tile). A lane's keys come in adjacent pairs (2 t4, 2 t4 + 1 of each 8-block):
// where the mask is contiguous along keys (mk == 1) and every row's pairs are aligned to two elements
// (an even row stride and an aligned first element: the same for all of the block's rows), one load
// brings both values (4 bytes of a 16-bit mask, 2 of a bool one); other masks (key strides, odd row
// strides: Swin's 49 keys) take one element at a time. The choice is uniform across the block, and
// nothing inside either path branches per lane: rows past S read row S - 1's mask (their scores are
// never stored), and keys past Skv are single predicated loads (the pair that crosses Skv loads its first
// element alone). Keep them so: ptxas turns `if (key < Skv) v = load` into a predicated load, but
// `if (..) v = load; else if (..) v = load` into branches, and per-lane branches here made every 8-key
// block a divergent region whose loads the warp waited for one block at a time (issue 30).
template <class E, int NB>
__device__ __forceinline__ void flash_mask_pass(float (&s)[NB][4], const FlashMask& mask, int kbase, int Skv,
                                                int row_a, int S, float unit, int t4) {
  struct __align__(2 * sizeof(E)) P2 { E v[2]; };
  const bool pairs = mask.mk == 1 && (mask.mq & 1) == 0 &&
                     (((u64)mask.ptr + (u64)mask.base * sizeof(E)) & (2 * sizeof(E) - 1)) == 0;
#if FLASH_MASK_ROW_UNROLL == 1
#pragma unroll 1
#else
#pragma unroll
#endif
  for (int i = 0; i < 2; ++i) {  // rows row_a, row_a + 8: elements e = 2 i, 2 i + 1
    const int row = row_a + 8 * i < S ? row_a + 8 * i : S - 1;
    const E* rp = (const E*)mask.ptr + mask.base + (i64)row * mask.mq;
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
      const int key = kbase + nb * 8 + 2 * t4;  // even: kbase and nb * 8 are multiples of 8
      const bool in0 = key < Skv, in1 = key + 1 < Skv;
      E e0 = {}, e1 = {};
      if (pairs) {
        P2 pr = {};
        if (in1) pr = *(const P2*)(rp + key);
        const E first = in0 && !in1 ? rp[key] : E{};
        e0 = in1 ? pr.v[0] : first;
        e1 = pr.v[1];
      } else {
        if (in0) e0 = rp[(i64)key * mask.mk];
        if (in1) e1 = rp[(i64)(key + 1) * mask.mk];
      }
#if FLASH_MASK_ROW_UNROLL == 1
#pragma unroll
      for (int r = 0; r < 2; ++r) {  // row i's scores s[nb][2 i], s[nb][2 i + 1] by selects (i is a loop counter)
        float x0 = s[nb][2 * r], x1 = s[nb][2 * r + 1];
        flash_mask_apply(x0, e0, unit);
        flash_mask_apply(x1, e1, unit);
        s[nb][2 * r] = i == r ? x0 : s[nb][2 * r];
        s[nb][2 * r + 1] = i == r ? x1 : s[nb][2 * r + 1];
      }
#else
      flash_mask_apply(s[nb][2 * i], e0, unit);
      flash_mask_apply(s[nb][2 * i + 1], e1, unit);
#endif
    }
  }
}

// flash_mask_pass of the layer's mask kind (uniform across the block)
template <class M, int NB>
__device__ __forceinline__ void flash_mask_tile(float (&s)[NB][4], const FlashMask& mask, int kbase, int Skv,
                                                int row_a, int S, float unit, int t4) {
  if (mask.kind == 1)
    flash_mask_pass<M>(s, mask, kbase, Skv, row_a, S, unit, t4);
  else
    flash_mask_pass<u8>(s, mask, kbase, Skv, row_a, S, unit, t4);
}

// One key tile (keys kbase + 8 nb + 2 t4 + (e & 1)): scores s -> scaled, masked, keys past Skv
// -> -inf; the running max and sum of each row advance, s becomes the tile's unnormalized
// probabilities and corr the factor by which each row's output accumulators must be rescaled
// (flash_rescale; apart so that a caller can do it once a product still reading them is done).
// EXACT: expf of natural-unit differences (fp32 accuracy); else the scores are kept in log2 units
// (scale * log2e folded into the one multiply) and exp2f takes their differences (enough for
// half outputs; FlashAttention-2's form).
// The common case costs a multiply, a max, a subtract, an exponential and an add a score: the mask
// and the key bound are separate passes taken only when there is a mask / on the tile that crosses
// Skv (both uniform across the block), and each row's max and sum run on four / two partial chains
// (short dependencies between the two MMAs) before the quad's shuffles.
template <class M, bool EXACT, int NB>
__device__ __forceinline__ void flash_scores_tile(float (&s)[NB][4], float (&corr)[2], FlashRows& r, int kbase,
                                                  int Skv, int row_a, int S, const FlashMask& mask, float scale,
                                                  int t4) {
  const float NEG_INF = fa_neg_inf();
  const float unit = EXACT ? 1.f : 1.4426950408889634f;  // log2e: exp(x) = exp2(x log2e)
  const float su = scale * unit;
#pragma unroll
  for (int nb = 0; nb < NB; ++nb)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nb][e] *= su;
#if FLASH_MASKED
  if (mask.kind != 0) flash_mask_tile<M>(s, mask, kbase, Skv, row_a, S, unit, t4);
#endif
  if (kbase + NB * 8 > Skv) {  // the tile that crosses Skv
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (kbase + nb * 8 + 2 * t4 + (e & 1) >= Skv) s[nb][e] = NEG_INF;
  }
  // row i's scores are s[nb][2 i], s[nb][2 i + 1]: four partial maxima a row (fmaxf skips NaN)
  float part[2][4];
#pragma unroll
  for (int i = 0; i < 2; ++i) part[i][0] = part[i][1] = part[i][2] = part[i][3] = NEG_INF;
#pragma unroll
  for (int nb = 0; nb < NB; ++nb)
#pragma unroll
    for (int e = 0; e < 4; ++e) part[e >> 1][(nb & 1) * 2 + (e & 1)] = fmaxf(part[e >> 1][(nb & 1) * 2 + (e & 1)], s[nb][e]);
  float base[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float tmax = fmaxf(fmaxf(part[i][0], part[i][1]), fmaxf(part[i][2], part[i][3]));
    tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
    tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 2));
    const float m_new = fmaxf(r.m[i], tmax);
    // rows still all -inf keep a unit correction and (base 0) zero probabilities; exp2f(0) = 1 through a
    // select of the argument (no branch around the exponential); expf keeps its branch, which only a row
    // that is all -inf so far takes (a select costs the fp32 kernel ~37 registers: 3 -> 2 blocks an SM)
    const float dm = m_new == NEG_INF ? 0.f : r.m[i] - m_new;
    corr[i] = EXACT ? (m_new == NEG_INF ? 1.f : expf(dm)) : exp2f(dm);
    r.m[i] = m_new;
    base[i] = m_new == NEG_INF ? 0.f : m_new;
  }
  float psum[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
#pragma unroll
  for (int nb = 0; nb < NB; ++nb)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float d = s[nb][e] - base[e >> 1];
      const float p = EXACT ? expf(d) : exp2f(d);
      s[nb][e] = p;
      psum[e >> 1][nb & 1] += p;
    }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float sum = psum[i][0] + psum[i][1];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    r.l[i] = r.l[i] * corr[i] + sum;
  }
}

// the output accumulators of a thread's rows a and b times corr[0] and corr[1]
template <int NO>
__device__ __forceinline__ void flash_rescale(float (&o)[NO][4], const float (&corr)[2]) {
#pragma unroll
  for (int j = 0; j < NO; ++j) {
    o[j][0] *= corr[0]; o[j][1] *= corr[0];
    o[j][2] *= corr[1]; o[j][3] *= corr[1];
  }
}

// flash_scores_tile, then the output accumulators o rescaled at once
template <class M, bool EXACT, int NB, int NO>
__device__ __forceinline__ void flash_softmax_tile(float (&s)[NB][4], float (&o)[NO][4], FlashRows& r, int kbase,
                                                   int Skv, int row_a, int S, const FlashMask& mask, float scale,
                                                   int t4) {
  float corr[2];
  flash_scores_tile<M, EXACT>(s, corr, r, kbase, Skv, row_a, S, mask, scale, t4);
  flash_rescale(o, corr);
}

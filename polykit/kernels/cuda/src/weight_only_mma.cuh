// weight_only_mma.cu's and weight_only_mma_staged.cu's dequantization of 4-bit weight codes to 16-bit mma
// operands with packed math (host-emulated alone by tests/kernels/cuda/test_weight_only_mma_emulated.py), and
// below it the pieces both kernels share: the mma, a chunk's load, X's 16 bytes, a slice's mma steps.
//
// A 32-bit word of a packed row holds 8 codes c0..c7 (c0 in the low nibble). WqDequant turns it into
// four 32-bit pairs of ELEM: (c0, c4), (c1, c5), (c2, c6), (c3, c7) (the low half first), each
// w = ELEM((value - zero point) * scale), DequantizeLinear's value bit for bit:
// - the magic number: (MAGIC | nibble) read as ELEM is BASE + nibble exactly (float16: 0x6400 = 1024,
//   bfloat16: 0x4300 = 128: the nibble lands in the low mantissa bits, one unit in the last place);
//   int4 codes are flipped first (code ^ 8 = value + 8, one xor a word);
// - (BASE + flip + nibble) - (BASE + flip + zero point) = value - zero point, an integer of at most
//   8 bits and a sign: exact in float16 in one subtraction (the offset BASE + flip + zero point is an
//   integer under 2048, exact). bfloat16 holds integers exactly only up to 256, so it subtracts
//   BASE + flip (exact) and then the zero point (an 8-bit integer, exact) in two steps;
// - then one correctly rounded 16-bit multiply by the scale: the exact product of an 8-bit integer and
//   an ELEM scale, rounded once to ELEM: what the reference's float64 product rounded to the scale's
//   type gives (float16: mul.rn.f16x2; bfloat16: fma.rn.bf16x2 with a -0 addend, which keeps the
//   product's sign of zero, as sm_80 has no bf16x2 multiply).
// - int4's flip costs nothing: ((q ^ F) & M) | E, with F = 0x88888888 and E's bits outside M, is
//   (q & M) ^ (E | (F & M)), one lop3, as is the plain ((q & M) | E) of uint4;
// - float16 (the high nibbles, as Marlin's decode): (q & 0x00f000f0) ^ (E | flip bits) read as float16 is
//   BASE + 16 * n exactly (the nibble four bits higher in the mantissa, still under float16's 11 bits), and
//   fma.rn.f16x2(that, 1/16, -(BASE / 16 + flip + zp)) = n - flip - zp, exact (every term an integer or
//   BASE / 16 + n exactly, one rounding of an exact integer under 2048); a zero difference comes out +0 as
//   the subtraction's does. bfloat16's 8 mantissa bits hold no nibble four bits higher: it shifts.
// Cost a word (8 codes): float16 1 shift, 4 lop3, 2 subtractions, 2 fma and 4 multiplies (13, ~1.6 an
// element; 16 before the fold and the fma); bfloat16 3 shifts, 4 lop3, 8 subtractions and 4 multiplies (19).
#pragma once
#include "dtypes.cuh"
#include "pdl.cuh"

enum { WQ_I4 = 0, WQ_U4 = 1 };  // weight_only.cu's WT_I4, WT_U4 (the runtime `wtype`)

template <class T> struct WqOps;
template <> struct WqOps<half_t> {
  static constexpr u32 MAGIC = 0x64006400u;  // 1024.0 in both halves
  static constexpr int BASE = 1024;
  static constexpr bool SPLIT_ZERO = false;
  __device__ static __forceinline__ u32 sub(u32 a, u32 b) {
    u32 d;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
  }
  __device__ static __forceinline__ u32 mul(u32 a, u32 b) {
    u32 d;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
  }
  __device__ static __forceinline__ u32 fma(u32 a, u32 b, u32 c) {
    u32 d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
  }
  __device__ static __forceinline__ u32 pair(float v) {  // v (exact in float16) in both halves
    const u32 h = f2h(v).x;
    return h | (h << 16);
  }
};
template <> struct WqOps<bf16_t> {
  static constexpr u32 MAGIC = 0x43004300u;  // 128.0 in both halves
  static constexpr int BASE = 128;
  static constexpr bool SPLIT_ZERO = true;
  __device__ static __forceinline__ u32 sub(u32 a, u32 b) {  // a * 1 + (-b)
    u32 d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(0x3f803f80u), "r"(b ^ 0x80008000u));
    return d;
  }
  __device__ static __forceinline__ u32 mul(u32 a, u32 b) {  // a * b + (-0)
    u32 d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
    return d;
  }
  __device__ static __forceinline__ u32 pair(float v) {
    const u32 h = f2b(v).x;
    return h | (h << 16);
  }
};

// the nibble masks 0x000f000f, 0x00f000f0, read from the constant bank: a LOP3 takes one immediate (MAGIC here),
// and a literal mask made ptxas re-materialize it into a register before every LOP3 under the kernels' register
// caps (one IMAD.MOV a LOP3, 4 a word); a constant-bank operand costs no instruction
__constant__ u32 wq_masks[2] = {0x000f000fu, 0x00f000f0u};
// read by an inline ld.const, not volatile (one load CSE'd for the kernel), so that NVVM does not fold the initializer back
// into literals; ptxas then keeps the two values in registers (a literal it re-materializes before every use)
__device__ __forceinline__ u32 wq_mask_lo() {
  u32 v;
  asm("ld.const.u32 %0, [wq_masks];" : "=r"(v));
  return v;
}
__device__ __forceinline__ u32 wq_mask_hi() {
  u32 v;
  asm("ld.const.u32 %0, [wq_masks+4];" : "=r"(v));
  return v;
}

// one 16-byte chunk's dequantization constants (its codes lie in one scale block): built from the
// scale's raw bits and the zero point (0 without zero points)
template <class T, int WT>
struct WqDequant {
  // float16: off = BASE + flip + zp, zero = -(BASE / 16 + flip + zp); bfloat16: off = BASE + flip, zero = zp
  u32 off, zero, scale;
  WqDequant() = default;
  __device__ __forceinline__ WqDequant(unsigned short scale_bits, int zp) {
    constexpr int FLIP = WT == WQ_I4 ? 8 : 0;
    off = WqOps<T>::pair((float)(WqOps<T>::BASE + FLIP + (WqOps<T>::SPLIT_ZERO ? 0 : zp)));
    zero = WqOps<T>::pair(WqOps<T>::SPLIT_ZERO ? (float)zp : -(float)(WqOps<T>::BASE / 16 + FLIP + zp));
    scale = (u32)scale_bits | ((u32)scale_bits << 16);
  }
  // the word's four pairs (c0, c4), (c1, c5), (c2, c6), (c3, c7) of value - zero point, exact, without the
  // scale (weight_only_mma_rows.cu scales each 128-element slice's float32 mma sums instead)
  __device__ __forceinline__ void diff(u32 word, u32 (&d)[4]) const {
    constexpr u32 FLIP = WT == WQ_I4 ? 0x88888888u : 0u;  // int4: code ^ 8 = value + 8
    const u32 LO = wq_mask_lo(), HI = wq_mask_hi();
    if (!WqOps<T>::SPLIT_ZERO) {  // float16: pairs 0, 2 from the low nibbles, 1, 3 from the high ones
      const u32 q2 = word >> 8;
      d[0] = WqOps<T>::sub((word & LO) ^ (WqOps<T>::MAGIC | (FLIP & LO)), off);
      d[1] = WqOps<half_t>::fma((word & HI) ^ (WqOps<T>::MAGIC | (FLIP & HI)), 0x2c002c00u, zero);  // x 1/16
      d[2] = WqOps<T>::sub((q2 & LO) ^ (WqOps<T>::MAGIC | (FLIP & LO)), off);
      d[3] = WqOps<half_t>::fma((q2 & HI) ^ (WqOps<T>::MAGIC | (FLIP & HI)), 0x2c002c00u, zero);
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e)
        d[e] = WqOps<T>::sub(WqOps<T>::sub(((word >> (4 * e)) & LO) ^ (WqOps<T>::MAGIC | (FLIP & LO)), off), zero);
    }
  }
  // the word's four pairs of weights (value - zero point) * scale, each rounded once to T
  __device__ __forceinline__ void operator()(u32 word, u32 (&w)[4]) const {
    u32 d[4];
    diff(word, d);
#pragma unroll
    for (int e = 0; e < 4; ++e) w[e] = WqOps<T>::mul(d[e], scale);
  }
};

// ---- the mma kernels' shared pieces (weight_only_mma.cu, weight_only_mma_staged.cu) ----

// a scale's 16 bits (of type T) as float, exactly: the scale-after kernels' multiplier of a slice's C
template <class T> __device__ __forceinline__ float wq_float(unsigned short bits) {
  T e;
  e.x = bits;
  return ld(&e, 0);
}

// q = k / block, r = k % block (k >= 0, block > 0: the scale streams' start, weight_only_mma_staged.cu's XsStream and
// weight_only_mma_rows.cu's RsStream): a power-of-two block (an exporter's 32 / 64 / 128; the test is uniform) by a
// shift and a mask, where the integer division was ~30 dependent instructions (I2F, MUFU.RCP, ..) that ptxas
// scheduled ahead of the kernel's first weight load; any other block by the division
__device__ __forceinline__ void wq_divmod(int k, int block, int& q, int& r) {
  if ((block & (block - 1)) == 0) {
    q = k >> (31 - __clz(block));
    r = k & (block - 1);
  } else {
    q = k / block;
    r = k - q * block;
  }
}

// A lane's scale index from slice to slice (weight_only_mma_staged.cu's XsStream, weight_only_mma_rows.cu's RsStream):
// start(n, k0, ..) gives `at` = n * nb + k0 / block (row n's block of element k0; N * nb < 2^31: the tactics'
// enqueue checks) and r = k0 % block, by wq_divmod; next() steps both by `step` elements with at most one carry
// (no division a slice); `nb8` steps 8 rows down
struct WqScaleIndex {
  int at, r, nb8, bstep, rstep, block;
  __device__ __forceinline__ void start(int n, int k0, int nb, int block_, int step) {
    block = block_;
    int b;
    wq_divmod(k0, block, b, r);
    at = n * nb + b;
    nb8 = 8 * nb;
    wq_divmod(step, block, bstep, rstep);
  }
  __device__ __forceinline__ void next() {
    r += rstep;
    at += bstep;
    if (r >= block) {
      r -= block;
      ++at;
    }
  }
};

// c[4] += a[4] (16 x 16, row) * b[2] (16 x 8, col): 16-bit operands of type T, PTX ISA fragment layouts
template <class T> __device__ __forceinline__ void wq_mma(float* c, const u32* a, const u32* b);
template <> __device__ __forceinline__ void wq_mma<half_t>(float* c, const u32* a, const u32* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <> __device__ __forceinline__ void wq_mma<bf16_t>(float* c, const u32* a, const u32* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// bytes of {b, a} picked by selector s (PTX prmt: result byte i = byte (s >> 4i) & 7 of b:a, a's bytes 0-3)
__device__ __forceinline__ u32 wq_perm(u32 a, u32 b, u32 s) {
  u32 d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(s));
  return d;
}

// one chunk of a weight row: its 16 bytes and its block's scale bits and zero point
struct WqChunk {
  uint4 bits;
  unsigned short scale;
  int zp;
};

// the chunk of row n at element k (32 codes, one scale block; scale of a 16-bit type T)
template <int WT, class T>
__device__ __forceinline__ WqChunk wq_load(const u8* __restrict__ w, const T* __restrict__ scale,
                                           const void* __restrict__ zero, int n, int N, int k, int K, int ldw,
                                           int block, int nb) {
  WqChunk c{make_uint4(0u, 0u, 0u, 0u), 0, 0};  // past N or K: zero codes times a zero scale
  if (n < N && k < K) {
    c.bits = *reinterpret_cast<const uint4*>(w + (i64)n * ldw + k / 2);
    const i64 b = (i64)n * nb + k / block;
    c.scale = reinterpret_cast<const unsigned short*>(scale)[b];
    if (zero) c.zp = WT == WQ_I4 ? (int)((const signed char*)zero)[b] : (int)((const u8*)zero)[b];
  }
  return c;
}

// X[m, k .. k + 7] as 16 bytes (zeros past M or K; `vec`: 16-byte aligned rows)
template <class T>
__device__ __forceinline__ uint4 wq_x8(const T* __restrict__ x, int m, int M, int k, int K, bool vec) {
  if (m >= M || k >= K) return make_uint4(0u, 0u, 0u, 0u);
  const i64 i = (i64)m * K + k;
  if (vec) return *reinterpret_cast<const uint4*>(x + i);
  const unsigned short* p = reinterpret_cast<const unsigned short*>(x + i);
  return make_uint4(p[0] | (u32)p[1] << 16, p[2] | (u32)p[3] << 16, p[4] | (u32)p[5] << 16, p[6] | (u32)p[7] << 16);
}

// acc[j] += a slice's 4 words of the lane's chunks ch[j] times X's elements of the same K positions:
// x_words(i, lo, hi) gives word i's 8 elements of row g (lo) and row g + 8 (hi); mma steps 2i and 2i + 1
template <class T, int WT, int NTILES, class XWords>
__device__ __forceinline__ void wq_slice_mma(float (&acc)[NTILES][4], const WqChunk (&ch)[NTILES], XWords x_words) {
  WqDequant<T, WT> dq[NTILES];
#pragma unroll
  for (int j = 0; j < NTILES; ++j) dq[j] = WqDequant<T, WT>(ch[j].scale, ch[j].zp);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint4 lo, hi;
    x_words(i, lo, hi);
    // A of step 2i: rows g, g + 8 at elements (0,4) and (1,5); step 2i + 1: (2,6) and (3,7)
    const u32 a0[4] = {wq_perm(lo.x, lo.z, 0x5410u), wq_perm(hi.x, hi.z, 0x5410u), wq_perm(lo.x, lo.z, 0x7632u),
                       wq_perm(hi.x, hi.z, 0x7632u)};
    const u32 a1[4] = {wq_perm(lo.y, lo.w, 0x5410u), wq_perm(hi.y, hi.w, 0x5410u), wq_perm(lo.y, lo.w, 0x7632u),
                       wq_perm(hi.y, hi.w, 0x7632u)};
#pragma unroll
    for (int j = 0; j < NTILES; ++j) {
      const uint4& b = ch[j].bits;
      u32 wd[4];
      dq[j](i == 0 ? b.x : i == 1 ? b.y : i == 2 ? b.z : b.w, wd);
      const u32 b0[2] = {wd[0], wd[1]}, b1[2] = {wd[2], wd[3]};
      wq_mma<T>(acc[j], a0, b0);
      wq_mma<T>(acc[j], a1, b1);
    }
  }
}

// wq_slice_mma for a row tile of at most 8 rows, the operands swapped: the weights are A (tiles 2p and 2p + 1 as
// rows g and g + 8 of an m16 tile of 16 columns), X is B (its n8 columns the tile's rows), so an mma takes 256
// weights, no register holds a zero row of X, and X's byte-permutes are half wq_slice_mma's (row g only).
// x_word(i) gives word i's 8 elements of X row g (the K positions of the lane's word i, as in wq_slice_mma).
// acc[p]: C of pair p, rows g (tile 2p) and g + 8 (tile 2p + 1), columns 2t, 2t + 1: X rows 2t, 2t + 1
// RAW: A holds value - zero point (WqDequant::diff, exact), not the scaled weight: the caller scales the slice's C
// (weight_only_mma_staged.cu's scale-after sets; the weights then never round to T, as weight_only_mma_rows.cu's)
template <class T, int WT, int NTILES, bool RAW = false, class XWord>
__device__ __forceinline__ void wq_slice_mma_t(float (&acc)[NTILES / 2][4], const WqChunk (&ch)[NTILES], XWord x_word) {
  static_assert(NTILES % 2 == 0, "tiles pair up into m16 rows");
  WqDequant<T, WT> dq[NTILES];
#pragma unroll
  for (int j = 0; j < NTILES; ++j) dq[j] = WqDequant<T, WT>(RAW ? (unsigned short)0 : ch[j].scale, ch[j].zp);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint4 x = x_word(i);
    // B of step 2i: K positions (0,4) and (1,5) of the word; step 2i + 1: (2,6) and (3,7)
    const u32 b0[2] = {wq_perm(x.x, x.z, 0x5410u), wq_perm(x.x, x.z, 0x7632u)};
    const u32 b1[2] = {wq_perm(x.y, x.w, 0x5410u), wq_perm(x.y, x.w, 0x7632u)};
#pragma unroll
    for (int p = 0; p < NTILES / 2; ++p) {
      const uint4& e = ch[2 * p].bits;
      const uint4& o = ch[2 * p + 1].bits;
      u32 we[4], wo[4];
      if (RAW) {
        dq[2 * p].diff(i == 0 ? e.x : i == 1 ? e.y : i == 2 ? e.z : e.w, we);
        dq[2 * p + 1].diff(i == 0 ? o.x : i == 1 ? o.y : i == 2 ? o.z : o.w, wo);
      } else {
        dq[2 * p](i == 0 ? e.x : i == 1 ? e.y : i == 2 ? e.z : e.w, we);
        dq[2 * p + 1](i == 0 ? o.x : i == 1 ? o.y : i == 2 ? o.z : o.w, wo);
      }
      const u32 a0[4] = {we[0], wo[0], we[1], wo[1]}, a1[4] = {we[2], wo[2], we[3], wo[3]};
      wq_mma<T>(acc[p], a0, b0);
      wq_mma<T>(acc[p], a1, b1);
    }
  }
}

// The block's WK warps' partial sums of a 16-row tile (part[WK][16][COLS] floats, summed in wk order) to Y
// (+ the bias, one rounding to T) or, with K split over gridDim.z, to the split's float32 workspace
// ws[z][m][n] (weight_only_mma_staged.cu's weight_only_mma_reduce adds the splits): the staged and the rows
// kernels' last step of a row tile (rows m0.., columns n0..; the caller syncs before and after)
template <int WK_, int COLS, int THREADS, class T>
__device__ __forceinline__ void wq_block_sum(const float* part, const T* __restrict__ bias, T* __restrict__ y,
                                             float* __restrict__ ws, int m0, int n0, int M, int N) {
  for (int i = threadIdx.x; i < 16 * COLS; i += THREADS) {
    const int m = m0 + i / COLS, n = n0 + i % COLS;
    float v = part[i];
#pragma unroll
    for (int p = 1; p < WK_; ++p) v += part[p * 16 * COLS + i];
    if (m < M && n < N) {
      if (gridDim.z > 1)
        ws[((i64)blockIdx.z * M + m) * N + n] = v;
      else
        st(y, (i64)m * N + n, bias ? __fadd_rn(v, ld(bias, n)) : v);
    }
  }
}

// 16 bytes global -> shared, zeros where not `valid` (src-size 0: nothing read)
__device__ __forceinline__ void wq_copy16(void* dst, const void* src, bool valid) {
  const u32 d = (u32)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(valid ? 16 : 0) : "memory");
}

// a staged X row's elements for a block of KB elements of K: at most K rounded up to a slice, and 16 bytes of pad
template <int KB>
__device__ __forceinline__ int wq_stage_ld(int K) { return (K < KB ? (K + 127) / 128 * 128 : KB) + 8; }

// X rows m0 .. m0 + rows - 1, elements [kb, kb + 128 * slices) to xs (row stride xld; zeros past K) by cp.async
// (`vec`: 16-byte aligned rows), else element by element; THREADS threads share it, and it waits for its copies
template <int THREADS, class T>
__device__ __forceinline__ void wq_stage(unsigned short* xs, int xld, const T* __restrict__ x, int m0, int rows,
                                         int kb, int slices, int M, int K, bool vec) {
  const int groups = 16 * slices;  // 16-byte groups of a staged row
  for (int i = threadIdx.x; i < rows * groups; i += THREADS) {
    const int r = i / groups, c = i - r * groups, k = kb + 8 * c;
    unsigned short* dst = xs + r * xld + 8 * c;
    if (vec)
      wq_copy16(dst, k < K ? x + (i64)(m0 + r) * K + k : x, k < K);
    else
      *reinterpret_cast<uint4*>(dst) = wq_x8(x, m0 + r, M, k, K, false);
  }
  asm volatile("cp.async.wait_all;" ::: "memory");
}

// wq_stage's X rows by plain 16-byte loads and shared stores (wq_x8: zeros past M or K; `vec`: aligned rows, else
// element by element): no cp.async group of its own, so a kernel's weight groups may be committed before it
template <int THREADS, class T>
__device__ __forceinline__ void wq_stage_loads(unsigned short* xs, int xld, const T* __restrict__ x, int m0, int rows,
                                               int kb, int slices, int M, int K, bool vec) {
  const int groups = 16 * slices;
  for (int i = threadIdx.x; i < rows * groups; i += THREADS) {
    const int r = i / groups, c = i - r * groups;
    *reinterpret_cast<uint4*>(xs + r * xld + 8 * c) = wq_x8(x, m0 + r, M, kb + 8 * c, K, vec);
  }
}

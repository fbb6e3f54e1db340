// weight_only_mma.cu's dequantization of 4-bit weight codes to 16-bit mma operands with packed math
// (no tensor-core instruction here: host-emulated alone by tests/kernels/cuda/test_weight_only_mma_emulated.py).
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
// Cost a word (8 codes): 3 shifts, 4 and-or (lop3), 4 (float16) or 8 (bfloat16) subtractions, 4
// multiplies, and the xor for int4: 15-20 instructions, ~2-2.5 an element.
#pragma once
#include "dtypes.cuh"

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

// one 16-byte chunk's dequantization constants (its codes lie in one scale block): built from the
// scale's raw bits and the zero point (0 without zero points)
template <class T, int WT>
struct WqDequant {
  u32 off, zero, scale;  // float16: off = BASE + flip + zp; bfloat16: off = BASE + flip, zero = zp
  WqDequant() = default;
  __device__ __forceinline__ WqDequant(unsigned short scale_bits, int zp) {
    constexpr int FLIP = WT == WQ_I4 ? 8 : 0;
    off = WqOps<T>::pair((float)(WqOps<T>::BASE + FLIP + (WqOps<T>::SPLIT_ZERO ? 0 : zp)));
    zero = WqOps<T>::pair((float)zp);
    scale = (u32)scale_bits | ((u32)scale_bits << 16);
  }
  // the word's four pairs (c0, c4), (c1, c5), (c2, c6), (c3, c7)
  __device__ __forceinline__ void operator()(u32 word, u32 (&w)[4]) const {
    const u32 q = WT == WQ_I4 ? word ^ 0x88888888u : word;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      u32 d = WqOps<T>::sub(((q >> (4 * e)) & 0x000f000fu) | WqOps<T>::MAGIC, off);
      if (WqOps<T>::SPLIT_ZERO) d = WqOps<T>::sub(d, zero);
      w[e] = WqOps<T>::mul(d, scale);
    }
  }
};

"""Warp collectives and the warp-level PTX of polykit's kernels, for block_emulation.py's host threads.

The 32 lanes of a warp are 32 host threads that do not run in lockstep; a collective is a warp
rendezvous: each lane writes its operands into its slot of the warp's table, the warp meets at
its own barrier (its lanes only: warps still run apart, so a missing __syncthreads between warps
races as on a GPU), each lane computes its own result from the others' slots, and the warp meets
again before a slot may be rewritten. On this rest:
  - __shfl_sync / __shfl_xor_sync / __shfl_down_sync / __shfl_up_sync (full mask; `width` segments
    as CUDA has them), __syncwarp;
  - mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32 and
    m16n8k32.row.col.s32.s8.s8.s32, from the PTX ISA's fragment layouts (g = lane / 4, t = lane % 4:
    A register i holds row g + 8 (i % 2), columns 2t + {0, 1} + 8 (i / 2) (s8: 4t + {0..3} + 16 (i / 2));
    B register i rows 2t + {0, 1} + 8 i (s8: 4t + {0..3} + 16 i), column g; C/D element e row
    g + 8 (e / 2), column 2t + e % 2). Each product of two f16 (11-bit significands) or bf16 (8-bit)
    is exact in float; a lane sums its 16 products in float in k order from zero and adds the sum
    to C once. The GPU adds the exact products in an order and with an alignment of its own, also in
    fp32: the two differ by a few fp32 roundings of partial sums, relative 16 * 2^-24 of
    sum |a b| an mma and K * 2^-24 over a conv's K <= 864 (5e-5), under the fp16 / bf16 storage
    rounding of the output (2^-11 / 2^-8) that the tests' tolerances are set by. s8 sums are exact;
  - ld[.volatile].shared.v4.{b32,u32} (16 bytes of shared memory to 4 registers);
  - ldmatrix.sync.aligned.m8n8.{x1,x2,x4}[.trans].shared.b16: lane 8 i + j gives the address of
    row j of matrix i; lane l receives in register i matrix i's row l / 4, elements 2 (l % 4) + {0, 1}
    (.trans: the transposed matrix's, i.e. elements [2 (l % 4) + {0, 1}][l / 4]);
  - cp.async.{ca,cg}.shared.global (cp-size, optional src-size: zeros past it), commit_group,
    wait_group N, wait_all. Deferred (default): a thread's copies queue in its open group, a commit
    closes it, wait_group N lands all but the newest N groups, so a phase that reads what it did not
    wait for computes with stale shared memory. Eager (EMU_CP_EAGER 1): each copy lands at once, so
    one into a buffer other warps still read races with them. The two ends of what a GPU may do;
  - ex2.approx / rcp.approx (the host's exp2f and division: not their bits);
  - sub.rn.f16x2, mul.rn.f16x2, fma.rn.f16x2, fma.rn.bf16x2 (each half exact in double, rounded once: their bits for
    the operands weight_only_mma.cuh gives them), prmt.b32 (default mode) and cvt.pack.sat.{s8,u8}.s32.b32
    (int8_out.cuh's sat_pack);
  - prefetch.global.L2 (a cache hint: nothing);
  - st.global.v4.{b32,u32} (4 registers to 16 bytes of memory).
Shared addresses (`__cvta_generic_to_shared`) are 32-bit offsets from an anchor in the module's
own data (the emulated shared memory is the module's statics), sign-extended back.

`translate_asm` rewrites every inline `asm` statement of a source into calls of these; one it does
not know is a ValueError that names it.
"""

from __future__ import annotations

import re

#: the host models of PTX arithmetic (16-bit elements, IEEE intrinsics, max / min .NaN, the e4m3 conversions,
#: prmt): what translate_asm's statements call; WARP_PRELUDE holds them, and a single-thread emulation
#: (test_lowp_emulated.py) takes them alone
PTX_PRELUDE = r"""
#include <math.h>
#include <string.h>
// element `half` (0 low, 1 high) of a register of two 16-bit values, as float
inline float emu_f16(unsigned w, int half) {
  const unsigned short b = (unsigned short)(half ? w >> 16 : w & 0xffffu);
  _Float16 v;
  memcpy(&v, &b, 2);
  return (float)v;
}
inline float emu_bf16(unsigned w, int half) {
  const unsigned b = (half ? w >> 16 : w & 0xffffu) << 16;
  float f;
  memcpy(&f, &b, 4);
  return f;
}
inline long long emu_s8(unsigned w, int byte) { return (signed char)(w >> (8 * byte)); }
inline float __fadd_rn(float a, float b) { return a + b; }  // -O1 on the host contracts nothing either
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }  // glibc's fmaf: one rounding
inline float __frcp_rn(float a) { return 1.0f / a; }
// PTX max.NaN / min.NaN: a NaN operand gives the canonical NaN
inline float emu_max_nan(float a, float b) { return a != a || b != b ? __builtin_nanf("") : (a > b ? a : b); }
inline float emu_min_nan(float a, float b) { return a != a || b != b ? __builtin_nanf("") : (a < b ? a : b); }
// cvt.rn.satfinite.e4m3x2.f32 d, hi, lo (quotient.cuh's e4m3x2_cvt, e4m3_quantize.cuh's sm_89+ path; the host
// compiles the software encode instead, so this only has to be the PTX's meaning): round to nearest even, +-inf
// and finite values past 448 saturated to +-448, a NaN the canonical 0x7f (cuda_fp8.hpp's host model of it)
inline unsigned emu_e4m3(float f) {
  unsigned u;
  memcpy(&u, &f, 4);
  const unsigned s = (u >> 31) << 7, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7f;
  const double d = fabs((double)f);
  if (d > 464.0) return s | 0x7e;  // past the midpoint of 448 and 480: saturated (inf too)
  if (d < 0x1p-6) return s | (unsigned)nearbyint(d * 512.0);  // subnormals: steps of 2^-9
  int e;
  const double m = frexp(d, &e);  // d = m 2^e, m in [0.5, 1)
  const double r = nearbyint(m * 16.0);  // 4 significant bits, half to even
  const unsigned code = (unsigned)((e - 1 + 7) * 8) + (unsigned)r - 8;
  return s | (code > 0x7e ? 0x7e : code);
}
inline unsigned short emu_cvt_e4m3x2(float hi, float lo) { return (unsigned short)(emu_e4m3(lo) | emu_e4m3(hi) << 8); }
// packed 16-bit math, each half on its own (weight_only_mma.cuh): the operation exact in double (two
// float16 values lie within 2^40 of each other; a bfloat16 fma's operands there within 2^30), then one
// rounding: float16 through _Float16, bfloat16 to nearest even through round-to-odd in float
inline unsigned emu_to_f16(double d) {
  const _Float16 h = (_Float16)d;
  unsigned short b;
  memcpy(&b, &h, 2);
  return b;
}
inline unsigned emu_to_bf16(double d) {
  float f = (float)d;
  unsigned u;
  memcpy(&u, &f, 4);
  if ((double)f != d) {  // round to odd: toward zero, then the sticky last bit
    if (fabs((double)f) > fabs(d)) u -= 1;
    u |= 1;
  }
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}
inline unsigned emu_f16x2(unsigned a, unsigned b, bool mul) {  // sub.rn.f16x2 / mul.rn.f16x2
  unsigned d = 0;
  for (int i = 0; i < 2; ++i) {
    const double x = emu_f16(a, i), y = emu_f16(b, i);
    d |= emu_to_f16(mul ? x * y : x - y) << 16 * i;
  }
  return d;
}
inline unsigned emu_fma_f16x2(unsigned a, unsigned b, unsigned c) {  // fma.rn.f16x2: one rounding a half
  unsigned d = 0;
  for (int i = 0; i < 2; ++i)
    d |= emu_to_f16((double)emu_f16(a, i) * (double)emu_f16(b, i) + (double)emu_f16(c, i)) << 16 * i;
  return d;
}
inline unsigned emu_fma_bf16x2(unsigned a, unsigned b, unsigned c) {
  unsigned d = 0;
  for (int i = 0; i < 2; ++i)
    d |= emu_to_bf16((double)emu_bf16(a, i) * (double)emu_bf16(b, i) + (double)emu_bf16(c, i)) << 16 * i;
  return d;
}
// cvt.rn.f16x2.e4m3x2 d, a (lowp.cuh's sm_89+ decode): byte i of a as the float16 in half i of d, exact; a NaN
// code the float16 NaN 0x7fff with its sign (cuda_fp8.hpp's model; lowp.cuh replaces it by its own NaN)
inline unsigned emu_e4m3_f16(unsigned c) {
  const unsigned s = (c & 0x80u) << 8, mag = c & 0x7fu;
  if (mag == 0x7fu) return s | 0x7fffu;
  const double v = ldexp((double)(mag >> 3 ? 8 + (mag & 7u) : mag & 7u), (int)(mag >> 3 ? (mag >> 3) : 1) - 10);
  return s | emu_to_f16(v);
}
// cvt.pack.sat.{s8,u8}.s32.b32 d, a, b, c: a and b saturated to the 8-bit type as bytes 1 and 0, c's low 16 bits
// above them (the PTX ISA's pseudo-code: td = tb, td[8..15] = ta, d[16..31] = c[0..15])
inline unsigned emu_cvt_pack_sat8(int a, int b, unsigned c, bool u8) {
  const int lo = u8 ? 0 : -128, hi = u8 ? 255 : 127;
  const unsigned ta = (unsigned)(a < lo ? lo : a > hi ? hi : a) & 255u, tb = (unsigned)(b < lo ? lo : b > hi ? hi : b) & 255u;
  return tb | ta << 8 | c << 16;
}
inline unsigned emu_cvt_f16x2_e4m3x2(unsigned a) { return emu_e4m3_f16(a & 0xffu) | emu_e4m3_f16((a >> 8) & 0xffu) << 16; }
// prmt.b32 (default mode): byte i of the result is byte (s >> 4i) & 7 of {b, a}, its sign replicated when bit 3 is set
inline unsigned emu_prmt(unsigned a, unsigned b, unsigned s) {
  const unsigned long long v = ((unsigned long long)b << 32) | a;
  unsigned d = 0;
  for (int i = 0; i < 4; ++i) {
    const unsigned sel = (s >> 4 * i) & 15u, byte = (unsigned)(v >> 8 * (sel & 7u)) & 255u;
    d |= (sel & 8u ? (byte & 128u ? 255u : 0u) : byte) << 8 * i;
  }
  return d;
}
"""

#: the host side of the warp collectives (after block_emulation's PRELUDE: Dim3, threadIdx, blockDim)
WARP_PRELUDE = PTX_PRELUDE + r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <memory>
#ifndef EMU_CP_EAGER
#define EMU_CP_EAGER 0
#endif
struct EmuWarp { std::barrier<>* bar; unsigned lanes; alignas(16) unsigned char slot[32][64]; };
static EmuWarp* emu_warps;                     // the running block's warps
static thread_local unsigned emu_lane, emu_warp_id;
inline void emu_fail(const char* what) { fprintf(stderr, "warp emulation: %s\n", what); fflush(stderr); abort(); }
inline EmuWarp& emu_w() { return emu_warps[emu_warp_id]; }
inline unsigned char* emu_slot(unsigned lane) { return emu_w().slot[lane]; }
inline void emu_warp_sync() { emu_w().bar->arrive_and_wait(); }
inline void emu_full_mask(unsigned mask) {
  const unsigned lanes = emu_w().lanes, full = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1u;
  if ((mask & full) != full) emu_fail("a partial warp mask (only full-warp collectives are modelled)");
}
inline void __syncwarp(unsigned mask = 0xffffffffu) { emu_full_mask(mask); emu_warp_sync(); }
inline float rsqrtf(float v) { return 1.0f / sqrtf(v); }
inline int __clz(int v) { return v == 0 ? 32 : __builtin_clz((unsigned)v); }  // leading zeros (CUDA's)

// lane emu_lane publishes v, reads lane `src` (its own where src is past the warp)
template <class T> inline T emu_exchange(unsigned mask, T v, unsigned src) {
  static_assert(sizeof(T) <= 64, "a shuffled value fits a slot");
  emu_full_mask(mask);
  memcpy(emu_slot(emu_lane), &v, sizeof(T));
  emu_warp_sync();
  T r;
  memcpy(&r, emu_slot(src < emu_w().lanes ? src : emu_lane), sizeof(T));
  emu_warp_sync();
  return r;
}
template <class T> inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  return emu_exchange(mask, v, (emu_lane & ~(unsigned)(width - 1)) + ((unsigned)src & (unsigned)(width - 1)));
}
template <class T> inline T __shfl_xor_sync(unsigned mask, T v, int m, int width = 32) {
  const unsigned s = emu_lane ^ (unsigned)m, base = emu_lane & ~(unsigned)(width - 1);
  return emu_exchange(mask, v, s >= base + (unsigned)width ? emu_lane : s);
}
template <class T> inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32) {
  const unsigned s = emu_lane + d, base = emu_lane & ~(unsigned)(width - 1);
  return emu_exchange(mask, v, s >= base + (unsigned)width ? emu_lane : s);
}
template <class T> inline T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32) {
  const unsigned base = emu_lane & ~(unsigned)(width - 1);
  return emu_exchange(mask, v, emu_lane < base + d ? emu_lane : emu_lane - d);
}

// shared-memory addresses: offsets from an anchor among the module's statics
static unsigned char emu_shared_anchor;
inline unsigned long long __cvta_generic_to_shared(const void* p) {
  return (unsigned)((intptr_t)p - (intptr_t)&emu_shared_anchor);
}
inline unsigned char* emu_shared(unsigned a) { return &emu_shared_anchor + (int)a; }

// mma m16n8k16 f32 += {f16,bf16} x {f16,bf16} (K 16, two elements a register) and m16n8k32 s32 += s8 x s8
// (K 32, four): A row-major 16 x K (4 registers), B column-major K x 8 (2), C / D 16 x 8 (4 values).
// A lane's products summed in Sum (float: exact products, in k order from zero; s8: exact) and added
// to C once (s32: wrapping, as the accumulator does)
template <class Acc, class Sum, Sum (*ELEM)(unsigned, int), int K>
inline void emu_mma(Acc& d0, Acc& d1, Acc& d2, Acc& d3, unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                    unsigned b0, unsigned b1, Acc c0, Acc c1, Acc c2, Acc c3) {
  constexpr int PER = K / 8;   // elements a register
  const unsigned mine[6] = {a0, a1, a2, a3, b0, b1};
  memcpy(emu_slot(emu_lane), mine, sizeof(mine));
  emu_warp_sync();
  const int g = emu_lane / 4, t = emu_lane % 4;
  const Acc c[4] = {c0, c1, c2, c3};
  Acc d[4];
  for (int e = 0; e < 4; ++e) {
    const int row = g + 8 * (e / 2), col = 2 * t + e % 2;
    Sum s = 0;
    for (int k = 0; k < K; ++k) {
      const unsigned* a = (const unsigned*)emu_slot((row % 8) * 4 + (k % (K / 2)) / PER);
      const unsigned* b = (const unsigned*)emu_slot(col * 4 + (k % (K / 2)) / PER);
      s += ELEM(a[(row >= 8) + 2 * (k >= K / 2)], k % PER) * ELEM(b[4 + (k >= K / 2)], k % PER);
    }
    d[e] = (Acc)(c[e] + s);
  }
  emu_warp_sync();
  d0 = d[0], d1 = d[1], d2 = d[2], d3 = d[3];
}

// ldmatrix m8n8 .b16: `count` matrices (1, 2, 4) into r[0..count), rows addressed by lanes 8 i + j
inline void emu_ldmatrix(int count, bool trans, unsigned* r, unsigned addr) {
  const unsigned char* mine = emu_shared(addr);
  memcpy(emu_slot(emu_lane), &mine, sizeof(mine));
  emu_warp_sync();
  const int l = emu_lane;
  for (int i = 0; i < count; ++i) {
    const unsigned char* row;
    if (!trans) {
      memcpy(&row, emu_slot(8 * i + l / 4), sizeof(row));
      memcpy(&r[i], row + 4 * (l % 4), 4);
    } else {
      unsigned short e[2];
      for (int j = 0; j < 2; ++j) {
        memcpy(&row, emu_slot(8 * i + 2 * (l % 4) + j), sizeof(row));
        memcpy(&e[j], row + 2 * (l / 4), 2);
      }
      r[i] = (unsigned)e[0] | ((unsigned)e[1] << 16);
    }
  }
  emu_warp_sync();
}

// cp.async: copies of `size` bytes, `src_size` of them read (zeros after); deferred or eager
struct EmuCopy { unsigned char* dst; const unsigned char* src; int size, src_size; };
static thread_local std::vector<std::vector<EmuCopy>> emu_groups;
static thread_local std::vector<EmuCopy> emu_open;
inline void emu_land(const EmuCopy& c) {
  memcpy(c.dst, c.src, c.src_size);
  memset(c.dst + c.src_size, 0, c.size - c.src_size);
}
inline void emu_cp_async(unsigned dst, const void* src, int size, int src_size) {
  if (src_size < 0 || src_size > size) emu_fail("cp.async src-size past cp-size");
  const EmuCopy c = {emu_shared(dst), (const unsigned char*)src, size, src_size};
  if (EMU_CP_EAGER) emu_land(c); else emu_open.push_back(c);
}
inline void emu_cp_commit() {
  emu_groups.push_back(emu_open);
  emu_open.clear();
}
inline void emu_cp_wait(int pending) {
  while ((int)emu_groups.size() > pending) {
    for (const EmuCopy& c : emu_groups.front()) emu_land(c);
    emu_groups.erase(emu_groups.begin());
  }
}
inline void emu_cp_wait_all() { emu_cp_commit(); emu_cp_wait(0); }
"""


def _closing(text: str, open_at: int) -> int:
    """Index of the parenthesis closing the one at `open_at` (string literals skipped)."""
    depth, i = 0, open_at
    while i < len(text):
        ch = text[i]
        if ch == '"':
            i += 1
            while text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise ValueError("an asm statement without its closing parenthesis")


def _sections(body: str) -> list[str]:
    """`body` split at its top-level colons (template, outputs, inputs, clobbers)."""
    out, depth, cur, i = [], 0, [], 0
    while i < len(body):
        ch = body[i]
        if ch == '"':
            j = i + 1
            while body[j] != '"':
                j += 2 if body[j] == "\\" else 1
            cur.append(body[i:j + 1])
            i = j + 1
            continue
        depth += (ch == "(") - (ch == ")")
        if ch == ":" and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
        i += 1
    return out + ["".join(cur)]


def _operands(section: str) -> list[str]:
    """The C expressions of a section's `"constraint"(expr)` operands, in order."""
    exprs = []
    for m in re.finditer(r'"[^"]*"\s*\(', section):
        end = _closing(section, m.end() - 1)
        exprs.append(f"({section[m.end():end].strip()})")
    return exprs


def _instructions(template: str) -> list[str]:
    """The instructions of an asm template: itself, or where it holds several plain ones (no braces, no
    labels) separated by ';', each of them."""
    text = template.replace("\\n", " ").replace("\\t", " ").strip().rstrip(";").strip()
    if "{" in text or ":" in text:
        return [template]
    return [t.strip() for t in text.split(";")]


def _args(template: str, operands: list[str]) -> tuple[str, list[list[str]]]:
    """(opcode, arguments): each argument a list of C expressions ({..} vectors their elements,
    [..] addresses their one expression), %N replaced by operand N."""
    text = template.replace("\\n", " ").replace("\\t", " ").strip().rstrip(";").strip()
    if ";" in text or text.startswith("{"):
        raise ValueError(f"PTX of several instructions: {text!r}")
    opcode, _, rest = text.partition(" ")
    args = [a.strip().strip("[]{}") for a in re.findall(r"\{[^}]*\}|[^,{}]+", rest) if a.strip()]
    return opcode, [[re.sub(r"%(\d+)", lambda m: operands[int(m.group(1))], e.strip()) for e in a.split(",")]
                    for a in args]


def _mma(fn: str):
    def emit(args: list[list[str]]) -> str:
        d, a, b, c = args
        return f"{fn}({', '.join(d + a + b + c)})"

    return emit


def _ldmatrix(count: int, trans: bool):
    def emit(args: list[list[str]]) -> str:
        regs, (addr,) = args
        copies = " ".join(f"{r} = emu_r[{i}];" for i, r in enumerate(regs))
        call = f"emu_ldmatrix({count}, {str(trans).lower()}, emu_r, {addr});"
        return f"do {{ unsigned emu_r[4]; {call} {copies} }} while (0)"

    return emit


def _ld_shared_v4(args: list[list[str]]) -> str:
    regs, (addr,) = args
    copies = " ".join(f"{r} = emu_v[{i}];" for i, r in enumerate(regs))
    return f"do {{ unsigned emu_v[4]; memcpy(emu_v, emu_shared({addr}), 16); {copies} }} while (0)"


def _cp_async(args: list[list[str]]) -> str:
    (dst,), (src,), (size,), *src_size = args
    return f"emu_cp_async({dst}, {src}, {size}, {src_size[0][0] if src_size else size})"


def _ld_const(args: list[list[str]]) -> str:
    (dst,), (addr,) = args  # [symbol] or [symbol+bytes]: a __constant__ array (block_emulation: a static one)
    sym, _, off = addr.partition("+")
    return f"memcpy(&{dst}, (const char*){sym.strip()} + {off.strip() or 0}, 4)"


#: PTX opcode (a full match) -> emit(arguments) -> the C expression that stands for the statement
PTX_OPS = [
    (r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.f16\.f16\.f32", _mma("emu_mma<float, float, emu_f16, 16>")),
    (r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.bf16\.bf16\.f32", _mma("emu_mma<float, float, emu_bf16, 16>")),
    (r"mma\.sync\.aligned\.m16n8k32\.row\.col\.s32\.s8\.s8\.s32", _mma("emu_mma<int, long long, emu_s8, 32>")),
    *[(rf"ldmatrix\.sync\.aligned\.m8n8\.x{n}{t}\.shared(::cta)?\.b16", _ldmatrix(n, bool(t)))
      for n in (1, 2, 4) for t in ("", r"\.trans")],
    (r"ld(\.volatile)?\.shared(::cta)?\.v4\.[bu]32", _ld_shared_v4),
    (r"cp\.async\.c[ag]\.shared(::cta)?\.global(\.L2::\d+B)?", _cp_async),
    (r"cp\.async\.commit_group", lambda args: "emu_cp_commit()"),
    (r"cp\.async\.wait_group", lambda args: f"emu_cp_wait({args[0][0]})"),
    (r"cp\.async\.wait_all", lambda args: "emu_cp_wait_all()"),
    (r"ex2\.approx(\.ftz)?\.f32", lambda args: f"{args[0][0]} = exp2f({args[1][0]})"),
    (r"rcp\.approx(\.ftz)?\.f32", lambda args: f"{args[0][0]} = 1.0f / {args[1][0]}"),
    (r"sub\.rn\.f16x2", lambda args: f"{args[0][0]} = emu_f16x2({args[1][0]}, {args[2][0]}, false)"),
    (r"mul\.rn\.f16x2", lambda args: f"{args[0][0]} = emu_f16x2({args[1][0]}, {args[2][0]}, true)"),
    (r"fma\.rn\.f16x2", lambda args: f"{args[0][0]} = emu_fma_f16x2({args[1][0]}, {args[2][0]}, {args[3][0]})"),
    (r"fma\.rn\.bf16x2", lambda args: f"{args[0][0]} = emu_fma_bf16x2({args[1][0]}, {args[2][0]}, {args[3][0]})"),
    (r"prmt\.b32", lambda args: f"{args[0][0]} = emu_prmt({args[1][0]}, {args[2][0]}, {args[3][0]})"),
    (r"max\.NaN\.f32", lambda args: f"{args[0][0]} = emu_max_nan({args[1][0]}, {args[2][0]})"),
    (r"min\.NaN\.f32", lambda args: f"{args[0][0]} = emu_min_nan({args[1][0]}, {args[2][0]})"),
    (r"cvt\.rn\.satfinite\.e4m3x2\.f32",
     lambda args: f"{args[0][0]} = emu_cvt_e4m3x2({args[1][0]}, {args[2][0]})"),
    (r"cvt\.rn\.f16x2\.e4m3x2", lambda args: f"{args[0][0]} = emu_cvt_f16x2_e4m3x2({args[1][0]})"),
    (r"cvt\.f32\.f16", lambda args: f"{args[0][0]} = emu_f16({args[1][0]}, 0)"),
    *[(rf"cvt\.pack\.sat\.{t}8\.s32\.b32", lambda args, u=t == "u": f"{args[0][0]} = emu_cvt_pack_sat8("
       f"{args[1][0]}, {args[2][0]}, {args[3][0]}, {str(u).lower()})") for t in "su"],
    (r"ld\.const\.[bu]32", _ld_const),
    (r"prefetch\.global\.L2(::evict_\w+)?", lambda args: f"(void)({args[0][0]})"),  # a cache hint: no effect here
    (r"st\.global\.v4\.[bu]32", lambda args: f"do {{ const unsigned emu_s[4] = {{{', '.join(args[1])}}}; "
                                               f"memcpy((void*)({args[0][0]}), emu_s, 16); }} while (0)"),
]


def translate_asm(cuda: str, unmodelled: str = "error") -> str:
    """`cuda` with each inline `asm [volatile] (...)` replaced by the host code of its PTX
    (PTX_OPS); ValueError naming the first instruction that has none, or with `unmodelled="trap"`
    a statement that stops the process when it runs (`emu_fail`, naming it): a harness that runs part
    of a kernel (sm90_epilogue_emulation.py: the sm90 GEMMs' epilogue without their wgmma K loop) then
    compiles the rest, and any modelled path that reaches unmodelled PTX fails loudly. An empty template
    (a register fence, `asm volatile("" : "+f"(x))`) is nothing on the host."""
    if unmodelled not in ("error", "trap"):
        raise ValueError(f"unmodelled: 'error' or 'trap', not {unmodelled!r}")
    out, pos = [], 0
    for m in re.finditer(r"\basm\s*(?:volatile\s*)?\(", cuda):
        if m.start() < pos:
            continue
        end = _closing(cuda, m.end() - 1)
        sections = _sections(cuda[m.end():end])
        template = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', sections[0]))
        operands = [e for s in sections[1:3] for e in _operands(s)]
        stmts = []
        try:
            # several plain instructions in one asm (quotient.cuh's clamp_nan: max.NaN; min.NaN): each in turn
            for one in _instructions(template) if template.strip() else ():
                opcode, args = _args(one, operands)
                emit = next((emit for pattern, emit in PTX_OPS if re.fullmatch(pattern, opcode)), None)
                if emit is None:
                    raise ValueError(f"the kernel source holds PTX the host emulation does not model: {opcode}")
                stmts.append(emit(args))
        except ValueError:
            if unmodelled == "error":
                raise
            what = " ".join(template.replace("\\n", " ").replace("\\t", " ").split())[:60].replace('"', "'")
            stmts = [f'emu_fail("unmodelled PTX reached: {what}")']
        out += [cuda[pos:m.start()], "; ".join(stmts) if stmts else "(void)0"]
        pos = end + 1
    return "".join(out) + cuda[pos:]

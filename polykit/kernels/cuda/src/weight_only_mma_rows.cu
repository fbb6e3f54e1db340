// weight_only_mma_rows: WeightOnlyMatMul (ai.polykit; compiler/ops/quant/weight_only.py) on tensor cores for W4A16
// at small M with the *weights* as the mma's A operand and each weight block's scale applied to float32 sums:
// Y = X @ dequantize(W)^T + B with mma.sync m16n8k16 (16-bit operands, float32 accumulate); tactics
// cuda.weight_only.mma_rows_n<16 * RT * WN>_k<128 * WK * SW> (kernels/cuda/int8/weight_only_mma_rows.py).
// weight_only_mma.cu's layouts and types (X [M, K] ELEM half_t / bf16_t, W uint8 [N, ldw] int4 / uint4 two codes
// a byte, scale [N, nb] ELEM, zero point [N, nb] int8 / uint8 or null, B [N] or null, Y [M, N] ELEM; K % 16 == 0)
// and, here, block % 128 == 0: a 128-element slice of a row lies in one scale block.
//
// Why. weight_only_mma_staged puts the weights in B (8 weight rows x 16 K an mma: 128 weights), multiplies every
// weight by its scale in 16 bits (weight_only_mma.cuh's WqDequant: ~1.6 instructions a weight with the decode)
// and byte-permutes X into A for two rows (g, g + 8) a word; ncu at M = 1 (H100): DRAM 22 %, ~5.8
// thread-instructions a weight, issue bound. Here the weights are A (16 weight rows x 16 K an mma: 256 weights,
// half the mma count a weight), decoded without the scale (WqDequant::diff: value - zero point, an exact integer
// in ELEM), and X is B (16 K x 8 X rows): one 16-byte shared load of X row g a word and 4 prmt, shared by the
// warp's RT row tiles. A slice's 8 mma steps sum into a fresh float32 C; then acc += C * scale(row) (one fp32 fma
// an element of C: row g's scale for c0, c1, row g + 8's for c2, c3).
//
// Fragments (PTX ISA m16n8k16, g = lane >> 2, t = lane & 3; A row-major: a0 = (row g, k 2t..2t+1), a1 = (g + 8,
// 2t..), a2 = (g, 2t + 8..), a3 = (g + 8, 2t + 8..); B col: b0 = (k 2t..2t+1, col g), b1 = (k 2t + 8.., col g);
// C: c0, c1 = (row g, cols 2t, 2t + 1), c2, c3 = (row g + 8, ..)). An mma's 16 K positions may be any 16 of the
// slice as long as A and B agree: lane (g, t) holds the 16-byte chunk t (32 codes at K = base + 32 t) of weight
// rows n0 + g and n0 + g + 8 (weight_only_mma.cu's chunk map: 4 lanes cover 128 K of a row a slice). Word i of a
// chunk (codes c0..c7 at K = base + 32 t + 8 i + 0..7) decodes to pairs (c0, c4), (c1, c5), (c2, c6), (c3, c7):
// mma step 2i takes a0 / a2 = row g's (c0, c4) / (c1, c5) and a1 / a3 = row g + 8's, with b0 = X row g's
// (x0, x4), b1 = (x1, x5); step 2i + 1 the same with (c2, c6), (c3, c7) and (x2, x6), (x3, x7). Every lane of
// a given t then pairs A's and B's K positions alike (A's k 2t, 2t + 1 = B's k 2t, 2t + 1 = elements 8i + {0, 4}).
//
// M. The mma's 8 columns are X rows: a row tile of 16 X rows (m0 = blockIdx.y * 16, stepping by gridDim.y * 16:
// any M, as the staged kernel) is two n8 column tiles, the second's mma steps (and its X loads and prmt) run
// only where the row tile holds more than 8 rows (a warp-uniform branch). Why not row tiles of 8 over gridDim.y:
// each block would stream all its weights once per 8 X rows (2x the DRAM bytes at M = 9..16) where a second
// column tile costs only the mma and X's B words (the decoded A is shared); M = 1..8 pays nothing for it.
//
// Geometry (the staged kernel's): block = WN x WK warps (warp w: wn = w % WN, wk = w / WN), RT row tiles of 16
// weight rows a warp, the block's 16 * RT * WN weight rows (Y columns) from blockIdx.x * that, K range [kb,
// kb + KB), KB = 128 * WK * SW, kb = blockIdx.z * KB (gridDim.z = splits = ceil(K / KB)). Warp (wn, wk) takes
// slices wk, wk + WK, .. (SW of them) of the range and copies all 2 * RT * SW of its 16-byte chunks to shared
// memory by cp.async first thing (a commit group a slice; its own slots [warp][slice][tile][half][lane]: a warp's
// chunk is 512 contiguous bytes; RsStream: a row's pointer once, slice q at an immediate offset), then stages X rows
// m0 .. m0 + rows - 1 of the block's range by plain 16-byte loads (xld = min(KB, K rounded up to 128) + 8, zeros
// past K; element by element where X is not 16-byte aligned), then starts the scale stream (its two divisions;
// the block stepped without one after) and loads the slices' scales / zero points. Slice q waits for its own group
// (wait_group SW - 1 - q: this lane's copies, which only this lane reads). X's shared loads are ld.volatile (in
// program order: ptxas otherwise hoisted every slice's X loads ahead of the math and spilled). The WK warps' C
// fragments then go to shared memory where the chunks were (part[WK][16][cols]) and the block sums them in wk
// order; splits == 1: Y = ELEM(sum + float(B))
// (every Y of the row tile written), else the float sums to ws[z][m][n] and weight_only_mma_staged.cu's
// weight_only_mma_reduce (the same parameter list) adds the splits in z order, then B: deterministic.
// Past N: zero bits and a zero scale (C * 0 = 0: C is finite for finite X); past K: zero bits against X staged as
// zero; slices wholly past K are skipped; X rows past M are zero B words (shared memory not read).
//
// Numerics: (value - zero point) is exact in ELEM (float16: integers under 2048; bfloat16: |v| <= 255 under 256),
// its product with X exact in float32 (8 + 11 bits), the mma's sum float32; a slice's float32 sum times the
// scale (ELEM -> float32, exact), one fp32 fma into the lane's accumulator. The weights are never rounded to
// ELEM (weight_only_mma's kernels round (value - zp) * scale to ELEM first): as close to the float64 reference or
// closer; the float32 sums' order differs (slice sums, then slices in order, then warps and splits in order). So
// Y may differ from the cpu reference (whose weights are rounded) by more than the tests' TOLERANCE where a sum
// cancels (bfloat16, or zero points far outside the codes): test_weight_only.assert_rows_match holds it to
// TOLERANCE of the unrounded weights' Y, and of the reference plus the reference's own weight rounding.
//
// Cost (counted from the source, an ESTIMATE, not measured; float16 X, M = 1, int4 blocked 128), lane
// instructions a weight: a word (8 codes) of a row decodes in 9 (float16: 1 shift, 4 lop3, 2 sub, 2 fma;
// bfloat16: 3 shifts, 4 lop3, 8 sub: 15); 2 words (rows g, g + 8) feed 2 mma steps: 16 weights a lane, so the
// decode is 1.125 (bfloat16 1.875) and the mma 0.125; X a word is 1 lds.128 + 4 prmt for all RT tiles: 5 / (16 RT)
// (0.31 at RT = 1, 0.16 at RT = 2); a slice's scale work a row tile (2 scale and 2 zero-point loads, their
// conversions and the off / zero pairs of 2 rows ~12, 4 fma) over 64 weights a lane: ~0.25; the chunk loads
// and the stream's steps ~0.05. ~1.8 at RT = 1, ~1.65 at RT = 2 (M = 1; the brief's aim was ~1.3: the decode
// alone is 1.125), against ~3.1 counted for the staged kernel (its header) and ~5.8 measured there by ncu.
// At M = 9..16 the second column tile adds 2 mma, 1 lds and 4 prmt a word: ~+0.25 + 0.31 / RT.
// Registers: the chunks wait in shared memory (none in flight in registers); the slices' scales and zero points, the
// accumulators and a slice's C 16 * RT floats; __launch_bounds__(threads, WR_MIN_BLOCKS) asks ptxas for <= 128 a
// thread: every tile gets <= 128 with no spills (ptxas -v, NVRTC 13.5, sm_80 and sm_90; checked by
// tests/kernels/cuda/test_weight_only_rows_emulated.py); 2 row tiles of 2 slices a warp (16 warps) spilled 20 bytes.
// Shared memory: X's min(16, M) x xld ELEM, then WR_CHUNK_BYTES (64 KB an SM at n16_k4096's 2 blocks of 32 KB).
// Measured (H100, 2026-12-07, ncu at M = 1, N = K = 4096, before the copies moved first): 13.15 us at ncu's clocks,
// DRAM 20 %, 0.33 issued a scheduler-cycle at 3.8 warps, 5.5 thread-instructions a weight (the counts above are a
// slice's math; each warp's prologue and the block's sums are the rest): docs/PERFORMANCE.md, twenty-first session.
// Copies first (twenty-third session; SASS only, NOT timed): a block within N and K runs the body compiled FULL
// (tested at entry, outside the row-tile loop), its copies unpredicated; the scale stream's start by a shift for a
// power-of-two block (wq_divmod). n16_k4096's first copy: ~137 instructions into the kernel (~210 before; the rest
// is X's and shared memory's addresses, hoisted by ptxas).
// Defines: ELEM (half_t, bf16_t), WN, WK (warps across rows / K), RT (16-row tiles a warp), SW (slices a warp
// holds in flight), WR_MIN_BLOCKS (blocks an SM asked of ptxas).
#include "weight_only_mma.cuh"

#ifndef ELEM
#define ELEM half_t
#endif
#ifndef WN
#define WN 1
#endif
#ifndef WK
#define WK 8
#endif
#ifndef RT
#define RT 1
#endif
#ifndef SW
#define SW 4
#endif
#ifndef WR_MIN_BLOCKS
#define WR_MIN_BLOCKS 2
#endif
#define WR_THREADS (32 * WN * WK)
#define WR_COLS (16 * RT * WN)      // a block's weight rows (Y columns)
#define WR_KB (128 * WK * SW)       // a block's K range (elements)
#define WR_STEP (128 * WK)          // elements from one of a warp's slices to its next
#define WR_CHUNK_BYTES (WN * WK * SW * RT * 2 * 32 * 16)  // a block's chunks in shared memory
static_assert(WK * 16 * WR_COLS * 4 <= WR_CHUNK_BYTES, "the partial sums fit where the chunks were");

// one slice of a lane: 16 bytes of rows g and g + 8 (h = 0, 1) of each row tile, their scale bits and zero points
struct RsSlice {
  uint4 bits[RT][2];
  unsigned short scale[RT][2];
  short zp[RT][2];
};

// A lane's chunks of the warp's slices wk, wk + WK, .. (slice q of tile j, half h: row n0 + 16j + 8h + g at
// element k0 + q * WR_STEP): the rows' pointers once, slice q's 16 bytes at a constant offset, the scale block
// stepped from slice to slice (block % 128 == 0: a slice lies in one block; no division a slice)
template <int WT>
struct RsStream {
  const u8* bits[RT][2];
  const unsigned short* scale;
  const u8* zero;
  bool row[RT][2];
  bool full;                       // the block's rows and K range lie within N and K (wr_body's FULL): every chunk
                                   // copied and every scale read unpredicated (first_copies)
  int left, lefts;                 // K - k0, K - the slice's first element: slice q's chunk holds elements of K
                                   // where q * WR_STEP < left, the slice where q * WR_STEP < lefts
  WqScaleIndex sc;                 // the next slice's scale index of row n
  int n0, k0_, nb_, block;         // the lane's row and first element, blocks a row, the block (start_scales)

  __device__ __forceinline__ RsStream(const u8* __restrict__ w, const ELEM* __restrict__ scale_,
                                      const void* __restrict__ zero_, int n, int N, int k0, int K, int ldw,
                                      int block_, int nb, bool full_) {
    full = full_;
    scale = reinterpret_cast<const unsigned short*>(scale_);
    zero = (const u8*)zero_;
    block = block_;
    left = K - k0;
    lefts = left + (k0 & 127);  // k0 = the slice's first element + 32 t
#pragma unroll
    for (int j = 0; j < RT; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        row[j][h] = n + 16 * j + 8 * h < N;
        bits[j][h] = w + (i64)(n + 16 * j + 8 * h) * ldw + k0 / 2;
      }
    n0 = n;
    k0_ = k0;
    nb_ = nb;
  }
  // the scale stream's start (two divisions by the block size): after the chunks' copies are issued
  __device__ __forceinline__ void start_scales() { sc.start(n0, k0_, nb_, block, WR_STEP); }
  // slice q's chunks to shared memory by cp.async (zeros past N or K: nothing read), the lane's own 16-byte slots
  // dst[(2 j + h) * 32] (a warp's copy of a chunk: 512 contiguous bytes)
  __device__ __forceinline__ void copy_of(uint4* dst, int q, const u8* __restrict__ any) const {
#pragma unroll
    for (int j = 0; j < RT; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const bool ok = row[j][h] && q * WR_STEP < left;
        wq_copy16(dst + (2 * j + h) * 32, ok ? bits[j][h] + q * (WR_STEP / 2) : any, ok);
      }
  }
  // every slice's copies, a commit group a slice; within bounds (full) the 2 * RT * SW copies back to back with no
  // predicate or pointer select computed for them
  __device__ __forceinline__ void first_copies(uint4* mine, const u8* __restrict__ any) const {
#pragma unroll
    for (int q = 0; q < SW; ++q) {
      if (full) {
#pragma unroll
        for (int j = 0; j < RT; ++j)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            wq_copy16(mine + q * RT * 2 * 32 + (2 * j + h) * 32, bits[j][h] + q * (WR_STEP / 2), true);
      } else {
        copy_of(mine + q * RT * 2 * 32, q, any);
      }
      asm volatile("cp.async.commit_group;" ::: "memory");
    }
  }
  // slice q's scale bits and zero points (q in load order), then step to the next slice
  __device__ __forceinline__ void scales_of(RsSlice& s, int q) {
#pragma unroll
    for (int j = 0; j < RT; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        // past N or a slice past K: a zero scale (the slice's sums times +0) and any zero point, read at index 0.
        // Not the lane's chunk: the lane's C holds the whole slice's sums (every t's chunk) for X rows 2t, 2t + 1
        const bool ok = full || (row[j][h] && q * WR_STEP < lefts);
        const int i = ok ? sc.at + (2 * j + h) * sc.nb8 : 0;
        s.scale[j][h] = ok ? scale[i] : (unsigned short)0;
        s.zp[j][h] = 0;
        if (zero) s.zp[j][h] = WT == WQ_I4 ? (short)(signed char)zero[i] : (short)zero[i];
      }
    sc.next();
  }
};


// 16 bytes of shared memory, in program order (ptxas otherwise hoists every slice's X loads ahead of the math)
__device__ __forceinline__ uint4 wr_lds(const unsigned short* p) {
  uint4 v;
  asm volatile("ld.volatile.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"((u32)__cvta_generic_to_shared(p)));
  return v;
}

// X's B words of a word: steps 2i (b[0], b[1]) and 2i + 1 (b[2], b[3]) from 8 elements x0..x7 of an X row
__device__ __forceinline__ void wr_b(const uint4& v, u32 (&b)[4]) {
  b[0] = wq_perm(v.x, v.z, 0x5410u);  // (x0, x4)
  b[1] = wq_perm(v.x, v.z, 0x7632u);  // (x1, x5)
  b[2] = wq_perm(v.y, v.w, 0x5410u);  // (x2, x6)
  b[3] = wq_perm(v.y, v.w, 0x7632u);  // (x3, x7)
}

// acc[j][mt] += scale(rows) * (slice's weights of tile j) x (X rows 8 mt + g of the lane's K positions); `two`:
// the row tile holds more than 8 X rows (the second column tile's mma); lo / hi: X rows g, g + 8 of the lane's
// 32 elements in shared memory (read only where those rows lie within the row tile)
template <int WT, bool two>
__device__ __forceinline__ void wr_slice(float (&acc)[RT][2][4], const RsSlice& s, const unsigned short* lo,
                                         const unsigned short* hi, bool lo_in, bool hi_in) {
  WqDequant<ELEM, WT> dq[RT][2];
#pragma unroll
  for (int j = 0; j < RT; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) dq[j][h] = WqDequant<ELEM, WT>((unsigned short)0, (int)s.zp[j][h]);
  float c[RT][2][4];
#pragma unroll
  for (int j = 0; j < RT; ++j)
#pragma unroll
    for (int e = 0; e < 8; ++e) c[j][e / 4][e % 4] = 0.f;
  const uint4 z4 = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    u32 b0[4], b1[4];
    wr_b(lo_in ? wr_lds(lo + 8 * i) : z4, b0);
    if (two) wr_b(hi_in ? wr_lds(hi + 8 * i) : z4, b1);
#pragma unroll
    for (int j = 0; j < RT; ++j) {
      const uint4& u = s.bits[j][0];
      const uint4& v = s.bits[j][1];
      u32 d0[4], d1[4];
      dq[j][0].diff(i == 0 ? u.x : i == 1 ? u.y : i == 2 ? u.z : u.w, d0);
      dq[j][1].diff(i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w, d1);
      const u32 ae[4] = {d0[0], d1[0], d0[1], d1[1]};  // step 2i: (c0, c4), (c1, c5) of rows g, g + 8
      const u32 ao[4] = {d0[2], d1[2], d0[3], d1[3]};  // step 2i + 1: (c2, c6), (c3, c7)
      wq_mma<ELEM>(c[j][0], ae, b0);
      wq_mma<ELEM>(c[j][0], ao, b0 + 2);
      if (two) {
        wq_mma<ELEM>(c[j][1], ae, b1);
        wq_mma<ELEM>(c[j][1], ao, b1 + 2);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < RT; ++j) {
    const float sg = wq_float<ELEM>(s.scale[j][0]), sh = wq_float<ELEM>(s.scale[j][1]);
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      acc[j][mt][0] = fmaf(c[j][mt][0], sg, acc[j][mt][0]);
      acc[j][mt][1] = fmaf(c[j][mt][1], sg, acc[j][mt][1]);
      acc[j][mt][2] = fmaf(c[j][mt][2], sh, acc[j][mt][2]);
      acc[j][mt][3] = fmaf(c[j][mt][3], sh, acc[j][mt][3]);
    }
  }
}

// cp.async group waits with an immediate count (wait_group N: all but this thread's newest N groups have landed)
template <int N> __device__ __forceinline__ void wr_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }
template <int Q> __device__ __forceinline__ void wr_wait_slice() { wr_wait<SW - 1 - Q>(); }

// the lane's slice q: its chunks from shared memory (after they landed), its scales and zero points from the ring
template <int Q>
__device__ __forceinline__ void wr_take(RsSlice& s, const RsSlice (&ring)[SW], const uint4* mine) {
  wr_wait_slice<Q>();
#pragma unroll
  for (int j = 0; j < RT; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      s.bits[j][h] = mine[(Q * RT * 2 + 2 * j + h) * 32];
      s.scale[j][h] = ring[Q].scale[j][h];
      s.zp[j][h] = ring[Q].zp[j][h];
    }
}

template <int WT, int Q>
__device__ __forceinline__ void wr_slices(float (&acc)[RT][2][4], const RsSlice (&ring)[SW], const uint4* mine,
                                          const unsigned short* xs, int xld, int wk, int slices, int rows, int g,
                                          int t) {
  if constexpr (Q < SW) {
    const int s = wk + Q * WK;
    if (s >= slices) return;  // Q ascending: every later slice lies past K too
    RsSlice cur;
    wr_take<Q>(cur, ring, mine);
    const unsigned short* lo = xs + g * xld + 128 * s + 32 * t;  // X row g of the lane's 32 elements
    if (rows > 8)
      wr_slice<WT, true>(acc, cur, lo, lo + 8 * xld, g < rows, g + 8 < rows);
    else
      wr_slice<WT, false>(acc, cur, lo, lo + 8 * xld, g < rows, false);
    wr_slices<WT, Q + 1>(acc, ring, mine, xs, xld, wk, slices, rows, g, t);
  }
}

template <int WT, bool FULL>
__device__ __forceinline__ void wr_body(unsigned char* smem, const ELEM* __restrict__ x,
                                        const u8* __restrict__ w, const ELEM* __restrict__ scale,
                                        const void* __restrict__ zero, const ELEM* __restrict__ bias,
                                        ELEM* __restrict__ y, int M, int N, int K, int ldw, int block, int nb,
                                        float* __restrict__ ws) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int wn = warp % WN, wk = warp / WN;
  const int n0 = blockIdx.x * WR_COLS + 16 * RT * wn, kb = blockIdx.z * WR_KB;
  const int slices = (K - kb < WR_KB ? K - kb + 127 : WR_KB) / 128;  // the block's slices holding elements of K
  const bool vec = (size_t)x % 16 == 0;                // K % 16 == 0: every row then starts 16-byte aligned
  const int xld = wq_stage_ld<WR_KB>(K);
  unsigned short* xs = reinterpret_cast<unsigned short*>(smem);
  // after X's min(16, M) rows: the warps' chunks, [warp][slice][tile][half][lane] 16 bytes; the block's partial
  // sums reuse them once every warp has taken its last slice
  unsigned char* wsm = smem + (M < 16 ? M : 16) * xld * (int)sizeof(ELEM);
  uint4* mine = reinterpret_cast<uint4*>(wsm) + warp * (SW * RT * 2 * 32) + lane;
  float* part = reinterpret_cast<float*>(wsm);
  for (int m0 = blockIdx.y * 16; m0 < M; m0 += gridDim.y * 16) {
    const int rows = M - m0 < 16 ? M - m0 : 16;
    // the weights first (each slice's chunks a cp.async group: the kernel's long pole, in flight before anything
    // else is computed), then X by plain loads (L2-resident, small), then the scale stream
    RsStream<WT> in(w, scale, zero, n0 + g, N, kb + wk * 128 + 32 * t, K, ldw, block, nb, FULL);
    in.first_copies(mine, w);
    PK_PDL_WAIT();  // with PDL: the chunks above stream in while the kernel before runs; X and Y wait for it
    wq_stage_loads<WR_THREADS>(xs, xld, x, m0, rows, kb, slices, M, K, vec);
    in.start_scales();
    RsSlice ring[SW];  // the slices' scales and zero points (their chunks land in shared memory)
#pragma unroll
    for (int q = 0; q < SW; ++q) in.scales_of(ring[q], q);
    __syncthreads();  // X staged by every thread
    float acc[RT][2][4];
#pragma unroll
    for (int j = 0; j < RT; ++j)
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[j][e / 4][e % 4] = 0.f;
    wr_slices<WT, 0>(acc, ring, mine, xs, xld, wk, slices, rows, g, t);
    wr_wait<0>();     // a slice past K returned early: its (empty) groups too, before part reuses the chunks
    __syncthreads();  // every warp's chunks are read: part may take their place
#pragma unroll
    for (int j = 0; j < RT; ++j)  // C of tile j, column tile mt: weight rows g, g + 8; X rows 8 mt + 2t, + 1
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        float* p = part + wk * 16 * WR_COLS + (8 * mt + 2 * t) * WR_COLS + 16 * RT * wn + 16 * j + g;
        p[0] = acc[j][mt][0];
        p[WR_COLS] = acc[j][mt][1];
        p[8] = acc[j][mt][2];
        p[WR_COLS + 8] = acc[j][mt][3];
      }
    __syncthreads();
    wq_block_sum<WK, WR_COLS, WR_THREADS>(part, bias, y, ws, m0, blockIdx.x * WR_COLS, M, N);  // K warps, wk order
    __syncthreads();  // part, the chunks and xs are reused by the next row tile
  }
  PK_PDL_WAIT();  // a block without a row tile waits too (a no-op after the first): the kernel completes after the one before
}

// ws: float [splits, M, N] of the K splits' sums (splits > 1; null at 1); dynamic shared memory: min(16, M) x
// wq_stage_ld<WR_KB>(K) ELEM, then WR_CHUNK_BYTES (the warps' chunks, later the partial sums). The parameter list is weight_only_mma_staged's (its weight_only_mma_reduce adds the splits).
extern "C" __global__ void __launch_bounds__(WR_THREADS, WR_MIN_BLOCKS)
weight_only_mma_rows(const ELEM* __restrict__ x, const u8* __restrict__ w, const ELEM* __restrict__ scale,
                     const void* __restrict__ zero, const ELEM* __restrict__ bias, ELEM* __restrict__ y, int M,
                     int N, int K, int ldw, int block, int nb, int wtype, float* __restrict__ ws, int splits) {
  PK_PDL_DEFER();  // only the weights (w, scale, zero) are read before wr_body's PK_PDL_WAIT
  extern __shared__ __align__(16) unsigned char wr_smem[];
  // the block's rows and K range within N and K (block-uniform; a slice's chunk starts at most (WK * SW - 1) * 128 + 96
  // elements into the range and holds 32): the body compiled with every bound known (FULL), its copies unpredicated
  // with nothing computed for them; tested here, outside the row-tile loop (ptxas hoists a body's loop-invariant
  // bounds above any test inside it: ~200 instructions before the first copy)
  const bool full = (int)(blockIdx.x + 1) * WR_COLS <= N && (int)(blockIdx.z + 1) * WR_KB <= K;
  if (wtype == WQ_I4) {
    if (full)
      wr_body<WQ_I4, true>(wr_smem, x, w, scale, zero, bias, y, M, N, K, ldw, block, nb, ws);
    else
      wr_body<WQ_I4, false>(wr_smem, x, w, scale, zero, bias, y, M, N, K, ldw, block, nb, ws);
  } else if (full) {
    wr_body<WQ_U4, true>(wr_smem, x, w, scale, zero, bias, y, M, N, K, ldw, block, nb, ws);
  } else {
    wr_body<WQ_U4, false>(wr_smem, x, w, scale, zero, bias, y, M, N, K, ldw, block, nb, ws);
  }
}

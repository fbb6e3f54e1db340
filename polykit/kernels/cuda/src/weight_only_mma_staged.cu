// weight_only_mma_staged: WeightOnlyMatMul (ai.polykit; compiler/ops/quant/weight_only.py) on tensor cores for
// W4A16 at small M, built to keep DRAM busy: Y = X @ dequantize(W)^T + B with mma.sync m16n8k16 (16-bit
// operands, float32 accumulate); tactics cuda.weight_only.mma_staged_c<8 * NT * WN>_k<128 * WK * SW>
// (kernels/cuda/int8/weight_only_mma_staged.py). weight_only_mma.cu's layouts, types and limits (X
// [M, K] ELEM half_t / bf16_t, W uint8 [N, ldw] int4 / uint4 two codes a byte, scale [N, nb] ELEM, zero
// point [N, nb] int8 / uint8 or null, B [N] or null, Y [M, N] ELEM; K % 16 == 0, block % 32 == 0) and its
// per-lane math (weight_only_mma.cuh: a lane's 16-byte chunk of 32 codes of a row dequantized bit for bit
// as the reference into the B operand, X byte-permuted into A in the same K order: wq_slice_mma).
//
// Why another geometry. weight_only_mma (ncu, H100, M = 1, its c32 tactic: 25.9 us at ncu's locked clocks,
// DRAM 10 %, 128 blocks of 256 threads, 191 registers, 1 block an SM, occupancy 12.5 %) is latency bound:
// its SASS issues each of a slice's 4 X loads (L1 / L2, inside bounds branches) and waits for it before the
// slice's mma, so a warp's 4 slices are ~16 dependent L2 round trips plus 2 dependent DRAM load groups
// of at most 32 KB an SM. DRAM at 3.35 TB/s (H100) / 4.8 TB/s (H200) with ~1 us of loaded latency wants
// ~3.4 / 4.8 MB in flight (Little's law), ~25-36 KB an SM: this kernel has each warp issue all its
// chunks at once (SW * NT 16-byte loads a lane, 128 B at SW = 4, NT = 2: 32 KB a block of 8 warps, 64 KB
// an SM at 2 blocks) before anything waits, stages X once a block in shared memory with cp.async (one
// round trip, shared by the WN column warps), and then does only math: one DRAM and one L2 round trip a
// row tile.
//
// Geometry: block = WN x WK warps (warp w: column group wn = w % WN, K group wk = w / WN); the block owns
// 8 * NT * WN columns (warp wn's NT n8 tiles from n0 = blockIdx.x * cols + 8 * NT * wn) and K range
// [kb, kb + KB), KB = 128 * WK * SW * PG, kb = blockIdx.z * KB (gridDim.z = splits = ceil(K / KB)); row
// tiles of 16 (m0 = blockIdx.y * 16, stepping by gridDim.y * 16: any M). Warp (wn, wk) takes slices wk,
// wk + WK, .., wk + (SW * PG - 1) * WK of the block's range (a slice: 128 elements, 4 lanes x 32 codes of a
// row, lane 4g + t loads chunk t of row n0 + 8j + g for each tile j, as in weight_only_mma.cu) through a
// ring of SW slices: it loads the first SW * NT chunks before any math, back to back (XsStream: a row's
// pointer once, slice q at an immediate offset, the scale block stepped without a division), and as slice
// q's math ends loads slice q + SW into its slot (PG = 1: no reloads, the whole range in flight at once).
// X rows m0 .. m0 + rows - 1 (rows = min(16, M - m0)) of the block's slices go to shared memory (dynamic,
// rows x xld ELEM, xld = min(KB, K rounded up to 128) + 8; the 16-byte pad a
// row keeps the 8 lanes of an lds.128 phase on distinct banks but for t and t + 2) by cp.async, 16 bytes a copy,
// zeros past K (src-size 0); X not 16-byte aligned is staged element by element instead. A lane then
// reads its 16 bytes of row g (row g + 8 at M - m0 > 8) per word from shared memory (rows past M read as
// zero without touching shared memory). The WK warps' C fragments go to shared memory (part[WK][16][cols]
// floats) and the block sums them in wk order; with splits == 1 it writes Y = ELEM(sum + float(B)), else
// the float sum to the workspace ws[z][m][n] and weight_only_mma_reduce adds the splits in z order, then B
// (fixed orders everywhere: deterministic). Slices past K are skipped, chunks past N or K are zero.
//
// Row tiles of at most 8 rows (decode, M <= 8; a last partial tile) swap the mma's operands (xs_slices<SWAP>,
// wq_slice_mma_t): the weights are A, a warp's two n8 tiles the m16 tile's rows g and g + 8, and X is B, its n8
// columns the tile's rows. An mma then takes 256 weights instead of 128, X's byte-permutes are half (row g's
// only), and no register is a zero row of X; C's columns are X's rows (part's layout is unchanged). A lane of
// a row past the tile reads X row 0 instead of zeros (no zeroing or predicated loads): such a row (A's row,
// or B's column when swapped) feeds only C entries of rows past the tile, which are never stored.
// SASS (cuobjdump, sm_90, c16_k4096, float16, one weight type): 1894 instructions a thread before, 1583 on the
// swapped path (no IMAD.MOV of the nibble masks: weight_only_mma.cuh's wq_masks; no CS2R zeros) and 1702 on
// the other, 92 / 127 registers.
//
// Loads first (twenty-third session; SASS only, NOT timed: no device was lent). ptxas had put the weights' first
// LDG.128 222 instructions into the kernel (c16_k4096, float16, int4, swapped path), behind the scale stream's two
// integer divisions (~30 dependent instructions each) and the bounds of every chunk, and the 8 loads spread over 95
// instructions; ncu put the kernel at ~11 cycles between a warp's instructions, so the DRAM stream started ~1 us
// late (an ESTIMATE). Now: a block whose columns and K range lie within N and K (every block of N = K = 4096) runs
// the body compiled FULL (tested once at entry, outside the row-tile loop: ptxas hoists loop-invariant bounds above
// any test inside it), whose loads carry no predicate; the scale stream starts after them (start_scales), a
// power-of-two block by a shift and a mask (wq_divmod). The first LDG.128 is the 38th instruction, all 8 within 13.
// Numerics: weight_only_mma.cu's: each weight the reference's value (one rounding to ELEM); float32 sums
// (the mma's own order inside an instruction, then a lane's slices in order, or with swapped operands slice q in
// set q % SW and the sets in order; the WK warps in order, the splits in order); Y = ELEM(sum + float(B)), one
// rounding. Except scale-after (xs_slices' AFTER: a row tile of at most 8 rows, one group, a block a multiple of
// 128, the block within N and K, what decode's layers are): weight_only_mma_rows.cu's numerics, value - zero point
// exact in the mma, each slice's float32 sums times the scale by one fma into the sum in slice order; the weights
// never rounded to ELEM (tests: within TOLERANCE of the reference plus its own rounding's departure). SASS of that
// path (c16_k4096, float16, int4): 1412 instructions a thread, 1549 with the scaled weights (no HMUL2: 128 fewer).
//
// Registers and occupancy (cuobjdump -res-usage of NVRTC's cubins, sm_90 and sm_80, no spills; benchmarks/
// cuda_sass.py --w4 TILE): __launch_bounds__(threads, XS_MIN_BLOCKS) asks ptxas for <= 128 a thread at PG = 1
// and gets 124-128: 2 blocks an SM of 256 threads (c16_k4096, c32_k2048, c64_k1024), 1 of 512 (c32_k4096),
// 16 warps an SM either way, each with SW * NT = 8 chunks (128 B a lane) in flight: 64 KB an SM, 8.4 MB over
// 132 SMs, i.e. all of N = K = 4096's packed weights in one wave. The ring tiles (PG = 2) keep the stream's
// pointers live through the math and spill at 128: they ask for <= 168 (163-168: 3 blocks of 128 threads an
// SM, c16_k4096_p2; 1 of 256, c32_k4096_p2), 32 KB in flight an SM at M = 1. Shared memory (min(16, M) x
// xld x 2 + part: 8 KB at 256 threads, 16 KB at 512) bounds it further at KB = 4096 and M > 8 (up to 131 KB
// + part: 1 block an SM; the tactics run on sm_80 / sm_90 only, whose blocks take 163 / 227 KB).
//
// Cost (counted from the source and modelled in weight_only_mma_staged.py's staged_us; not measured) at
// N = K = 4096, int4 blocked 128, float16 X. Bytes: packed weights 8.4 MB + scales / zero points 0.4 MB
// from DRAM once (2.6 us at 3.35 TB/s, H100; 1.8 us at 4.8 TB/s, H200); X once a block from L2 (N / cols
// blocks each read M x K x 2 bytes: 2 MB at M = 1 for c16; 33.5 / 16.8 / 8.4 MB at M = 16 for 16 / 32 /
// 64 columns a block); split, a float32 workspace written and read once (M x N x 4 x splits: 1 MB at
// M = 16, 4 splits). Instructions a lane-element: dequantization 2 (float16) / 2.5 (bfloat16), the mma
// 0.25, X's lds and 8 byte-permutes a word shared by NT tiles 10 / 8 / NT (half at M <= 8), a chunk's
// address, scale and zero point ~0.25 (XsStream; 0.4 before it): ~3.1 at NT = 2, ~2 us of issue on 132
// SMs. Latency: one DRAM round trip (the chunks) overlapped with one L2 round trip (X's copies), then only
// math (~200 warp-instructions a slice at NT = 2, 4 slices a ring: ~0.5 us a ring at a scheduler's rate, 4
// warps a scheduler at 16 warps an SM) and the block's sum.
// staged_us (the family's H100 constants: 3.0 TB/s, 3 us of launch and events a layer; L2 assumed
// 5.5 TB/s; a reduce 1.5 us + its bytes; the math left when the last bytes land: one ring, up to every ring
// in flight on a scheduler as the math's load nears the stream's), the layer's time: M = 1 c16_k4096 7.0 us,
// c16_k4096_p2 6.5; M = 16 c32_k4096 8.6, c32_k4096_p2 8.3 (X's L2 re-reads bound it; without a K split
// every SM needs all of X, 132 x 128 KB = 16.9 MB, which c32_k4096's 128 blocks already come to). Measured
// (H100, before the loads went back to back): 10.1 / 14.5 us, against the fp16 GEMM's 16.0 / 15.6 us and
// issue 35's 2.5x (<= 6.4 / 6.2 us): the model is short of the measurement by ~3 / ~6 us.
// Defines: ELEM (half_t, bf16_t), WN, WK (warps across columns / K), NT (n8 tiles a warp), SW (slices a
// warp's ring holds), PG (groups of SW slices a warp streams), XS_MIN_BLOCKS (blocks an SM asked of ptxas).
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
#ifndef NT
#define NT 2
#endif
#ifndef SW
#define SW 4
#endif
#ifndef PG
#define PG 1
#endif
#ifndef XS_MIN_BLOCKS
#define XS_MIN_BLOCKS 2
#endif
#ifndef XS_ROLLED
#define XS_ROLLED 0  // 1: decode's blocks (xs_rolled) land their weights in shared memory and run one slice body SW times
#endif
#define XS_THREADS (32 * WN * WK)
#define XS_COLS (8 * NT * WN)  // a block's columns
#define XS_KB (128 * WK * SW * PG)  // a block's K range (elements)
#define XS_STEP (128 * WK)          // elements from one of a warp's slices to its next
// XS_ROLLED: the weights' landing slots at the start of the dynamic shared memory (16 bytes a lane a chunk)
#define XS_WBUF_BYTES (XS_ROLLED ? XS_THREADS * SW * NT * 16 : 0)

// A lane's chunks of the warp's slices wk, wk + WK, .. (slice q's chunk of tile j: row n0 + 8j + g, element
// k0 + q * XS_STEP): the rows' pointers are computed once, so slice q's 16 bytes lie at a constant offset
// (q * XS_STEP / 2 bytes: an immediate of the load) and its scale block follows from the previous slice's
// by a constant step and at most one carry (no division a chunk)
template <int WT>
struct XsStream {
  const u8* bits[NT];              // tile j's row at element k0 (a row past N: never read)
  const unsigned short* scale;     // the kernel's scale and zero point arguments (uniform)
  const u8* zero;
  bool row[NT];                    // tile j's row lies within N
  bool full;                       // the block's columns and K range lie within N and K (block-uniform): every
                                   // chunk and scale is read unpredicated, no bounds computed before the loads
  int left;                        // K - k0: slice q holds elements of K where q * XS_STEP < left
  WqScaleIndex sc;                 // the next slice to load: tile 0's scale index
  int n0_, k0_, nb_, block;        // the lane's row and first element, blocks a row, the block (start_scales)

  // the chunks' pointers and bounds only: the weights' loads (bits_of) go out before start_scales' divisions
  __device__ __forceinline__ XsStream(const u8* __restrict__ w, const ELEM* __restrict__ scale_,
                                      const void* __restrict__ zero_, int n0, int N, int k0, int K, int ldw,
                                      int block_, int nb, bool full_) {
    scale = reinterpret_cast<const unsigned short*>(scale_);
    zero = (const u8*)zero_;
    block = block_;
    full = full_;
    left = K - k0;
    n0_ = n0;
    k0_ = k0;
    nb_ = nb;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      row[j] = n0 + 8 * j < N;
      bits[j] = w + (i64)(n0 + 8 * j) * ldw + k0 / 2;
    }
  }
  // the scale stream's start (two divisions by the block size: wq_divmod), after the chunks' loads are issued
  __device__ __forceinline__ void start_scales() { sc.start(n0_, k0_, nb_, block, XS_STEP); }
  // slice q's 16 bytes a tile (zeros past N or K)
  __device__ __forceinline__ void bits_of(WqChunk (&c)[NT], int q) const {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      c[j].bits = make_uint4(0u, 0u, 0u, 0u);
      if (full || (row[j] && q * XS_STEP < left))
        c[j].bits = *reinterpret_cast<const uint4*>(bits[j] + q * (XS_STEP / 2));
    }
  }
  // the ring's first SW slices (bits_of's), behind one test of `full`: within bounds, the SW * NT loads back to back
  // with no predicate or zero computed before them
  __device__ __forceinline__ void first_bits(WqChunk (&ch)[SW][NT]) const {
    if (full) {
#pragma unroll
      for (int q = 0; q < SW; ++q)
#pragma unroll
        for (int j = 0; j < NT; ++j) ch[q][j].bits = *reinterpret_cast<const uint4*>(bits[j] + q * (XS_STEP / 2));
    } else {
#pragma unroll
      for (int q = 0; q < SW; ++q) bits_of(ch[q], q);
    }
  }
  // slice q's scale bits and zero points (the next slice's: q in load order), then step to the next slice
  __device__ __forceinline__ void scales_of(WqChunk (&c)[NT], int q) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      // past N or K: a zero scale (every weight +-0, and an mma sum that starts at +0 stays as it is) and
      // any zero point, read at index 0 (one predicate fewer live while the loads leave)
      const bool ok = full || (row[j] && q * XS_STEP < left);
      const int i = ok ? sc.at + j * sc.nb8 : 0;
      c[j].scale = ok ? scale[i] : (unsigned short)0;
      c[j].zp = 0;
      if (zero) c[j].zp = WT == WQ_I4 ? (int)(signed char)zero[i] : (int)zero[i];
    }
    sc.next();
  }
};

// x where A holds, else y (arrays of different shapes: no conditional expression joins them)
template <bool A, class X, class Y>
__device__ __forceinline__ decltype(auto) xs_pick(X& x, Y& y) {
  if constexpr (A)
    return (x);
  else
    return (y);
}

// a lane's place in the block: warp (wn, wk), lane g, t, its tiles' first column n0 and the block's K range start kb
struct XsLane {
  int warp, lane, g, t, wn, wk, n0, kb;
  __device__ __forceinline__ XsLane() {
    warp = threadIdx.x >> 5;
    lane = threadIdx.x & 31;
    g = lane >> 2;
    t = lane & 3;
    wn = warp % WN;
    wk = warp / WN;
    n0 = blockIdx.x * XS_COLS + 8 * NT * wn;
    kb = blockIdx.z * XS_KB;
  }
};

// scale-after: acc = fma(a slice's sums, its rows' scales, acc); c0, c1 row g (tile 2p), c2, c3 row g + 8 (tile 2p + 1)
__device__ __forceinline__ void xs_scaled_add(float (&acc)[NT / 2][4], const float (&sums)[NT / 2][4],
                                              const WqChunk (&c)[NT]) {
#pragma unroll
  for (int p = 0; p < NT / 2; ++p) {
    const float sg = wq_float<ELEM>(c[2 * p].scale), sh = wq_float<ELEM>(c[2 * p + 1].scale);
    acc[p][0] = fmaf(sums[p][0], sg, acc[p][0]);
    acc[p][1] = fmaf(sums[p][1], sg, acc[p][1]);
    acc[p][2] = fmaf(sums[p][2], sh, acc[p][2]);
    acc[p][3] = fmaf(sums[p][3], sh, acc[p][3]);
  }
}

// the swapped path's C to the block's partial sums: part[wk][m][n], the warp's columns; C of pair j holds columns
// 16j + g (c0, c1) and 16j + 8 + g (c2, c3) of X rows 2t, 2t + 1
__device__ __forceinline__ void xs_store_swapped(float* part, const float (&acc)[NT / 2][4], int wk, int wn, int g,
                                                 int t) {
  float* p = part + wk * 16 * XS_COLS + 8 * NT * wn;
#pragma unroll
  for (int j = 0; j < NT / 2; ++j) {
    p[2 * t * XS_COLS + 16 * j + g] = acc[j][0];
    p[(2 * t + 1) * XS_COLS + 16 * j + g] = acc[j][1];
    p[2 * t * XS_COLS + 16 * j + 8 + g] = acc[j][2];
    p[(2 * t + 1) * XS_COLS + 16 * j + 8 + g] = acc[j][3];
  }
}

// the warp's slices of a row tile (slice q from ring slot q % SW, then slice q + SW into that slot), into its C
// fragments, then to the block's partial sums part[wk]. SWAP: a tile of at most 8 rows, the operands swapped
// (wq_slice_mma_t: acc[p] for tile pairs p); else wq_slice_mma (acc[j] for tiles j, rows g and g + 8).
// SWAP's C has SW sets, slice q's mma steps summing into set q % SW (each a chain of 8 dependent mma a slice where
// one set chained all 8 * SW * PG of the warp). AFTER (SWAP, one group: set q is slice q's alone, and a block a
// multiple of 128: a slice's 128 elements, all 4 lanes' chunks, in one scale block) the mma take value - zero
// point (exact) and each set is scaled once at the end: acc = fma(set q, scale of its rows, acc) in q order
// (weight_only_mma_rows.cu's numerics, the weights never rounded to ELEM; 4 multiplies a word fewer); else the
// sets (scaled weights, the reference's) are added in order. FULL: every slice lies within K.
template <int WT, bool SWAP, bool FULL, bool AFTER>
__device__ __forceinline__ void xs_slices(float* part, WqChunk (&ch)[SW][NT], XsStream<WT>& in,
                                          const unsigned short* xs, int xld, int wk, int wn, int slices, int rows,
                                          int g, int t) {
  static_assert(!AFTER || (SWAP && PG == 1), "scale-after sets hold one slice each");
  constexpr int SETS = SWAP ? SW : 1;
  float sets[SETS][SWAP ? NT / 2 : NT][4];
#pragma unroll
  for (int c = 0; c < SETS; ++c)
#pragma unroll
    for (int j = 0; j < (SWAP ? NT / 2 : NT); ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) sets[c][j][e] = 0.f;
  float scaled[AFTER ? NT / 2 : 1][4];
  auto& acc = xs_pick<AFTER>(scaled, sets[0]);  // the sum: scaled (AFTER), else set 0
#pragma unroll
  for (int q = 0; q < SW * PG; ++q) {
    const int s = wk + q * WK;
    if (!FULL && s >= slices) break;  // q ascending: every later slice lies past K too (none of them loaded)
    // the lane's 32 elements of X rows g and g + 8; a row past the tile reads row 0 instead: it only feeds C's
    // entries of that row (A's row, or B's column when swapped), which are never stored
    const unsigned short* lo = xs + (g < rows ? g : 0) * xld + 128 * s + 32 * t;
    const unsigned short* hi = xs + (g + 8 < rows ? g + 8 : 0) * xld + 128 * s + 32 * t;
    if constexpr (SWAP) {
      wq_slice_mma_t<ELEM, WT, NT, AFTER>(sets[q % SETS], ch[q % SW],
                                          [=](int i) { return *reinterpret_cast<const uint4*>(lo + 8 * i); });
    } else {
      wq_slice_mma<ELEM, WT, NT>(acc, ch[q % SW], [=](int i, uint4& a, uint4& b) {
        a = *reinterpret_cast<const uint4*>(lo + 8 * i);
        b = *reinterpret_cast<const uint4*>(hi + 8 * i);
      });
    }
    if (q + SW < SW * PG) {
      in.bits_of(ch[q % SW], q + SW);
      in.scales_of(ch[q % SW], q + SW);
    }
  }
  if constexpr (AFTER) {  // set q times its rows' scales (xs_scaled_add), in q order from zero
#pragma unroll
    for (int p = 0; p < NT / 2; ++p)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[p][e] = 0.f;
#pragma unroll
    for (int c = 0; c < SETS; ++c) xs_scaled_add(acc, sets[c], ch[c]);
  } else {
#pragma unroll
    for (int c = 1; c < SETS; ++c)  // (SWAP) the sets in order
#pragma unroll
      for (int j = 0; j < (SWAP ? NT / 2 : NT); ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] += sets[c][j][e];
  }
  float* p = part + wk * 16 * XS_COLS + 8 * NT * wn;  // part[wk][m][n]: this warp's columns
  if constexpr (SWAP) {
    xs_store_swapped(part, acc, wk, wn, g, t);
  } else {
#pragma unroll
    for (int j = 0; j < NT; ++j) {  // C fragment: rows g, g + 8; columns 2t, 2t + 1 of tile j
      p[g * XS_COLS + 8 * j + 2 * t] = acc[j][0];
      p[g * XS_COLS + 8 * j + 2 * t + 1] = acc[j][1];
      p[(g + 8) * XS_COLS + 8 * j + 2 * t] = acc[j][2];
      p[(g + 8) * XS_COLS + 8 * j + 2 * t + 1] = acc[j][3];
    }
  }
}

#if XS_ROLLED
// cp.async.wait_group n for an n known only at run time, 0 <= n <= N (wait_group takes an immediate): a compare a count
template <int N>
__device__ __forceinline__ void xs_wait_groups(int n) {
  if constexpr (N == 0) {
    asm volatile("cp.async.wait_group 0;" ::: "memory");
  } else if (n >= N) {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
  } else {
    xs_wait_groups<N - 1>(n);
  }
}

// XS_ROLLED (tactics cuda.weight_only.mma_staged_*_r): a block within N and K (FULL) at M <= 8 with blocks a multiple
// of 128, what decode's layers are, runs this instead of xs_slices' unrolled scale-after path. The twenty-fourth
// session's ncu of that path (c16_k4096, M = 1, H100) put 57 % of a warp's cycles between instructions on "no
// instruction": a warp runs ~1,400 SASS instructions once, straight through, and waits for their fetch. Here the
// weights' SW * NT chunks a lane go to shared memory by cp.async (one group a slice, issued first as xs_body's
// loads are; no registers hold them, so none need an index known at compile time), and one slice body runs SW
// times (#pragma unroll 1): slice q waits for its group (wait_group SW - 1 - q; a lane reads only the chunks it
// copied), reads its chunks (lds.128), loads slice q + 1's scales and zero points ahead, and does xs_slices' AFTER
// math. Numerics: xs_slices' AFTER bit for bit (each slice's sums from zero in the same mma order, then
// acc = fma(sums, the rows' scale, acc) in slice order, acc from zero). X is staged by plain loads
// (wq_stage_loads: wq_stage's wait_all would wait for the weights' groups too).
template <int WT>
__device__ __forceinline__ void xs_rolled(unsigned short* xs, uint4* wb, float* part, const ELEM* __restrict__ x,
                                          const u8* __restrict__ w, const ELEM* __restrict__ scale,
                                          const void* __restrict__ zero, const ELEM* __restrict__ bias,
                                          ELEM* __restrict__ y, int M, int N, int K, int ldw, int block, int nb,
                                          float* __restrict__ ws) {
  const XsLane L;
  const int g = L.g, t = L.t, wk = L.wk, kb = L.kb;
  const bool vec = (size_t)x % 16 == 0;
  const int xld = wq_stage_ld<XS_KB>(K);
  uint4* mine = wb + L.warp * (SW * NT * 32) + L.lane;  // slot (q, j): mine[(q * NT + j) * 32]
  for (int m0 = blockIdx.y * 16; m0 < M; m0 += gridDim.y * 16) {
    const int rows = M - m0 < 16 ? M - m0 : 16;
    XsStream<WT> in(w, scale, zero, L.n0 + g, N, kb + wk * 128 + 32 * t, K, ldw, block, nb, true);
#pragma unroll
    for (int q = 0; q < SW; ++q) {
#pragma unroll
      for (int j = 0; j < NT; ++j) wq_copy16(mine + (q * NT + j) * 32, in.bits[j] + q * (XS_STEP / 2), true);
      asm volatile("cp.async.commit_group;" ::: "memory");
    }
    in.start_scales();
    WqChunk next[NT];  // the next slice's scales and zero points (bits unused)
    in.scales_of(next, 0);
    PK_PDL_WAIT();  // with PDL: the weights above were read while the kernel before ran; X and Y wait for it
    wq_stage_loads<XS_THREADS>(xs, xld, x, m0, rows, kb, XS_KB / 128, M, K, vec);
    __syncthreads();
    // the lane's 32 elements of X row g of each slice; a row past the tile reads row 0 (as xs_slices)
    const unsigned short* xrow = xs + (g < rows ? g : 0) * xld + 128 * wk + 32 * t;
    float acc[NT / 2][4];
#pragma unroll
    for (int p = 0; p < NT / 2; ++p)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[p][e] = 0.f;
#pragma unroll 1
    for (int q = 0; q < SW; ++q) {
      WqChunk cur[NT];
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        cur[j].scale = next[j].scale;
        cur[j].zp = next[j].zp;
      }
      if (q + 1 < SW) in.scales_of(next, q + 1);
      xs_wait_groups<SW - 1>(SW - 1 - q);
#pragma unroll
      for (int j = 0; j < NT; ++j) cur[j].bits = mine[(q * NT + j) * 32];  // (the wait's "memory" clobber orders it)
      float sums[NT / 2][4];
#pragma unroll
      for (int p = 0; p < NT / 2; ++p)
#pragma unroll
        for (int e = 0; e < 4; ++e) sums[p][e] = 0.f;
      const unsigned short* lo = xrow + q * XS_STEP;
      wq_slice_mma_t<ELEM, WT, NT, true>(sums, cur, [=](int i) { return *reinterpret_cast<const uint4*>(lo + 8 * i); });
      xs_scaled_add(acc, sums, cur);
    }
    xs_store_swapped(part, acc, wk, L.wn, g, t);
    __syncthreads();
    wq_block_sum<WK, XS_COLS, XS_THREADS>(part, bias, y, ws, m0, blockIdx.x * XS_COLS, M, N);
    __syncthreads();  // part, xs and the weights' slots are reused by the next row tile
  }
  PK_PDL_WAIT();
}
#endif

template <int WT, bool FULL>
__device__ __forceinline__ void xs_body(unsigned short* xs, float* part, const ELEM* __restrict__ x,
                                        const u8* __restrict__ w, const ELEM* __restrict__ scale,
                                        const void* __restrict__ zero, const ELEM* __restrict__ bias,
                                        ELEM* __restrict__ y, int M, int N, int K, int ldw, int block, int nb,
                                        float* __restrict__ ws) {
  const XsLane L;
  const int g = L.g, t = L.t, wn = L.wn, wk = L.wk, n0 = L.n0, kb = L.kb;
  const int slices = (K - kb < XS_KB ? K - kb + 127 : XS_KB) / 128;  // the block's slices holding elements of K
  const bool vec = (size_t)x % 16 == 0;                // K % 16 == 0: every row then starts 16-byte aligned
  const int xld = wq_stage_ld<XS_KB>(K);
  for (int m0 = blockIdx.y * 16; m0 < M; m0 += gridDim.y * 16) {
    const int rows = M - m0 < 16 ? M - m0 : 16;
    // built a row tile (a block has one but where M > 16 * 65535): nothing of it stays live through the math
    XsStream<WT> in(w, scale, zero, n0 + g, N, kb + wk * 128 + 32 * t, K, ldw, block, nb, FULL);
    WqChunk ch[SW][NT];  // a ring of SW slices: the first SW in flight before anything waits
    in.first_bits(ch);
    in.start_scales();
#pragma unroll
    for (int q = 0; q < SW; ++q) in.scales_of(ch[q], q);
    PK_PDL_WAIT();  // with PDL: the weights above were read while the kernel before ran; X and Y wait for it
    wq_stage<XS_THREADS>(xs, xld, x, m0, rows, kb, slices, M, K, vec);
    __syncthreads();
    // uniform across the block; AFTER in the FULL body only (a bounded block is the rare partial one: one variant fewer)
    if (FULL && rows <= 8 && PG == 1 && (block & 127) == 0)
      xs_slices<WT, true, FULL, FULL && PG == 1>(part, ch, in, xs, xld, wk, wn, slices, rows, g, t);
    else if (rows <= 8)
      xs_slices<WT, true, FULL, false>(part, ch, in, xs, xld, wk, wn, slices, rows, g, t);
    else
      xs_slices<WT, false, FULL, false>(part, ch, in, xs, xld, wk, wn, slices, rows, g, t);
    __syncthreads();
    wq_block_sum<WK, XS_COLS, XS_THREADS>(part, bias, y, ws, m0, blockIdx.x * XS_COLS, M, N);  // K warps, wk order
    __syncthreads();  // part and xs are reused by the next row tile
  }
  PK_PDL_WAIT();  // a block without a row tile waits too (a no-op after the first): the kernel completes after the one before
}

// ws: float [splits, M, N] of the K splits' sums (splits > 1; null at 1); dynamic shared memory:
// min(16, M) x wq_stage_ld<XS_KB>(K) ELEM
extern "C" __global__ void __launch_bounds__(XS_THREADS, XS_MIN_BLOCKS)
weight_only_mma_staged(const ELEM* __restrict__ x, const u8* __restrict__ w, const ELEM* __restrict__ scale,
                       const void* __restrict__ zero, const ELEM* __restrict__ bias, ELEM* __restrict__ y, int M,
                       int N, int K, int ldw, int block, int nb, int wtype, float* __restrict__ ws, int splits) {
  PK_PDL_DEFER();  // only the weights (w, scale, zero) are read before xs_body's PK_PDL_WAIT
  extern __shared__ __align__(16) unsigned char xs_smem[];
  __shared__ float part[WK * 16 * XS_COLS];
  unsigned short* xs = reinterpret_cast<unsigned short*>(xs_smem + XS_WBUF_BYTES);
  // the block's columns and K range within N and K (block-uniform; a slice's chunk starts at most (WK * SW * PG - 1)
  // * 128 + 96 elements into the range and holds 32, so a range within K holds every chunk whole): the body compiled
  // with every bound known (FULL), whose loads go out unpredicated with nothing computed for them; tested here, outside
  // the row-tile loop, as ptxas hoists a body's loop-invariant bounds above any test inside it
  const bool full = (int)(blockIdx.x + 1) * XS_COLS <= N && (int)(blockIdx.z + 1) * XS_KB <= K;
#if XS_ROLLED
  if (full && M <= 8 && PG == 1 && (block & 127) == 0) {  // block-uniform: decode's blocks (xs_rolled)
    uint4* wb = reinterpret_cast<uint4*>(xs_smem);
    if (wtype == WQ_I4)
      xs_rolled<WQ_I4>(xs, wb, part, x, w, scale, zero, bias, y, M, N, K, ldw, block, nb, ws);
    else
      xs_rolled<WQ_U4>(xs, wb, part, x, w, scale, zero, bias, y, M, N, K, ldw, block, nb, ws);
    return;
  }
#endif
  if (wtype == WQ_I4) {
    if (full)
      xs_body<WQ_I4, true>(xs, part, x, w, scale, zero, bias, y, M, N, K, ldw, block, nb, ws);
    else
      xs_body<WQ_I4, false>(xs, part, x, w, scale, zero, bias, y, M, N, K, ldw, block, nb, ws);
  } else if (full) {
    xs_body<WQ_U4, true>(xs, part, x, w, scale, zero, bias, y, M, N, K, ldw, block, nb, ws);
  } else {
    xs_body<WQ_U4, false>(xs, part, x, w, scale, zero, bias, y, M, N, K, ldw, block, nb, ws);
  }
}

// Y[m, n] = ELEM(ws[0][m][n] + ws[1][m][n] + .. (splits, in order) + float(B[n])); grid-stride over M x N
extern "C" __global__ void weight_only_mma_reduce(const ELEM* __restrict__ x, const u8* __restrict__ w,
                                                  const ELEM* __restrict__ scale, const void* __restrict__ zero,
                                                  const ELEM* __restrict__ bias, ELEM* __restrict__ y, int M, int N,
                                                  int K, int ldw, int block, int nb, int wtype,
                                                  float* __restrict__ ws, int splits) {
  const i64 total = (i64)M * N;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
    float v = ws[i];
    for (int z = 1; z < splits; ++z) v += ws[z * total + i];
    st(y, i, bias ? __fadd_rn(v, ld(bias, (i64)(i % N))) : v);
  }
}

// The Hopper GEMM family's epilogue and consumer loop (gemm_sm90.cu, conv_sm90.cu): OutP (alpha,
// beta * C, the fused epilogue, fp16 / bf16 / tf32-rounded float stores of column pairs as the
// accumulators lie), the 16-byte path where vector_ok allows (a transpose across each quad of
// lanes, quad_row, then 8 consecutive columns a lane: finish_rows), the INT8 output (OutI8 over
// int8_out.cuh's Out; with F8 the same on float sums), and consume: each tile's K loop
// (gemm_sm90_core.cuh), then its epilogue.
// OUT_ROW_STRIDE (define, 0 unless the including kernel sets it: conv_sm90.cu): OutP stores row m of
// Y at m * ldy (a runtime value; a Concat's slice when the convolution's output is placed there,
// polykit.compiler.builder.concat_placement) instead of m * N; C and the epilogue's inputs keep the
// dense index. The pair and 16-byte stores are taken only where ldy and Y keep them aligned.
// D2S_H, D2S_W (defines, 1 unless set; with OUT_ROW_STRIDE only: a ConvNHWC with depth_to_space
// [bH, bW], ops/nn/channels_last.py): row m = conv pixel (img, oh, ow) of the d2s_ow-wide grid, column
// n = (dy, dx, c) with c < d2s_cb; element (m, n) goes to Y at yrow(m) + ycol(n), pixel (img, oh * D2S_H
// + dy, ow * D2S_W + dx) of Y [.., OW * D2S_W, N / (D2S_H * D2S_W)], channel c. The tactics take it
// only where d2s_cb % 8 == 0, so a pair or 16-byte group of columns never leaves its block.
#pragma once
#include "gemm_sm90_core.cuh"
#ifndef OUT_ROW_STRIDE
#define OUT_ROW_STRIDE 0
#endif
#include "depth_to_space.cuh"
#if D2S && !OUT_ROW_STRIDE
#error "depth-to-space stores (D2S_H, D2S_W) need OUT_ROW_STRIDE"
#endif

struct OutP {
  ELEM* Y;
  const ELEM* C;
  i64 M, N, scm, scn;
  float alpha, beta;
#if HAS_EPILOGUE
  EpiState epi;
#endif
#if OUT_ROW_STRIDE
  i64 ldy;  // elements between consecutive rows of Y (N when dense)
  __device__ __forceinline__ i64 row_stride() const { return ldy; }
  // pairs of columns stored as one word: rows and Y aligned to a pair
  __device__ __forceinline__ bool pairs_ok() const {
    return ((N | ldy) & 1) == 0 && ((u64)Y & (2 * sizeof(ELEM) - 1)) == 0;
  }
#else
  __device__ __forceinline__ i64 row_stride() const { return N; }
  __device__ __forceinline__ bool pairs_ok() const { return (N & 1) == 0; }
#endif
#if D2S
  i64 d2s_ow, d2s_cb;  // the conv's output width, channels of a block (N / (D2S_H * D2S_W))
  // Y's offset of row m's first block, then of column n from it
  __device__ __forceinline__ i64 yrow(i64 z, i64 m) const { return d2s_row(z * M + m, d2s_ow, ldy); }
  __device__ __forceinline__ i64 ycol(i64 n) const { return d2s_col(n, d2s_cb, d2s_ow, ldy); }
#else
  // Y's offset of row m, then of column n from it
  __device__ __forceinline__ i64 yrow(i64 z, i64 m) const { return (z * M + m) * row_stride(); }
  __device__ __forceinline__ i64 ycol(i64 n) const { return n; }
#endif
  // alpha * acc (+ beta * c) with explicit roundings (one fma with C): the pair stores and the
  // 16-byte paths (finish8, finish_rows) compute every element alike, bit for bit
  __device__ __forceinline__ float scaled(float acc) const { return __fmul_rn(alpha, acc); }
  __device__ __forceinline__ float scaled(float acc, float c) const { return __fmaf_rn(beta, c, __fmul_rn(alpha, acc)); }
  __device__ __forceinline__ float value(i64 z, i64 m, i64 n, float acc) const {
    float v = C ? scaled(acc, (float)ld(C, m * scm + n * scn)) : scaled(acc);
#if HAS_EPILOGUE
    v = apply_epilogue(epi, v, (z * M + m) * N + n, n);
#endif
    return v;
  }
  // columns n, n + 1 of row m (n even), values already final; pairs need N even (aligned pairs).
  // float storage (tf32 layers) stores tf32-rounded values: the next tf32 layer reads them
  // exactly instead of truncating their low mantissa bits (a bias that compounds over layers).
  __device__ __forceinline__ void store2(i64 z, i64 m, i64 n, float a, float b) const {
    if (m >= M || n >= N) return;
    if (sizeof(ELEM) == 4 && !SPLIT3) {
      a = tf32_round(a);
      b = tf32_round(b);
    }
    ELEM* y = Y + yrow(z, m) + ycol(n);
    if (n + 1 < N) {
      if (pairs_ok()) {
        struct __align__(2 * sizeof(ELEM)) Pair { ELEM v[2]; } pair;
        st(pair.v, 0, a);
        st(pair.v, 1, b);
        *(Pair*)y = pair;
        return;
      }
      st(y, 1, b);
    }
    st(y, 0, a);
  }
};

// 16-bit storage: two values packed as the 32-bit word a pair store would write
__device__ __forceinline__ u32 pack2(float a, float b) {
  struct __align__(4) Pair { ELEM v[2]; } pair;
  st(pair.v, 0, a);
  st(pair.v, 1, b);
  return *reinterpret_cast<const u32*>(&pair);
}
// A 4 x 4 transpose of accumulators (f32 or s32) across each quad of lanes: lane q's w[j] is
// block j's value from lane q; afterwards w[u] is block q's value from lane u. Two butterfly steps
// (lane q ^ 1, then q ^ 2), each swapping the 2 x 2 sub-blocks whose row and column bit differ:
// 4 shuffles and 12 selects on the lane's bits (a shuffle of w[(q - r) & 3] compiled to a branch
// per value). The values move in their own type: reinterpreting f32 accumulators as u32 words
// here let NVVM keep the whole accumulator array as b32 integers, copied to and from f32
// registers around every wgmma of the K loop — reads of in-flight accumulators, so ptxas
// serialized the wgmma pipeline (C7514).
__device__ __forceinline__ void transpose_quad(acc_t (&w)[4], int lane) {
#pragma unroll
  for (int bit = 1; bit <= 2; bit <<= 1) {
    const bool hi = lane & bit;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (j & bit) continue;  // the pair (j, j | bit): a lane keeps the slot of its own bit, sends the other
      const acc_t got = __shfl_xor_sync(0xffffffffu, hi ? w[j] : w[j | bit], bit);
      w[j] = hi ? got : w[j];
      w[j | bit] = hi ? w[j | bit] : got;
    }
  }
}

// The accumulators of EPI_GROUP (4) 8-column blocks of one row: lane q of each quad holds columns
// 2q, 2q + 1 of every block (lo[j], hi[j]: block j). Transposed across the quad, lane q holds the
// 8 columns of block q in order (w[0..7]), so its epilogue reads its inputs with 16-byte loads and
// writes one 16-byte store — full 32-byte sectors where the pair loads and stores touched half of
// each. Every lane of the warp must call it (the shuffles).
__device__ __forceinline__ void quad_row(const acc_t (&lo)[4], const acc_t (&hi)[4], acc_t (&w)[8], int lane) {
  acc_t ol[4] = {lo[0], lo[1], lo[2], lo[3]}, oh[4] = {hi[0], hi[1], hi[2], hi[3]};
  transpose_quad(ol, lane);
  transpose_quad(oh, lane);
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    w[2 * u] = ol[u];
    w[2 * u + 1] = oh[u];
  }
}

// whether finish_rows serves this output: 16-bit storage, rows a multiple of 8 long, Y, C (none, or
// a row-broadcast bias: scm 0, scn 1) and the epilogue's inputs 16-byte aligned; one m64 subtile a
// warpgroup (with two, 256x128, the bf16 kernel's first subtile came out wrong on the H100 — fp16
// right, cause not found — so it keeps the pair stores)
__device__ __forceinline__ bool vector_ok(const OutP& out) {
  const bool c_ok = !out.C || (out.scm == 0 && out.scn == 1 && ((u64)out.C & 15) == 0);
  bool ok = MSUB == 1 && EPI_VEC && sizeof(ELEM) == 2 && c_ok && ((out.N | out.row_stride()) & 7) == 0 &&
            ((u64)out.Y & 15) == 0;
#if HAS_EPILOGUE && EPI_VEC
  ok = ok && epi_vec_ok(out.epi);
#endif
  return ok;
}

// EPI_ROLL 1 (the rolled tiles: `cuda.gemm.sm90_rolled_*`, `cuda.int8.gemm_rolled_sm90_*`,
// `cuda.fp8.gemm_fast_rolled_sm90_*`): finish_rows' column groups in a loop that is not unrolled (`#pragma unroll 1`),
// so the code holds one group's body (the epilogue, the transposes and stores of 16 outputs a lane: ~430 SASS
// instructions with BERT's Gelu on the FP8 tile) where the unrolled path holds BN / 32 of them straight through
// (~2,600 on 128x192), which a block runs once a tile: each warp fetches that code from L2 once a tile (the W4A16
// kernel's ncu: 57 % of its stalls "no instruction"). The loop costs a group its accumulators' selection
// (group_accumulators: a branch to one of BN / 32 cases, each 16 register moves; acc indexed at run time would live
// in local memory), the next group's prefetched loads moved into place (one group ahead at most) and, with
// TILE_INPUTS, the tile inputs' selection the same way: ~2 instructions an output. The same arithmetic on the same
// values: bit for bit the unrolled path's bytes (host emulation, tests/kernels/cuda/test_sm90_epilogue_emulated.py).
// One block an SM, one m64 subtile a warpgroup (the 16-byte and native paths').
#ifndef EPI_ROLL
#define EPI_ROLL 0
#endif
#if EPI_ROLL
// column group g's accumulators (blocks 4 g .. 4 g + 3) of rows m (w) and m + 8 (w8) as the finish_rows paths take them
// (w[2 j], w[2 j + 1]: block j's columns 2q, 2q + 1): one comparison a group before it, then 16 moves of fixed registers
// (the 16-byte path's; the native path takes one row at a time, group_row: fewer registers live)
template <int G = 0>
__device__ __forceinline__ void group_accumulators(const acc_t (&acc)[BN / 2], int g, acc_t (&w)[8], acc_t (&w8)[8]) {
  if constexpr (G < BN / (8 * EPI_GROUP)) {
    if (g == G) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        w[2 * j] = acc[4 * (G * EPI_GROUP + j)];
        w[2 * j + 1] = acc[4 * (G * EPI_GROUP + j) + 1];
        w8[2 * j] = acc[4 * (G * EPI_GROUP + j) + 2];
        w8[2 * j + 1] = acc[4 * (G * EPI_GROUP + j) + 3];
      }
      return;
    }
    group_accumulators<G + 1>(acc, g, w, w8);
  }
}
// one row's 8 of them: row m (e 0, w of group_accumulators) or m + 8 (e 2, w8), so that one row's live at a time
template <int G = 0>
__device__ __forceinline__ void group_row(const acc_t (&acc)[BN / 2], int g, int e, acc_t (&w)[8]) {
  if constexpr (G < BN / (8 * EPI_GROUP)) {
    if (g == G) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        w[2 * j] = e ? acc[4 * (G * EPI_GROUP + j) + 2] : acc[4 * (G * EPI_GROUP + j)];
        w[2 * j + 1] = e ? acc[4 * (G * EPI_GROUP + j) + 3] : acc[4 * (G * EPI_GROUP + j) + 1];
      }
      return;
    }
    group_row<G + 1>(acc, g, e, w);
  }
}
#endif

#if !I8 && !F8  // the 16-byte path of 16-bit outputs (float accumulators)
#if !(HAS_EPILOGUE && EPI_VEC)
struct EpiCols8 {};
struct EpiRows8 {};
#endif
// What a lane's 8 columns of rows m, m + 8 in one column group (EPI_GROUP blocks) read besides their
// accumulators: those columns of a row-broadcast C and of the epilogue's column inputs (a bias),
// read once for both rows, and each row's epilogue inputs at the output index (a residual)
struct Loads8 {
  __align__(16) ELEM c[8];
  EpiCols8 cols;
  EpiRows8 r, r8;
};
constexpr int EPI_GROUPS = BN / (8 * EPI_GROUP);
// the groups whose loads are issued ahead of the group being finished (H100, BERT-base FFN1 1024x3072x768
// on 128x192, bias + GELU / bias + residual, us: 0 ahead 16.4 / 14.4, 1: 16.6 / 13.9, 2: 16.2 / 13.6,
// all 6: 16.6 / 14.3); none with two blocks an SM or 256 columns (their registers: a group's loads
// for both rows spilled there), which then finish a row at a time (finish8, its loads after the
// previous row's store)
#if STREAMK  // the stream-K kernel's own registers leave none to spare: 1 group ahead spilled on 128x128
constexpr int GROUPS_AHEAD = 0;
#else
constexpr int GROUPS_AHEAD = BLOCKS == 1 && BN <= 192 ? (EPI_GROUPS < 2 ? EPI_GROUPS : 2) : 0;  // a 32-column tile has one group
#endif
__device__ __forceinline__ void load_cols(const OutP& out, ELEM (&c)[8], EpiCols8& cols, i64 n) {
  if (out.C) *(uint4*)c = *(const uint4*)(out.C + n);
#if HAS_EPILOGUE && EPI_VEC
  load_cols8(out.epi, cols, n);
#endif
}
__device__ __forceinline__ void load_row(const OutP& out, EpiRows8& r, i64 oi) {
#if HAS_EPILOGUE && EPI_VEC
  load_rows8(out.epi, r, oi);
#endif
}
// a group's loads; rows past M read nothing (row m + 8 < M implies m < M)
__device__ __forceinline__ void load_group(const OutP& out, Loads8& g, i64 m, i64 n, i64 oi) {
  if (m >= out.M || n >= out.N) return;
  load_cols(out, g.c, g.cols, n);
  load_row(out, g.r, oi);
  if (m + 8 < out.M) load_row(out, g.r8, oi + 8 * out.N);
}
// alpha, C, the epilogue of one row's 8 columns from its group's loads
__device__ __forceinline__ void value8(const OutP& out, const ELEM (&c)[8], const EpiCols8& cols, const EpiRows8& r,
                                       const float (&w)[8], float (&v)[8]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = out.C ? out.scaled(w[i], ld(c, i)) : out.scaled(w[i]);
#if HAS_EPILOGUE && EPI_VEC
  apply_epilogue8(out.epi, cols, r, v);
#endif
}
// one 16-byte store at element yi of Y (row * out.row_stride() + column). NVVM splits the `*(uint4*) = ` store of
// pack2's words into four 4-byte stores where it loses their alignment: 2 of a thread's 12 on BERT FFN1's 128x192
// tile, every one in the EPI_ROLL loop (NVRTC 13.5's PTX, 2026-12-08). The rolled path stores by PTX's st.global.v4
// (the "memory" clobber keeps the loads after it after it: they may alias, finish_rows); on the unrolled path that
// form spilled 28 bytes (128x192, bias + residual), so it keeps the plain store.
__device__ __forceinline__ void store8(const OutP& out, i64 yi, const float (&v)[8]) {
#if defined(__CUDA_ARCH__) && EPI_ROLL
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(out.Y + yi), "r"(pack2(v[0], v[1])),
               "r"(pack2(v[2], v[3])), "r"(pack2(v[4], v[5])), "r"(pack2(v[6], v[7])) : "memory");
#else
  *(uint4*)(out.Y + yi) = make_uint4(pack2(v[0], v[1]), pack2(v[2], v[3]), pack2(v[4], v[5]), pack2(v[6], v[7]));
#endif
}
// columns n..n + 7 of row m on their own (16-bit storage, N % 8 == 0, vector_ok: the split-K
// reduce's rows): their loads, value8, store8
__device__ __forceinline__ void finish8(const OutP& out, i64 z, i64 m, i64 n, const float (&w)[8]) {
  if (m >= out.M || n >= out.N) return;
  const i64 oi = (z * out.M + m) * out.N + n;
  __align__(16) ELEM c[8];
  EpiCols8 cols;
  EpiRows8 r;
  float v[8];
  load_cols(out, c, cols, n);
  load_row(out, r, oi);
  value8(out, c, cols, r, w, v);
  store8(out, out.yrow(z, m) + out.ycol(n), v);
}
// Rows m, m + 8 of a subtile (n0: the lane's first column, 8 * (lane % 4) into the tile), EPI_GROUP
// column blocks at a time, each transposed across the quad (quad_row) so a lane holds 8 consecutive
// columns. A load cannot pass a store before it (they may alias), so a group's loads (its column
// inputs once for both rows, both rows' row inputs) are issued GROUPS_AHEAD groups early, before
// the stores of the groups between. Every lane of the warp must call it.
__device__ __forceinline__ void finish_rows(const OutP& out, i64 z, const float (&acc)[BN / 2], i64 m, i64 n0,
                                            int lane) {
  const i64 row = (z * out.M + m) * out.N, row8 = row + 8 * out.N;  // the loads' (dense) indices
  const i64 yrow = out.yrow(z, m), yrow8 = out.yrow(z, m + 8);  // the stores'
#if EPI_ROLL  // (the groups in a loop: one group's loads ahead at most)
  constexpr bool AHEAD = GROUPS_AHEAD > 0;
  Loads8 cur, ahead;
  if (AHEAD) load_group(out, cur, m, n0, row + n0);
#pragma unroll 1
  for (int g = 0; g < EPI_GROUPS; ++g) {
    const i64 n = n0 + 8 * EPI_GROUP * g, next = n + 8 * EPI_GROUP;
    if (AHEAD && g + 1 < EPI_GROUPS) load_group(out, ahead, m, next, row + next);
    acc_t q[8], q8[8], lo[4], hi[4], lo8[4], hi8[4], w[8];  // rows m, m + 8: columns 2q, 2q + 1 of each block
    group_accumulators(acc, g, q, q8);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      lo[j] = q[2 * j];
      hi[j] = q[2 * j + 1];
      lo8[j] = q8[2 * j];
      hi8[j] = q8[2 * j + 1];
    }
    const bool row_ok = m < out.M && n < out.N, row8_ok = row_ok && m + 8 < out.M;
    quad_row(lo, hi, w, lane);
    if (!AHEAD) {  // each row with its own loads after the previous row's store
      finish8(out, z, m, n, w);
      quad_row(lo8, hi8, w, lane);
      finish8(out, z, m + 8, n, w);
      continue;
    }
    float v[8];
    value8(out, cur.c, cur.cols, cur.r, w, v);
    if (row_ok) store8(out, yrow + out.ycol(n), v);
    quad_row(lo8, hi8, w, lane);
    value8(out, cur.c, cur.cols, cur.r8, w, v);
    if (row8_ok) store8(out, yrow8 + out.ycol(n), v);
    cur = ahead;
  }
#else
  Loads8 in[EPI_GROUPS];
#pragma unroll
  for (int g = 0; g < GROUPS_AHEAD; ++g) load_group(out, in[g], m, n0 + 8 * EPI_GROUP * g, row + n0 + 8 * EPI_GROUP * g);
#pragma unroll
  for (int g = 0; g < EPI_GROUPS; ++g) {
    const i64 n = n0 + 8 * EPI_GROUP * g, ahead = n + 8 * EPI_GROUP * GROUPS_AHEAD;
    if (GROUPS_AHEAD > 0 && g + GROUPS_AHEAD < EPI_GROUPS) load_group(out, in[g + GROUPS_AHEAD], m, ahead, row + ahead);
    acc_t lo[4], hi[4], lo8[4], hi8[4], w[8];  // rows m (columns 2q, 2q + 1 of each block), m + 8
    float v[8];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      lo[j] = acc[4 * (g * EPI_GROUP + j)];
      hi[j] = acc[4 * (g * EPI_GROUP + j) + 1];
      lo8[j] = acc[4 * (g * EPI_GROUP + j) + 2];
      hi8[j] = acc[4 * (g * EPI_GROUP + j) + 3];
    }
    const bool row_ok = m < out.M && n < out.N, row8_ok = row_ok && m + 8 < out.M;
    quad_row(lo, hi, w, lane);
    if (GROUPS_AHEAD == 0) {  // each row with its own loads after the previous row's store
      finish8(out, z, m, n, w);
      quad_row(lo8, hi8, w, lane);
      finish8(out, z, m + 8, n, w);
      continue;
    }
    value8(out, in[g].c, in[g].cols, in[g].r, w, v);
    if (row_ok) store8(out, yrow + out.ycol(n), v);
    quad_row(lo8, hi8, w, lane);
    value8(out, in[g].c, in[g].cols, in[g].r8, w, v);
    if (row8_ok) store8(out, yrow8 + out.ycol(n), v);
  }
#endif
}
#endif

// The pair path of EPI_GROUP column blocks j0.. of subtile rows m, m + 8 (accumulator layout
// m64nNk16: row 16 * warp + lane / 4 (+8), column 8 * j + 2 * (lane % 4) (+1), n the lane's first
// column): their epilogue values first (the loads of C and of the epilogue inputs are in flight
// together: no store can alias them yet), then their stores.
__device__ __forceinline__ void finish_pairs(const OutP& out, i64 z, float (&acc)[BN / 2], i64 m, i64 n, int j0) {
#pragma unroll
  for (int j = j0; j < j0 + EPI_GROUP; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const i64 mr = m + (e >= 2 ? 8 : 0), nc = n + j * 8 + (e & 1);
      if (mr < out.M && nc < out.N) acc[4 * j + e] = out.value(z, mr, nc, acc[4 * j + e]);
    }
#pragma unroll
  for (int j = j0; j < j0 + EPI_GROUP; ++j) {
    out.store2(z, m, n + j * 8, acc[4 * j], acc[4 * j + 1]);
    out.store2(z, m + 8, n + j * 8, acc[4 * j + 2], acc[4 * j + 3]);
  }
}

#if I8 || F8
// the INT8 (and FP8) output: int8_out.cuh's Out over the row-major (items, M, N) result
struct OutI8 {
  Out q;
  i64 M, N;
};
typedef OutI8 OutT;
// (the kernel's own INT8 arguments; C, alpha, beta are unused)
#define MAKE_OUT(Y, C, M, N, scm, scn, alpha, beta) \
  OutI8{int8_out(Scale, QBias, YScale, YZ, Y, flags, scale_step, bias_step), M, N}
#define EPI_OF(out) out.q.epi
// whether finish_rows (Out::dequantize8 / store8) serves this output: rows a multiple of 8 long, one m64 subtile a warpgroup
// (as vector_ok), aligned pointers (Out::vec_ok)
__device__ __forceinline__ bool vector_ok(const OutI8& out) { return MSUB == 1 && (out.N & 7) == 0 && out.q.vec_ok(); }
// s32 accumulators lie as the f32 ones: Out::put, one element at a time
__device__ __forceinline__ void finish_pairs(const OutI8& out, i64 z, const acc_t (&acc)[BN / 2], i64 m, i64 n, int j0) {
#pragma unroll
  for (int j = j0; j < j0 + EPI_GROUP; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const i64 mr = m + (e >= 2 ? 8 : 0), nc = n + j * 8 + (e & 1);
      if (mr < out.M && nc < out.N) out.q.put((z * out.M + mr) * out.N + nc, nc, nc, acc[4 * j + e]);
    }
}
// What one 8-column group of rows m, m + 8 reads besides its accumulators: the channels' scale and
// bias, both rows' epilogue inputs
struct Group8 {
  float s[8], b[8];
#if HAS_EPILOGUE && EPI_VEC
  EpiIn8 in, in8;
#endif
};
// finish_rows issues group j + 1's loads before group j's math and stores with one block an SM (the
// registers to spare), unless a 256-column tile's accumulators leave no room for two groups of float
// residuals (spills)
constexpr bool PREFETCH_GROUPS = BLOCKS == 1 && (BN <= 128 || sizeof(Group8) <= 128);
// its loads (rows past M read nothing; row m + 8 < M implies m < M)
__device__ __forceinline__ void load_group(const OutI8& out, Group8& g, i64 m, i64 n, i64 oi) {
  if (m >= out.M || n >= out.N) return;
  out.q.channels8(n, g.s, g.b);
#if HAS_EPILOGUE && EPI_VEC
  load_epilogue8(out.q.epi, g.in, oi, n);
  if (m + 8 < out.M) load_epilogue8(out.q.epi, g.in8, oi + 8 * out.N, n);
#endif
}
// row m's (or m + 8's: second) 8 columns from the group's loads: dequantize, epilogue, requantize, store
__device__ __forceinline__ void finish8(const OutI8& out, const Group8& g, bool second, i64 oi, const acc_t (&w)[8]) {
  float v[8];
  out.q.dequantize8(w, g.s, g.b, v);
#if HAS_EPILOGUE && EPI_VEC
  apply_epilogue8(out.q.epi, second ? g.in8 : g.in, v);
#endif
  out.q.store8(oi, v);
}
// one row's 8 columns with their own loads (two blocks an SM: one row's values live at a time)
__device__ __forceinline__ void finish8(const OutI8& out, i64 oi, i64 n, const acc_t (&w)[8]) {
  float s[8], b[8], v[8];
  out.q.channels8(n, s, b);
  out.q.dequantize8(w, s, b, v);
#if HAS_EPILOGUE && EPI_VEC
  EpiIn8 in;
  load_epilogue8(out.q.epi, in, oi, n);
  apply_epilogue8(out.q.epi, in, v);
#endif
  out.q.store8(oi, v);
}
#ifndef EPI_BYTES8
#define EPI_BYTES8 0  // epilogue.py defines it where an INT8 epilogue's vector inputs are all int8 / uint8
#define EPI_IN8_COUNT 0  // (and how many there are)
#endif
// I8_NATIVE: the INT8 kernel (not F8) whose epilogue reads nothing or only 8-bit vector inputs computes
// in the accumulators' own layout (a lane: columns 2q, 2q + 1 of each 8-column block, q = lane % 4):
// scale and bias read as column pairs (8-byte loads), the residual bytes read 8 at a time (block q's)
// and transposed to that layout as packed pairs (transpose_pairs), the int8 output transposed back the
// same way (one 8-byte store of block q), a float32 output stored as column pairs (8-byte stores, 32
// bytes a quad: whole sectors) without any transpose. The same arithmetic per element: only where the
// values sit differs. On 64x128x2 (two blocks an SM, 128 columns) with an int8 / uint8 output and no
// residual, a row's blocks go two at a time (ROW_HALVES, finish_halves).
// (Y_OUT -1, the output type a run-time flag, keeps the transposed path there.)
// A float16 output (Y_OUT 3, INT8 or F8) keeps the transposed path (its 16-byte store8 of 8 halves).
// F8 (an e4m3 or float32 output, Y_OUT 1 / 0; an epilogue reading nothing or only e4m3 / 8-bit vector
// inputs) takes it too: the float sums dequantized where they lie, the e4m3 bytes transposed as the int8
// ones (bytes8). The transposed path's quad_row cost 1 SHFL and 3 FSEL an output (4 of the 15.9
// instructions an output of the 128x256 fast tile without a residual, cuda_sass.py). One block an SM and no
// promotion pieces only: the two-block 128x64x2 spilled 9 bytes with an e4m3 residual, the pieces' 128x256 /
// 128x192 more than they already did (ptxas).
#define F8_NATIVE (F8 && (Y_OUT == 0 || Y_OUT == 1) && BLOCKS == 1 && (F8_FAST || F8_PIECES == 1))
#define I8_NATIVE                                                                                        \
  (((I8 && !F8 && Y_OUT != 3) || F8_NATIVE) && (!HAS_EPILOGUE || EPI_BYTES8) &&                           \
   !(BLOCKS == 2 && BN == 128 && Y_OUT < 0 && EPI_IN8_COUNT == 0))
#if EPI_ROLL && !I8_NATIVE  // (fp8_gemm_sm90.rolls, which the rolled tactics' supports ask, mirrors I8_NATIVE)
#error "EPI_ROLL rolls the native path only: fp8_gemm_sm90.rolls took a unit I8_NATIVE does not"
#endif
#if I8_NATIVE && HAS_EPILOGUE
// the residual bytes of a lane's block (load_epilogue8 at its 8 columns) into the accumulators' layout
__device__ __forceinline__ void native_inputs(EpiIn8& in, const QuadPairs& qp) {
#define I8_TRANSPOSE_FIELD(x) transpose_pairs(((u32*)in.x)[0], ((u32*)in.x)[1], qp);
  EPI_IN8_FIELDS(I8_TRANSPOSE_FIELD)
#undef I8_TRANSPOSE_FIELD
}
#endif
// rows m, m + 8 of a subtile (n0: the lane's first column, 8 * (lane % 4) into the tile), EPI_GROUP
// column blocks at a time, each transposed across the quad (quad_row) so a lane holds 8 consecutive
// columns. A group's loads cannot pass the stores before them (they may alias): PREFETCH_GROUPS
// issues them a group early, so their latency overlaps the previous group's work.
#if I8_NATIVE
// (I8_NATIVE: the same in the accumulators' layout; a group's row is finished by finish_native, `left`
// the columns from the group's first, n, that exist: its blocks 8 j < left, a lane's block 8 (lane % 4))
__device__ __forceinline__ void finish_native(const OutI8& out, const Group8& g, bool second, bool row_ok, i64 oi,
                                              int left, const acc_t (&w)[8], int lane) {
  const QuadPairs qp = quad_pairs(lane);
  float v[8];
  out.q.dequantize8(w, g.s, g.b, v);
#if HAS_EPILOGUE
  EpiIn8 in = second ? g.in8 : g.in;
  native_inputs(in, qp);
  apply_epilogue8(out.q.epi, in, v);
#endif
  if (out.q.yint()) {
    uint2 b = out.q.bytes8(v);
    transpose_pairs(b.x, b.y, qp);  // (every lane: the shuffles)
    if (row_ok && 8 * (lane & 3) < left) *(uint2*)((u8*)out.q.Y + oi + 8 * (lane & 3)) = b;
    return;
  }
#pragma unroll
  for (int j = 0; j < 4; ++j)
    if (row_ok && 8 * j < left)
      *(float2*)((float*)out.q.Y + oi + 8 * j + 2 * (lane & 3)) = make_float2(v[2 * j], v[2 * j + 1]);
}
// ROW_HALVES: a group's 4 blocks finished two at a time: each half's scale / bias pairs (s[4], b[4], not
// the group's 16) serve rows m and m + 8, each row's half requantized to a 4-byte word before the next
// half's loads; each row's two words then transposed and stored as finish_native does. The int8 /
// uint8-out kernels on 64x128x2 that read no residual (no epilogue, or an epilogue without vector inputs:
// Relu alone): holding the group's pairs, the native path spilled 4 bytes there (ptxas; the persistent
// loop's tile count, reloaded each tile). The same arithmetic and bytes (bytes4 is bytes8's half).
// (a define, not a constexpr variable: that would add a symbol to every other kernel's PTX)
#define ROW_HALVES (!F8 && BLOCKS == 2 && BN == 128 && (Y_OUT == 1 || Y_OUT == 2) && EPI_IN8_COUNT == 0)
// a row's half h (blocks 2 h, 2 h + 1: w[4 h..4 h + 3]) requantized as 4 bytes with the half's pairs s, b
__device__ __forceinline__ u32 half_bytes(const OutI8& out, const acc_t (&w)[8], int h, const float (&s)[4],
                                          const float (&b)[4]) {
  float v[4];
  const acc_t w4[4] = {w[4 * h], w[4 * h + 1], w[4 * h + 2], w[4 * h + 3]};
  out.q.dequantize8(w4, s, b, v);
#if HAS_EPILOGUE  // (no vector inputs: elementwise, as Relu; the copies above v8[3] are dead)
  float v8[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) v8[i] = v8[i + 4] = v[i];
  EpiIn8 in;
  apply_epilogue8(out.q.epi, in, v8);
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = v8[i];
#endif
  return out.q.bytes4(v);
}
__device__ __forceinline__ void finish_halves(const OutI8& out, bool row_ok, bool row8_ok, i64 oi, i64 oi8, i64 n,
                                              int left, const acc_t (&w)[8], const acc_t (&w8)[8], int lane) {
  u32 word[2], word8[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float s[4], b[4];
    out.q.channel_pairs(n + 16 * h, 2 * (lane & 3), left - 16 * h, s, b);
    word[h] = half_bytes(out, w, h, s, b);
    word8[h] = half_bytes(out, w8, h, s, b);
  }
  const QuadPairs qp = quad_pairs(lane);
  transpose_pairs(word[0], word[1], qp);  // (every lane: the shuffles)
  transpose_pairs(word8[0], word8[1], qp);
  if (8 * (lane & 3) < left) {
    if (row_ok) *(uint2*)((u8*)out.q.Y + oi + 8 * (lane & 3)) = make_uint2(word[0], word[1]);
    if (row8_ok) *(uint2*)((u8*)out.q.Y + oi8 + 8 * (lane & 3)) = make_uint2(word8[0], word8[1]);
  }
}
// a group's loads in that layout: the scale / bias pairs of its 4 blocks, both rows' inputs at the lane's block
// (`inputs` false: the scale / bias alone, the inputs being the tile's, TileIn)
__device__ __forceinline__ void load_native(const OutI8& out, Group8& g, i64 m, i64 n, int left, i64 oi, int lane,
                                            bool inputs = true) {
  if (m >= out.M || left <= 0) return;
  out.q.channel_pairs(n, 2 * (lane & 3), left, g.s, g.b);
#if HAS_EPILOGUE
  if (!inputs || 8 * (lane & 3) >= left) return;
  load_epilogue8(out.q.epi, g.in, oi + 8 * (lane & 3), n + 8 * (lane & 3));
  if (m + 8 < out.M) load_epilogue8(out.q.epi, g.in8, oi + 8 * (lane & 3) + 8 * out.N, n + 8 * (lane & 3));
#endif
}
// TILE_INPUTS: the tile's 8-bit epilogue inputs (a residual's bytes at the lane's block of rows m, m + 8 in every
// 32-column group) loaded into registers before the tile's K loop (consume: load_tile_inputs), not a group
// ahead of their math (PREFETCH_GROUPS), so that a short K loop's tile (ResNet's 1x1 convs over 64 / 128
// channels: one stage) does not wait on them group after group. One block an SM, one m64 subtile a warpgroup
// (the native path's), BN / 4 bytes an input a thread where the registers hold them (ptxas, no spills): 256
// columns of one input (conv_sm90.cu's INT8 tiles set 128 before including this: its 128x256, whose producer
// gathers im2col rows, spilled 28 bytes with 256; gemm_sm90.cu's INT8 GEMM tiles over rows hold 256 without a spill)
// (EPI_ROLL too: its loop then takes a group's accumulators a row at a time and, past 192 columns, loads the group's
// scale / bias pairs at the group, not a group ahead; with both rows and the pairs ahead the rolled 128x256 spilled
// 84 bytes, with the rows apart 24)
#ifndef TILE_INPUT_COLS
#define TILE_INPUT_COLS 256
#endif
#define TILE_INPUTS \
  (I8_NATIVE && HAS_EPILOGUE && BLOCKS == 1 && MSUB == 1 && EPI_IN8_COUNT * BN <= TILE_INPUT_COLS)
struct TileIn {
#if TILE_INPUTS
  EpiIn8 in[BN / (8 * EPI_GROUP)][2];
#endif
  int unused;
};
#if TILE_INPUTS
// (rows past M or columns past N read nothing, as load_native)
__device__ __forceinline__ void load_tile_inputs(const OutI8& out, TileIn& t, i64 z, i64 m, i64 nt, int lane) {
  if (m >= out.M) return;
  const int cols = (int)(out.N - nt < BN ? out.N - nt : BN);
  const i64 row = (z * out.M + m) * out.N;
#pragma unroll
  for (int j = 0; j < BN / (8 * EPI_GROUP); ++j) {
    const i64 n = nt + 8 * EPI_GROUP * j + 8 * (lane & 3);
    if (8 * EPI_GROUP * j + 8 * (lane & 3) >= cols) continue;
    load_epilogue8(out.q.epi, t.in[j][0], row + n, n);
    if (m + 8 < out.M) load_epilogue8(out.q.epi, t.in[j][1], row + 8 * out.N + n, n);
  }
}
#endif
template <class T>
__device__ __forceinline__ const T& only(const T& t) { return t; }
#if EPI_ROLL && I8_NATIVE
static_assert(BLOCKS == 1 && !ROW_HALVES, "EPI_ROLL: the one-block-an-SM native path");
#if TILE_INPUTS
// column group g's tile inputs (TileIn, rows m and m + 8) into a group's loads, selected as group_accumulators
template <int G = 0>
__device__ __forceinline__ void group_inputs(const TileIn& t, int g, Group8& into) {
  if constexpr (G < BN / (8 * EPI_GROUP)) {
    if (g == G) {
      into.in = t.in[G][0];
      into.in8 = t.in[G][1];
      return;
    }
    group_inputs<G + 1>(t, g, into);
  }
}
#endif
#endif
// (`tin`: none, or the tile's inputs, TileIn)
template <class... In>
__device__ __forceinline__ void finish_rows(const OutI8& out, i64 z, const acc_t (&acc)[BN / 2], i64 m, i64 n0,
                                            int lane, const In&... tin) {
  constexpr bool own = sizeof...(In) == 0;  // the groups load their inputs themselves
  const i64 nt = n0 - 8 * (lane & 3);  // the tile's first column
  const int cols = (int)(out.N - nt < BN ? out.N - nt : BN);  // the tile's columns that exist
  const i64 row = (z * out.M + m) * out.N, row8 = row + 8 * out.N;
  const bool row_ok = m < out.M, row8_ok = m + 8 < out.M;
#if EPI_ROLL
  // (with the tile's inputs in registers, a group's scale / bias pairs are loaded at the group, not a group ahead:
  // 256 columns of an int8 residual spilled 24 bytes with them ahead, on 128x256)
  constexpr bool AHEAD = PREFETCH_GROUPS && !(TILE_INPUTS && BN > 192);
  Group8 cur, ahead;  // this group's loads, the next group's (AHEAD)
  if (AHEAD) load_native(out, cur, m, nt, cols, row + nt, lane, own);
#pragma unroll 1
  for (int g = 0; g < BN / (8 * EPI_GROUP); ++g) {
    const int left = cols - 8 * EPI_GROUP * g;
    const i64 n = nt + 8 * EPI_GROUP * g, next = n + EPI_GROUP * 8;
    if (AHEAD && g + 1 < BN / (8 * EPI_GROUP))
      load_native(out, ahead, m, next, left - EPI_GROUP * 8, row + next, lane, own);
    if (!AHEAD) load_native(out, cur, m, n, left, row + n, lane, own);
#if TILE_INPUTS
    if constexpr (!own) group_inputs(only(tin...), g, cur);
#endif
    acc_t w[8];  // row m, then m + 8: columns 2q, 2q + 1 of each block
    group_row(acc, g, 0, w);
    finish_native(out, cur, false, row_ok, row + n, left, w, lane);
    group_row(acc, g, 2, w);
    finish_native(out, cur, true, row8_ok, row8 + n, left, w, lane);
    if (AHEAD) cur = ahead;
  }
#else
  Group8 g[2];
  if (PREFETCH_GROUPS) load_native(out, g[0], m, nt, cols, row + nt, lane, own);
#pragma unroll
  for (int j0 = 0; j0 < BN / 8; j0 += EPI_GROUP) {
    const int c = PREFETCH_GROUPS ? (j0 / EPI_GROUP) & 1 : 0, left = cols - 8 * j0;
    const i64 n = nt + j0 * 8, next = n + EPI_GROUP * 8;
    if (PREFETCH_GROUPS && j0 + EPI_GROUP < BN / 8)
      load_native(out, g[c ^ 1], m, next, left - EPI_GROUP * 8, row + next, lane, own);
    if (!PREFETCH_GROUPS && !ROW_HALVES) load_native(out, g[0], m, n, left, row + n, lane, own);
#if TILE_INPUTS
    if constexpr (!own) {
      g[c].in = only(tin...).in[j0 / EPI_GROUP][0];
      g[c].in8 = only(tin...).in[j0 / EPI_GROUP][1];
    }
#endif
    acc_t w[8], w8[8];  // rows m, m + 8: columns 2q, 2q + 1 of each block
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      w[2 * j] = acc[4 * (j0 + j)];
      w[2 * j + 1] = acc[4 * (j0 + j) + 1];
      w8[2 * j] = acc[4 * (j0 + j) + 2];
      w8[2 * j + 1] = acc[4 * (j0 + j) + 3];
    }
    if (ROW_HALVES) {
      finish_halves(out, row_ok, row8_ok, row + n, row8 + n, n, left, w, w8, lane);
      continue;
    }
    finish_native(out, g[c], false, row_ok, row + n, left, w, lane);
    finish_native(out, g[c], true, row8_ok, row8 + n, left, w8, lane);
  }
#endif
}
#else
__device__ __forceinline__ void finish_rows(const OutI8& out, i64 z, const acc_t (&acc)[BN / 2], i64 m, i64 n0,
                                            int lane) {
  const i64 row = (z * out.M + m) * out.N, row8 = row + 8 * out.N;
  Group8 g[2];
  if (PREFETCH_GROUPS) load_group(out, g[0], m, n0, row + n0);
#pragma unroll
  for (int j0 = 0; j0 < BN / 8; j0 += EPI_GROUP) {
    const int c = (j0 / EPI_GROUP) & 1;
    const i64 n = n0 + j0 * 8, next = n + EPI_GROUP * 8;
    if (PREFETCH_GROUPS && j0 + EPI_GROUP < BN / 8) load_group(out, g[c ^ 1], m, next, row + next);
    acc_t lo[4], hi[4], lo8[4], hi8[4], w[8];  // rows m (columns 2q, 2q + 1 of each block), m + 8
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      lo[j] = acc[4 * (j0 + j)];
      hi[j] = acc[4 * (j0 + j) + 1];
      lo8[j] = acc[4 * (j0 + j) + 2];
      hi8[j] = acc[4 * (j0 + j) + 3];
    }
    const bool row_ok = m < out.M && n < out.N, row8_ok = row_ok && m + 8 < out.M;
    quad_row(lo, hi, w, lane);
    if (PREFETCH_GROUPS) {
      if (row_ok) finish8(out, g[c], false, row + n, w);
      quad_row(lo8, hi8, w, lane);
      if (row8_ok) finish8(out, g[c], true, row8 + n, w);
    } else {
      if (row_ok) finish8(out, row + n, n, w);
      quad_row(lo8, hi8, w, lane);
      if (row8_ok) finish8(out, row8 + n, n, w);
    }
  }
}
#endif
#else
typedef OutP OutT;
#define MAKE_OUT make_out
#define EPI_OF(out) out.epi
#endif

#ifndef EPI_PREFETCH
#define EPI_PREFETCH 0  // epilogue.py defines it with prefetch_rows where the epilogue reads inputs at the output index
#endif
#ifndef EPI_PREFETCH_NEXT
// 1: the INT8 / FP8 kernels also prefetch their block's next tile's residual rows (consume). Their short-K
// layers (ResNet's 1x1 convs over 64 / 128 channels: a stage or two a tile) spend a tile mostly in the
// epilogue, whose row loads otherwise wait on DRAM: ResNet-50 bs32's layer1 1x1 + residual ran 77-89 us
// in FP8 (H100) where its bytes want ~17. The 16-bit kernels keep 0 until the zoo times them.
#define EPI_PREFETCH_NEXT (I8 || F8)
#endif
#if HAS_EPILOGUE && EPI_PREFETCH
#if I8 || F8
constexpr bool PREFETCH_TILE = !PREFETCH_GROUPS;
#else
constexpr bool PREFETCH_TILE = GROUPS_AHEAD == 0;
#endif
// A tile's residual rows into L2 before its K loop, so that the epilogue's row loads (issued after
// the stores before them: they may alias; none ahead with 256 columns or two blocks an SM, see
// GROUPS_AHEAD / PREFETCH_GROUPS) wait on L2, not DRAM. Only those tiles (PREFETCH_TILE): the others
// issue their loads ahead already, and their registers are tight (the prefetch's address math
// spilled 8 bytes on 128x192). Measured before (H200, ResNet-50 bs32, 2026-12-06
// zoo): the 1x1 conv3 + residual + Relu layers on sm90_128x256 took 98-101 us at 56x56 for 115 MB of
// traffic, ~4x their DRAM time, about 16 serialized DRAM round trips a lane. Each lane takes the rows
// its epilogue finishes (m, m + 8 of each m64 subtile: finish_tile) and a quarter of the tile's columns.
__device__ __forceinline__ void prefetch_tile(const OutT& out, const TileIdx& ti, int row0, int warp, int lane) {
  constexpr int QC = BN / 4;
  const i64 n = (i64)ti.tn * BN + (lane & 3) * QC;
  if (n >= out.N) return;
  const i64 cols = out.N - n < QC ? out.N - n : (i64)QC;
#pragma unroll
  for (int s = 0; s < MSUB; ++s)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const i64 m = (i64)ti.tm * BM + row0 + s * 64 + warp * 16 + lane / 4 + 8 * h;
      if (m < out.M) prefetch_rows(EPI_OF(out), (ti.z * out.M + m) * out.N + n, cols);
    }
}
#endif

// One tile's epilogue from its accumulators (consume; the stream-K kernel's whole tiles); `tin`: none, or the
// tile's inputs loaded before its K loop (TILE_INPUTS)
template <class... In>
__device__ __forceinline__ void finish_tile(const OutT& out, const TileIdx& ti, acc_t (&acc)[MSUB][BN / 2], int row0,
                                            int warp, int lane, const In&... tin) {
  const i64 m_base = (i64)ti.tm * BM + row0 + warp * 16 + lane / 4;
  const i64 n_base = (i64)ti.tn * BN + 2 * (lane % 4);
  const bool vector_rows = vector_ok(out);  // the same for every lane: the shuffles see the whole warp
#pragma unroll
  for (int s = 0; s < MSUB; ++s) {
    if (vector_rows) {
      finish_rows(out, ti.z, acc[s], m_base + s * 64, (i64)ti.tn * BN + 8 * (lane & 3), lane, tin...);
      continue;
    }
#pragma unroll
    for (int j0 = 0; j0 < BN / 8; j0 += EPI_GROUP) finish_pairs(out, ti.z, acc[s], m_base + s * 64, n_base, j0);
  }
}

__device__ __forceinline__ void consume(const OutT& out, unsigned char* smem, unsigned char* scratch, u64* full,
                                        u64* empty, int tiles_m, int tiles_n, int tiles, int ktiles, int wg,
                                        int tid) {
  const int row0 = (wg - 1) * MSUB * 64, ct = (wg - 1) * 128 + tid;  // ct: index among all consumer threads
  acc_t acc[MSUB][BN / 2];
  Ring ring;
  const int warp = tid / 32, lane = tid % 32;
  for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
    const TileIdx ti = tile_of(t, tiles_m, tiles_n, GROUP);
#if HAS_EPILOGUE && EPI_PREFETCH && EPI_PREFETCH_NEXT
    // the first tile's rows (where they are prefetched at all) and the block's next tile's: a whole tile of
    // work (its K loop and epilogue) to reach L2 in, where a short K loop gives this tile's own almost none
    if (PREFETCH_TILE && t == (int)blockIdx.x) prefetch_tile(out, ti, row0, warp, lane);
    if (t + (int)gridDim.x < tiles) prefetch_tile(out, tile_of(t + gridDim.x, tiles_m, tiles_n, GROUP), row0, warp, lane);
#elif HAS_EPILOGUE && EPI_PREFETCH
    if (PREFETCH_TILE) prefetch_tile(out, ti, row0, warp, lane);  // in flight during the K loop
#endif
#if TILE_INPUTS
    TileIn tin;
    if (vector_ok(out))
      load_tile_inputs(out, tin, ti.z, (i64)ti.tm * BM + row0 + warp * 16 + lane / 4, (i64)ti.tn * BN, lane);
#endif
#if SPLIT3
    mainloop_3xtf32(acc, ring, smem, scratch, full, empty, ktiles, row0, ct, tid);
#elif F8 && F8_PIECES > 1
    (void)ct;
    mainloop_f8_pieces(acc, ring, smem, full, empty, ktiles, row0, tid);
#elif F8 && !F8_FAST
    (void)ct;
    mainloop_f8(acc, ring, smem, full, empty, ktiles, row0, tid);
#else
    mainloop(acc, ring, smem, scratch, full, empty, ktiles, row0, ct, tid);
#endif
#if TILE_INPUTS
    finish_tile(out, ti, acc, row0, warp, lane, tin);
#else
    finish_tile(out, ti, acc, row0, warp, lane);
#endif
  }
}

__device__ __forceinline__ OutP make_out(ELEM* Y, const ELEM* C, i64 M, i64 N, i64 scm, i64 scn, float alpha,
                                         float beta) {
  OutP out;
  out.Y = Y; out.C = C; out.M = M; out.N = N; out.scm = scm; out.scn = scn; out.alpha = alpha; out.beta = beta;
#if OUT_ROW_STRIDE
  out.ldy = N;
#endif
  return out;
}

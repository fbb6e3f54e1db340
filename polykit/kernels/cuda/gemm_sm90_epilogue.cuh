// The Hopper GEMM family's epilogue and consumer loop (gemm_sm90.cu, conv_sm90.cu): OutP (alpha,
// beta * C, the fused epilogue, fp16 / bf16 / tf32-rounded float stores of column pairs as the
// accumulators lie), the 16-byte path where vector_ok allows (a transpose across each quad of
// lanes, quad_row, then 8 consecutive columns a lane: finish8), the INT8 output (OutI8 over
// int8_out.cuh's Out), and consume: each tile's K loop (gemm_sm90_core.cuh), then its epilogue.
#pragma once
#include "gemm_sm90_core.cuh"

struct OutP {
  ELEM* Y;
  const ELEM* C;
  i64 M, N, scm, scn;
  float alpha, beta;
#if HAS_EPILOGUE
  EpiState epi;
#endif
  // alpha * acc (+ beta * c) with explicit roundings (one fma with C): the pair stores and the
  // 16-byte path (finish8) compute every element alike, bit for bit
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
    ELEM* y = Y + (z * M + m) * N + n;
    if (n + 1 < N) {
      if ((N & 1) == 0) {
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

// columns n..n + 7 of row m after quad_row (16-bit storage, N % 8 == 0, vector_ok): alpha, a
// row-broadcast C (a conv's bias) read with one 16-byte load, the epilogue (apply_epilogue8), one
// 16-byte store
__device__ __forceinline__ void finish8(const OutP& out, i64 z, i64 m, i64 n, const float (&w)[8]) {
  if (m >= out.M || n >= out.N) return;
  float v[8];
  if (out.C) {
    __align__(16) ELEM c[8];
    *(uint4*)c = *(const uint4*)(out.C + n);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = out.scaled(w[i], ld(c, i));
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = out.scaled(w[i]);
  }
  const i64 oi = (z * out.M + m) * out.N + n;
#if HAS_EPILOGUE && EPI_VEC
  apply_epilogue8(out.epi, v, oi, n);
#endif
  *(uint4*)(out.Y + oi) = make_uint4(pack2(v[0], v[1]), pack2(v[2], v[3]), pack2(v[4], v[5]), pack2(v[6], v[7]));
}

// whether finish8 serves this output: 16-bit storage, rows a multiple of 8 long, Y, C (none, or
// a row-broadcast bias: scm 0, scn 1) and the epilogue's inputs 16-byte aligned; one m64 subtile a
// warpgroup (with two, 256x128, the bf16 kernel's first subtile came out wrong on the H100 — fp16
// right, cause not found — so it keeps the pair stores)
__device__ __forceinline__ bool vector_ok(const OutP& out) {
  const bool c_ok = !out.C || (out.scm == 0 && out.scn == 1 && ((u64)out.C & 15) == 0);
  bool ok = MSUB == 1 && EPI_VEC && sizeof(ELEM) == 2 && c_ok && (out.N & 7) == 0 && ((u64)out.Y & 15) == 0;
#if HAS_EPILOGUE && EPI_VEC
  ok = ok && epi_vec_ok(out.epi);
#endif
  return ok;
}

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

#if I8
// the INT8 output: int8_out.cuh's Out over the row-major (items, M, N) result
struct OutI8 {
  Out q;
  i64 M, N;
};
typedef OutI8 OutT;
// (the kernel's own INT8 arguments; C, alpha, beta are unused)
#define MAKE_OUT(Y, C, M, N, scm, scn, alpha, beta) \
  OutI8{int8_out(Scale, QBias, YScale, YZ, Y, flags, scale_step, bias_step), M, N}
#define EPI_OF(out) out.q.epi
// whether finish_rows (Out::value8 / store8) serves this output: rows a multiple of 8 long, one m64 subtile a warpgroup
// (as vector_ok), aligned pointers (Out::vec_ok)
__device__ __forceinline__ bool vector_ok(const OutI8& out) { return MSUB == 1 && (out.N & 7) == 0 && out.q.vec_ok(); }
// s32 accumulators lie as the f32 ones: Out::put, one element at a time
__device__ __forceinline__ void finish_pairs(const OutI8& out, i64 z, const int (&acc)[BN / 2], i64 m, i64 n, int j0) {
#pragma unroll
  for (int j = j0; j < j0 + EPI_GROUP; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const i64 mr = m + (e >= 2 ? 8 : 0), nc = n + j * 8 + (e & 1);
      if (mr < out.M && nc < out.N) out.q.put((z * out.M + mr) * out.N + nc, nc, nc, acc[4 * j + e]);
    }
}
// row m (or m + 8: oi8) and columns n..n + 7 after quad_row: Out::value8, then Out::store8
__device__ __forceinline__ void finish8(const OutI8& out, i64 m, i64 n, i64 oi, const int (&w)[8]) {
  if (m >= out.M || n >= out.N) return;
  float v[8];
  out.q.value8(oi, n, w, v);
  out.q.store8(oi, v);
}
// rows m and m + 8, columns n..n + 7. With one block an SM (registers to spare): the channels'
// scale and bias once, value8 of both rows (their loads in flight together: no store can alias
// them yet), then both stores; with
// two (128 registers a thread) that spilled, so one row after the other.
__device__ __forceinline__ void finish_rows(const OutI8& out, i64 z, i64 m, i64 n, const int (&lo)[4],
                                            const int (&hi)[4], const int (&lo8)[4], const int (&hi8)[4], int lane) {
  const i64 oi = (z * out.M + m) * out.N + n, oi8 = oi + 8 * out.N;
  int w[8], w8[8];
  quad_row(lo, hi, w, lane);
#if BLOCKS == 1
  quad_row(lo8, hi8, w8, lane);
  const bool row0 = m < out.M && n < out.N, row8 = m + 8 < out.M && n < out.N;
  double s[8], b[8];  // the channels' scale and bias, widened once for both rows
  float v[8], v8[8];
  if (row0 || row8) out.q.channels8(n, s, b);
  if (row0) out.q.value8(oi, n, w, s, b, v);
  if (row8) out.q.value8(oi8, n, w8, s, b, v8);
  if (row0) out.q.store8(oi, v);
  if (row8) out.q.store8(oi8, v8);
#else
  finish8(out, m, n, oi, w);
  quad_row(lo8, hi8, w8, lane);
  finish8(out, m + 8, n, oi8, w8);
#endif
}
#else
typedef OutP OutT;
#define MAKE_OUT make_out
#define EPI_OF(out) out.epi
#endif

__device__ __forceinline__ void consume(const OutT& out, unsigned char* smem, unsigned char* scratch, u64* full,
                                        u64* empty, int tiles_m, int tiles_n, int tiles, int ktiles, int wg,
                                        int tid) {
  const int row0 = (wg - 1) * MSUB * 64, ct = (wg - 1) * 128 + tid;  // ct: index among all consumer threads
  acc_t acc[MSUB][BN / 2];
  Ring ring;
  const int warp = tid / 32, lane = tid % 32;
  for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
    const TileIdx ti = tile_of(t, tiles_m, tiles_n, GROUP);
#if SPLIT3
    mainloop_3xtf32(acc, ring, smem, scratch, full, empty, ktiles, row0, ct, tid);
#else
    mainloop(acc, ring, smem, scratch, full, empty, ktiles, row0, ct, tid);
#endif
    const i64 m_base = (i64)ti.tm * BM + row0 + warp * 16 + lane / 4;
    const i64 n_base = (i64)ti.tn * BN + 2 * (lane % 4);
    const bool vector_rows = vector_ok(out);  // the same for every lane: the shuffles see the whole warp
#pragma unroll
    for (int s = 0; s < MSUB; ++s)
#pragma unroll
      for (int j0 = 0; j0 < BN / 8; j0 += EPI_GROUP) {
        if (vector_rows) {
          acc_t lo[4], hi[4], lo8[4], hi8[4], w[8];  // rows m (columns 2q, 2q + 1 of each block), m + 8
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            lo[j] = acc[s][4 * (j0 + j)];
            hi[j] = acc[s][4 * (j0 + j) + 1];
            lo8[j] = acc[s][4 * (j0 + j) + 2];
            hi8[j] = acc[s][4 * (j0 + j) + 3];
          }
          const i64 m = m_base + s * 64, n = (i64)ti.tn * BN + j0 * 8 + 8 * (lane & 3);
#if I8
          finish_rows(out, ti.z, m, n, lo, hi, lo8, hi8, lane);
#else
          quad_row(lo, hi, w, lane);
          finish8(out, ti.z, m, n, w);
          quad_row(lo8, hi8, w, lane);
          finish8(out, ti.z, m + 8, n, w);
#endif
          continue;
        }
        finish_pairs(out, ti.z, acc[s], m_base + s * 64, n_base, j0);
      }
  }
}

__device__ __forceinline__ OutP make_out(ELEM* Y, const ELEM* C, i64 M, i64 N, i64 scm, i64 scn, float alpha,
                                         float beta) {
  OutP out;
  out.Y = Y; out.C = C; out.M = M; out.N = N; out.scm = scm; out.scn = scn; out.alpha = alpha; out.beta = beta;
  return out;
}

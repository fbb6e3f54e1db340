// MatMul / Gemm and channels-last convolution on Hopper tensor cores (sm_90a):
// Y[z] = alpha * A[z] (M x K) * B[z] + beta * C, fp16 or bf16 storage (ELEM = half_t | bf16_t),
// or float storage with tf32 math (ELEM = float: wgmma k8, operands' low mantissa bits
// ignored), fp32 accumulation; SPLIT3 1 (float only): fp32 accuracy from three tf32 products
// per element pair (3xTF32, sm90.cuh: wgmma_stage_3xtf32).
//
// A is row-major [M, K] (K contiguous); B is [K, N] row-major (B_MN 1: N contiguous) or
// [N, K] (B_MN 0: a transposed Gemm operand, K contiguous). Both are read through TMA tensor
// maps of rank 3 (innermost dim first: K or N, then rows, then the batch item), so tiles past
// an edge are zero-filled by the copy engine; a batch item of an operand that does not vary
// over the batch uses coordinate 0 (a_batched / b_batched 0). Y is contiguous (z, M, N); C
// (Gemm only, may be null) is broadcast to (M, N) through element strides (scm, scn).
//
// Tile BM x BN x KE with BM = 64 * MSUB * CONSUMERS and KE = 128 bytes of K (64 16-bit
// elements, 32 floats): every shared-memory row is one 128-byte swizzle row whatever ELEM is. Warp-specialized and persistent:
// warpgroup 0 is the producer (one thread issues the TMA loads of STAGES stages, each stage
// guarded by a `full` and an `empty` mbarrier); warpgroups 1..CONSUMERS each own MSUB x 64
// rows of the tile and run wgmma on every stage, then the epilogue (alpha, beta*C, the fused
// epilogue, fp16/bf16 store of column pairs). Blocks loop over tiles t = blockIdx.x, +gridDim.x
// (grid = min(tiles, SMs)), tiles ordered by tile_of (GROUP tile rows at a time).
//
// conv_sm90: ai.polykit ConvNHWC (group 1, C % VEC == 0) as an implicit GEMM with the same
// consumers: M = NB * OH * OW output pixels, N = output channels, K = KH * KW * C in (kh, kw, c)
// order, so the KRSC weight is B ([N, K], B_MN 0, through TMA) and Y [NB, OH, OW, N] is the
// row-major GEMM output. A is gathered by the whole producer warpgroup with 16-byte cp.async
// (VEC channels of one (kh, kw) tap; zeros in the padding and past K), completion counted on the
// stage's `full` barrier (cp.async.mbarrier.arrive.noinc). The conv bias is C (scn 1, beta 1).
// BLOCKS 2 (one consumer warpgroup, few stages): two blocks share an SM, so one block's epilogue
// runs while the other's wgmma do; they keep the launch register budget (no setmaxnreg).
// Launch: grid (min(tiles, BLOCKS * SMs)), block 128 * (CONSUMERS + 1), dynamic shared memory
// 1024 (alignment) + STAGES * (BM + BN) * 128 + SCRATCH_BUFS * SCRATCH_BYTES + 16 * STAGES bytes.
// Float B through a scratch ring (B_SCRATCH): tf32 wgmma reads B K-major only, so a [K, N] B
// (B_MN 1, loaded as BN/32 boxes of 32 K rows x 32 floats) is transposed by the consumers into
// K-major rows, and with SPLIT3 B's small part is written beside its big part (a K-major B is
// rounded in place). The consumers share that work and meet at a named barrier once a stage;
// SCRATCH_BUFS 3 buffers make that one barrier enough (a buffer is rewritten two stages after
// the stage whose wgmma read it last, and every consumer has waited for those by then).
// Deterministic: each output element is one fixed-order K loop in one thread.
// I8 1 (INT8 layers, int8_sm90.py): s8 operands (OPER i8, 128 K a stage = 4 wgmma k32, both
// K-major), int32 accumulators, and int8_out.cuh's output (dequantize, epilogue, requantize: int8.cu's
// arithmetic bit for bit); ELEM is then the epilogue's float. Symmetric only (zero points 0: the
// zero-filled padding and past-K chunks are real zeros, the sums need no correction).
#include "sm90.cuh"

#ifndef HAS_EPILOGUE
#define HAS_EPILOGUE 0
#define EPI_PARAMS
#define EPI_COMMA_ARGS
#endif
#ifndef EPI_VEC
#define EPI_VEC 1  // the epilogue (if any) has apply_epilogue8: 8 columns of a row at once
#endif
#ifndef I8
#define I8 0
#endif
#if I8
#include "int8_out.cuh"
#define OPER i8
typedef int acc_t;
#define I8_PARAMS , const float *Scale, const float *QBias, const float *YScale, const u8 *YZ, int flags, \
                  int scale_step, int bias_step
#else
#define OPER ELEM  // the operands' storage type
typedef float acc_t;
#define I8_PARAMS
#endif

#define BM (64 * MSUB * CONSUMERS)
#define STAGE_BYTES ((BM + BN) * 128)
#define GROUP 8
#ifndef BLOCKS
#define BLOCKS 1  // blocks an SM runs at once; 2: one block's epilogue overlaps the other's products
#endif
#ifndef SPLIT3
#define SPLIT3 0
#endif
#define EPI_GROUP 4  // column blocks (8 columns each) whose epilogue loads are batched
constexpr int KE = 128 / sizeof(OPER);  // K elements of one stage (one 128-byte row)
constexpr int VEC = 16 / sizeof(OPER);  // elements of one 16-byte chunk
static_assert(!SPLIT3 || sizeof(ELEM) == 4, "3xTF32 splits float operands");
static_assert(!I8 || (!SPLIT3 && !B_MN), "s8 wgmma reads both operands K-major");
static_assert(EPI_GROUP == 4, "finish_quad_row transposes across a quad of lanes: 4 column blocks");
constexpr bool B_SCRATCH = !I8 && sizeof(ELEM) == 4 && (SPLIT3 || B_MN);
constexpr int SCRATCH_BUFS = 3;
constexpr int SMALL_OFF = B_MN ? BN * 128 : 0;  // B's small part in a scratch buffer (its big part first if B_MN)
constexpr int SCRATCH_BYTES = B_SCRATCH ? (B_MN + SPLIT3) * BN * 128 : 0;

struct OutP {
  ELEM* Y;
  const ELEM* C;
  i64 M, N, scm, scn;
  float alpha, beta;
#if HAS_EPILOGUE
  EpiState epi;
#endif
  __device__ __forceinline__ float value(i64 z, i64 m, i64 n, float acc) const {
    float v = alpha * acc;
    if (C) v += beta * (float)ld(C, m * scm + n * scn);
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
__device__ __forceinline__ u32 pick4(const u32 (&w)[4], int i) {
  return i == 0 ? w[0] : i == 1 ? w[1] : i == 2 ? w[2] : w[3];
}

// A 4 x 4 transpose of 32-bit words across each quad of lanes (4 shuffles): lane q's w[j] is
// block j's word from lane q; afterwards o[u] is block q's word from lane u.
__device__ __forceinline__ void transpose_quad(const u32 (&w)[4], u32 (&o)[4], int lane) {
  const int q = lane & 3;
#pragma unroll
  for (int r = 0; r < 4; ++r) {  // round r: lane q sends its word of block (q - r) & 3 to lane (q - r) & 3
    const int from = (q + r) & 3;
    const u32 got = __shfl_sync(0xffffffffu, pick4(w, (q - r) & 3), (lane & ~3) | from);
#pragma unroll
    for (int i = 0; i < 4; ++i) o[i] = i == from ? got : o[i];
  }
}

// The accumulators of EPI_GROUP (4) 8-column blocks of one row, 16-bit storage, N % 8 == 0: lane
// q of each quad holds columns 2q, 2q + 1 of every block (lo[j], hi[j]: block j). Transposed
// across the quad, lane q holds the 8 columns of block q: it finishes them (alpha, the epilogue
// with 16-byte loads of its inputs) and writes them with one 16-byte store — full 32-byte
// sectors where the pair loads and stores touched half of each.
__device__ __forceinline__ void finish_quad_row(const OutP& out, i64 z, i64 m, i64 n_block0, const float (&lo)[4],
                                                const float (&hi)[4], int lane) {
  u32 wl[4], wh[4], ol[4] = {0, 0, 0, 0}, oh[4] = {0, 0, 0, 0};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    wl[j] = __float_as_uint(lo[j]);
    wh[j] = __float_as_uint(hi[j]);
  }
  transpose_quad(wl, ol, lane);
  transpose_quad(wh, oh, lane);
  const i64 n = n_block0 + 8 * (lane & 3);
  if (m >= out.M || n >= out.N) return;
  float v[8];
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    v[2 * u] = out.alpha * __uint_as_float(ol[u]);
    v[2 * u + 1] = out.alpha * __uint_as_float(oh[u]);
  }
  const i64 oi = (z * out.M + m) * out.N + n;
#if HAS_EPILOGUE && EPI_VEC
  apply_epilogue8(out.epi, v, oi, n);
#endif
  *(uint4*)(out.Y + oi) = make_uint4(pack2(v[0], v[1]), pack2(v[2], v[3]), pack2(v[4], v[5]), pack2(v[6], v[7]));
}

// ---- float B of one stage -> K-major tf32 parts in scratch (B_SCRATCH; all consumer threads) ------
__device__ __forceinline__ void prepare_b(unsigned char* b, unsigned char* scr, int t) {
  constexpr int NT = 128 * CONSUMERS;
  if constexpr (B_MN) {
    // 4 K x 4 N blocks: read rows k0..k0+3 of N chunk n0 / 4 (box n0 / 32), write rows n0..n0+3 of
    // K chunk k0 / 4. Consecutive threads take consecutive n0 (conflict-free reads); each writes
    // its four rows starting at row (ng / 2) % 4, so the 8 threads of a 128-byte write phase hit
    // 8 different chunk slots (row n's chunk c sits at c ^ (n % 8)): conflict-free writes.
#pragma unroll 1
    for (int u = t; u < BN * 2; u += NT) {
      const int ng = u % (BN / 4), kg = u / (BN / 4), n0 = ng * 4, c = ng % 8, rot = (ng / 2) % 4;
      const unsigned char* box = b + (n0 / 32) * 4096;
      float v[4][4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int k = kg * 4 + i;
        const float4 x = *(const float4*)(box + k * 128 + ((c ^ (k & 7)) << 4));
        v[i][0] = x.x; v[i][1] = x.y; v[i][2] = x.z; v[i][3] = x.w;
      }
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        const int j = (jj + rot) % 4, n = n0 + j, off = n * 128 + ((kg ^ (n & 7)) << 4);
        u32 big[4], small[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float x = j == 0 ? v[i][0] : j == 1 ? v[i][1] : j == 2 ? v[i][2] : v[i][3];
          split_tf32(x, big[i], small[i]);
        }
        *(uint4*)(scr + off) = make_uint4(big[0], big[1], big[2], big[3]);
        if (SPLIT3) *(uint4*)(scr + SMALL_OFF + off) = make_uint4(small[0], small[1], small[2], small[3]);
      }
    }
  } else {  // already K-major: big part in place, small part at the same offset in scratch
#pragma unroll 1
    for (int u = t; u < BN * 8; u += NT) {
      uint4* p = (uint4*)(b + u * 16);
      const uint4 x = *p;
      uint4 big, small;
      split_tf32(__uint_as_float(x.x), big.x, small.x);
      split_tf32(__uint_as_float(x.y), big.y, small.y);
      split_tf32(__uint_as_float(x.z), big.z, small.z);
      split_tf32(__uint_as_float(x.w), big.w, small.w);
      *p = big;
      *(uint4*)(scr + SMALL_OFF + u * 16) = small;
    }
  }
  fence_proxy_async();
  named_barrier<1, NT>();
}

// ---- consumers: wgmma over the stages, then the epilogue (both kernels) -----------------------
// Where the consumers are in the stage ring and the float-B scratch ring.
struct Ring {
  int stage = 0, scratch = 0;
  u32 phase = 0;
  __device__ __forceinline__ void next_stage() {
    if (++stage == STAGES) {
      stage = 0;
      phase ^= 1;
    }
  }
  __device__ __forceinline__ unsigned char* next_scratch(unsigned char* base) {
    unsigned char* p = base + scratch * SCRATCH_BYTES;
    scratch = scratch == SCRATCH_BUFS - 1 ? 0 : scratch + 1;
    return p;
  }
};

// One tile's K loop: wgmma on every stage, one stage's wgmma in flight while the next is issued.
__device__ __forceinline__ void mainloop(acc_t (&acc)[MSUB][BN / 2], Ring& r, unsigned char* smem,
                                         unsigned char* scratch, u64* full, u64* empty, int ktiles, int row0, int ct,
                                         int tid) {
  int prev = -1;
  for (int kt = 0; kt < ktiles; ++kt) {
    bar_wait(&full[r.stage], r.phase);
    unsigned char* st = smem + r.stage * STAGE_BYTES;
    const u32 a = smem_addr(st);
    u32 b = a + BM * 128;
    if constexpr (B_SCRATCH) {  // a [K, N] float B: tf32 wgmma on its K-major copy
      unsigned char* scr = r.next_scratch(scratch);
      prepare_b(st + BM * 128, scr, ct);
      b = smem_addr(scr);
    }
    wgmma_fence();
    wgmma_stage<BN, MSUB, B_SCRATCH ? 0 : B_MN, OPER>(acc, a, b, row0, kt == 0);
    wgmma_commit();
    wgmma_wait<1>();  // the previous stage's wgmma are done: hand its buffers back
    if (prev >= 0 && tid == 0) bar_arrive(&empty[prev]);
    prev = r.stage;
    r.next_stage();
  }
  wgmma_wait<0>();
#pragma unroll
  for (int s = 0; s < MSUB; ++s) fence_regs<BN / 2>(acc[s]);
  if (prev >= 0 && tid == 0) bar_arrive(&empty[prev]);
}

// The 3xTF32 K loop: each stage's products go to `part` and are added to `acc` on the CUDA cores
// (round to nearest): the tensor cores' own fp32 accumulation truncates, a bias that grows with
// K (measured on the H100: 3e-5 relative at K 4096 with one accumulator). The wait for a stage's
// wgmma before the next stage's fragments are written is also what keeps the A registers of an
// in-flight wgmma unchanged.
__device__ __forceinline__ void mainloop_3xtf32(float (&acc)[MSUB][BN / 2], Ring& r, unsigned char* smem,
                                                unsigned char* scratch, u64* full, u64* empty, int ktiles, int row0,
                                                int ct, int tid) {
  const int warp = tid / 32, lane = tid % 32;
#pragma unroll
  for (int s = 0; s < MSUB; ++s)
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[s][i] = 0.f;
  for (int kt = 0; kt < ktiles; ++kt, r.next_stage()) {
    bar_wait(&full[r.stage], r.phase);
    unsigned char* st = smem + r.stage * STAGE_BYTES;
    unsigned char* scr = r.next_scratch(scratch);
    prepare_b(st + BM * 128, scr, ct);
    const u32 b_big = B_MN ? smem_addr(scr) : smem_addr(st + BM * 128);
    float part[MSUB][BN / 2];
    wgmma_stage_3xtf32<BN, MSUB>(part, st, b_big, smem_addr(scr + SMALL_OFF), row0, warp, lane);
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int s = 0; s < MSUB; ++s) {
      fence_regs<BN / 2>(part[s]);
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) acc[s][i] += part[s][i];
    }
    if (tid == 0) bar_arrive(&empty[r.stage]);
  }
}

// whether finish_quad_row serves this output: 16-bit storage, rows a multiple of 8 long, Y, C
// (none) and the epilogue's inputs 16-byte aligned; one m64 subtile a warpgroup (with two,
// 256x128, the bf16 kernel's first subtile came out wrong on the H100 — fp16 right, cause not
// found — so it keeps the pair stores)
__device__ __forceinline__ bool vector_ok(const OutP& out) {
  bool ok = MSUB == 1 && EPI_VEC && sizeof(ELEM) == 2 && !out.C && (out.N & 7) == 0 && ((u64)out.Y & 15) == 0;
#if HAS_EPILOGUE && EPI_VEC
  ok = ok && epi_vec_ok(out.epi);
#endif
  return ok;
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
// s32 m64nNk32 accumulators lie as the f32 ones: row 16 * warp + lane / 4 (+8), column
// 8 * j + 2 * (lane % 4) (+1)
__device__ __forceinline__ void finish_i8(const OutI8& out, const TileIdx& ti, const int (&acc)[MSUB][BN / 2],
                                          int row0, int warp, int lane) {
  const i64 m_base = (i64)ti.tm * BM + row0 + warp * 16 + lane / 4, n_base = (i64)ti.tn * BN + 2 * (lane % 4);
#pragma unroll
  for (int s = 0; s < MSUB; ++s)
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const i64 m = m_base + s * 64 + (e >= 2 ? 8 : 0), n = n_base + j * 8 + (e & 1);
        if (m < out.M && n < out.N) out.q.put((ti.z * out.M + m) * out.N + n, n, n, acc[s][4 * j + e]);
      }
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
#if I8
    finish_i8(out, ti, acc, row0, warp, lane);
#else
    // accumulator layout (m64nNk16): row = 16 * warp + lane / 4 (+8), column = 8 * j + 2 * (lane % 4) (+1).
    // EPI_GROUP column blocks at a time: their epilogue values first (the loads of C and of the
    // epilogue inputs are in flight together: no store can alias them yet), then their stores.
    const i64 m_base = (i64)ti.tm * BM + row0 + warp * 16 + lane / 4;
    const bool vector_rows = vector_ok(out);
    const i64 n_base = (i64)ti.tn * BN + 2 * (lane % 4);
#pragma unroll
    for (int s = 0; s < MSUB; ++s)
#pragma unroll
      for (int j0 = 0; j0 < BN / 8; j0 += EPI_GROUP) {
        if (vector_rows) {  // the same for every lane: the shuffles see the whole warp
          float lo[4], hi[4], lo8[4], hi8[4];  // rows m (columns 2q, 2q + 1 of each block), m + 8
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            lo[j] = acc[s][4 * (j0 + j)];
            hi[j] = acc[s][4 * (j0 + j) + 1];
            lo8[j] = acc[s][4 * (j0 + j) + 2];
            hi8[j] = acc[s][4 * (j0 + j) + 3];
          }
          const i64 m = m_base + s * 64, n_block0 = (i64)ti.tn * BN + j0 * 8;
          finish_quad_row(out, ti.z, m, n_block0, lo, hi, lane);
          finish_quad_row(out, ti.z, m + 8, n_block0, lo8, hi8, lane);
          continue;
        }
#pragma unroll
        for (int j = j0; j < j0 + EPI_GROUP; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const i64 m = m_base + s * 64 + (e >= 2 ? 8 : 0), n = n_base + j * 8 + (e & 1);
            if (m < out.M && n < out.N) acc[s][4 * j + e] = out.value(ti.z, m, n, acc[s][4 * j + e]);
          }
#pragma unroll
        for (int j = j0; j < j0 + EPI_GROUP; ++j) {
          const i64 m = m_base + s * 64, n = n_base + j * 8;
          out.store2(ti.z, m, n, acc[s][4 * j], acc[s][4 * j + 1]);
          out.store2(ti.z, m + 8, n, acc[s][4 * j + 2], acc[s][4 * j + 3]);
        }
      }
#endif
  }
}

// shared-memory layout, barrier set-up (full: `arrivals` per phase; empty: one per consumer)
struct Stages {
  unsigned char* smem;
  unsigned char* scratch;  // SCRATCH_BUFS * SCRATCH_BYTES after the stages
  u64 *full, *empty;
};
__device__ __forceinline__ Stages setup_stages(unsigned char* raw, u32 arrivals) {
  Stages st;
  st.smem = (unsigned char*)(((u64)raw + 1023) & ~(u64)1023);
  st.scratch = st.smem + STAGES * STAGE_BYTES;
  st.full = (u64*)(st.scratch + SCRATCH_BUFS * SCRATCH_BYTES);
  st.empty = st.full + STAGES;
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      bar_init(&st.full[s], arrivals);
      bar_init(&st.empty[s], CONSUMERS);
    }
    bar_fence_init();
  }
  __syncthreads();
  return st;
}

__device__ __forceinline__ OutP make_out(ELEM* Y, const ELEM* C, i64 M, i64 N, i64 scm, i64 scn, float alpha,
                                         float beta) {
  OutP out;
  out.Y = Y; out.C = C; out.M = M; out.N = N; out.scm = scm; out.scn = scn; out.alpha = alpha; out.beta = beta;
  return out;
}

// advance a (stage, phase) ring position
__device__ __forceinline__ void next_stage(int& stage, u32& phase) {
  if (++stage == STAGES) {
    stage = 0;
    phase ^= 1;
  }
}

extern "C" __global__ void __launch_bounds__(128 * (CONSUMERS + 1), BLOCKS) gemm_sm90(
    const __grid_constant__ TmaDesc tm_a, const __grid_constant__ TmaDesc tm_b, const ELEM* C, ELEM* Y, i64 M,
    i64 N, i64 K, i64 scm, i64 scn, float alpha, float beta, i64 items, i64 a_batched, i64 b_batched I8_PARAMS
        EPI_PARAMS) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  const int tiles_m = (int)((M + BM - 1) / BM), tiles_n = (int)((N + BN - 1) / BN);
  const int tiles = tiles_m * tiles_n * (int)items;
  const int ktiles = (int)((K + KE - 1) / KE);
  if (threadIdx.x == 0) {
    tma_prefetch_desc(&tm_a);
    tma_prefetch_desc(&tm_b);
  }
  const Stages st = setup_stages(smem_raw, 1);

  if (wg == 0) {  // ---- producer: TMA loads, one thread ------------------------------------
    if (BLOCKS == 1) set_max_regs_dec<40>();
    int stage = 0;
    u32 phase = 0;
    for (int t = blockIdx.x; t < tiles && tid == 0; t += gridDim.x) {
      const TileIdx ti = tile_of(t, tiles_m, tiles_n, GROUP);
      const int za = a_batched ? ti.z : 0, zb = b_batched ? ti.z : 0;
      for (int kt = 0; kt < ktiles; ++kt, next_stage(stage, phase)) {
        bar_wait(&st.empty[stage], phase ^ 1);
        unsigned char* a = st.smem + stage * STAGE_BYTES;
        unsigned char* b = a + BM * 128;
        bar_expect_tx(&st.full[stage], STAGE_BYTES);
        tma_load_3d(a, &tm_a, &st.full[stage], kt * KE, ti.tm * BM, za);
#if B_MN
#pragma unroll
        for (int j = 0; j < BN / KE; ++j)  // boxes of KE N (128 bytes) by KE K rows
          tma_load_3d(b + j * KE * 128, &tm_b, &st.full[stage], ti.tn * BN + j * KE, kt * KE, zb);
#else
        tma_load_3d(b, &tm_b, &st.full[stage], kt * KE, ti.tn * BN, zb);
#endif
      }
    }
  } else {  // ---- consumers (128 * 40 + 256 * 232 = 168 * 384: the launch allocation) --------------
    if (BLOCKS == 1) set_max_regs_inc<232>();
    OutT out = MAKE_OUT(Y, C, M, N, scm, scn, alpha, beta);
#if HAS_EPILOGUE
    EPI_OF(out) = make_epi(EPI_ARGS);
#endif
    consume(out, st.smem, st.scratch, st.full, st.empty, tiles_m, tiles_n, tiles, ktiles, wg, tid);
  }
}

// rows of the A tile one producer thread gathers: rows tid / 8 + 16 * i, chunk tid % 8
#define ROWS_PER_THREAD (BM / 16)
// setmaxnreg moves registers only within the block's launch allocation (168 x 384 with two
// consumers): 128 * 56 + 256 * 224 = 168 * 384. Asking for more than was released hangs.
#define CONV_PRODUCER_REGS 56
#define CONV_CONSUMER_REGS (CONSUMERS == 1 ? 240 : 224)

extern "C" __global__ void __launch_bounds__(128 * (CONSUMERS + 1), BLOCKS) conv_sm90(
    const __grid_constant__ TmaDesc tm_w, const OPER* X, const ELEM* Bias, ELEM* Y, i64 M, i64 N, i64 K, int H,
    int W, int C, int OH, int OW, int KW, int SH, int SW, int PH, int PW, int DH, int DW I8_PARAMS EPI_PARAMS) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  const int tiles_m = (int)((M + BM - 1) / BM), tiles_n = (int)((N + BN - 1) / BN);
  const int tiles = tiles_m * tiles_n;
  const int ktiles = (int)((K + KE - 1) / KE);
  if (threadIdx.x == 0) tma_prefetch_desc(&tm_w);
  const Stages st = setup_stages(smem_raw, 128 + 1);  // 128 cp.async arrivals + the TMA thread's expect_tx

  if (wg == 0) {  // ---- producer warpgroup: im2col rows by cp.async, weights by TMA -----------
    if (BLOCKS == 1) set_max_regs_dec<CONV_PRODUCER_REGS>();
    const int chunk = tid % 8, c8s = C / VEC, kchunks = (int)(K / VEC);
    int stage = 0;
    u32 phase = 0;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
      const TileIdx ti = tile_of(t, tiles_m, tiles_n, GROUP);
      i64 base[ROWS_PER_THREAD];  // image offset of the row's pixel, -1 past M
      int ih0[ROWS_PER_THREAD], iw0[ROWS_PER_THREAD];
#pragma unroll
      for (int i = 0; i < ROWS_PER_THREAD; ++i) {
        const i64 m = (i64)ti.tm * BM + tid / 8 + 16 * i;
        const int img = (int)(m / (OH * OW)), pix = (int)(m - (i64)img * OH * OW);
        const int oh = pix / OW, ow = pix - oh * OW;
        base[i] = m < M ? (i64)img * H * W * C : -1;
        ih0[i] = oh * SH - PH;
        iw0[i] = ow * SW - PW;
      }
      for (int kt = 0; kt < ktiles; ++kt, next_stage(stage, phase)) {
        bar_wait(&st.empty[stage], phase ^ 1);
        unsigned char* a = st.smem + stage * STAGE_BYTES;
        if (tid == 0) {
          bar_expect_tx(&st.full[stage], BN * 128);
          tma_load_3d(a + BM * 128, &tm_w, &st.full[stage], kt * KE, ti.tn * BN, 0);
        }
        const int q = kt * 8 + chunk;  // this thread's 16-byte chunk of K: tap (kh, kw), channels c8 * VEC..
        const int tap = q / c8s, c8 = q - tap * c8s, kh = tap / KW, kw = tap - kh * KW;
#pragma unroll
        for (int i = 0; i < ROWS_PER_THREAD; ++i) {
          const int r = tid / 8 + 16 * i;
          const int ih = ih0[i] + kh * DH, iw = iw0[i] + kw * DW;
          const bool ok = base[i] >= 0 && q < kchunks && ih >= 0 && ih < H && iw >= 0 && iw < W;
          const OPER* src = X + (ok ? base[i] + ((i64)ih * W + iw) * C + c8 * VEC : 0);
          cp_async16(a + r * 128 + ((chunk ^ (r & 7)) << 4), src, ok);
        }
        bar_arrive_cp_async(&st.full[stage]);
      }
    }
  } else {  // ---- consumers ---------------------------------------------------------------------
    if (BLOCKS == 1) set_max_regs_inc<CONV_CONSUMER_REGS>();
    OutT out = MAKE_OUT(Y, Bias, M, N, 0, 1, 1.f, 1.f);
#if HAS_EPILOGUE
    EPI_OF(out) = make_epi(EPI_ARGS);
#endif
    consume(out, st.smem, st.scratch, st.full, st.empty, tiles_m, tiles_n, tiles, ktiles, wg, tid);
  }
}

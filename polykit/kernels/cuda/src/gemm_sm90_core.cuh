// The Hopper GEMM family's pipeline (gemm_sm90.cu and conv_sm90.cu, through
// gemm_sm90_epilogue.cuh): tile configuration, the consumers' wgmma K loops, the stage ring.
// Operands are fp16 or bf16 (ELEM = half_t | bf16_t), or float with tf32 math (ELEM = float:
// wgmma k8, operands' low mantissa bits ignored), fp32 accumulation; SPLIT3 1 (float only): fp32
// accuracy from three tf32 products per element pair (3xTF32, sm90.cuh: wgmma_stage_3xtf32).
//
// Tile BM x BN x KE with BM = 64 * MSUB * CONSUMERS and KE = 128 bytes of K (64 16-bit
// elements, 32 floats): every shared-memory row is one 128-byte swizzle row whatever ELEM is.
// Warp-specialized and persistent: warpgroup 0 is the producer (it fills STAGES stages, each
// stage guarded by a `full` and an `empty` mbarrier); warpgroups 1..CONSUMERS each own MSUB x 64
// rows of the tile and run wgmma on every stage, then the epilogue (gemm_sm90_epilogue.cuh).
// Blocks loop over work units u = blockIdx.x, +gridDim.x (grid = min(units, BLOCKS * SMs)): the
// output tiles, ordered by tile_of (GROUP tile rows at a time), or with SPLITK (split-K, for grids
// too small to fill the SMs) each tile's K cut into slices (unit_of; gemm_sm90_splitk.cuh).
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
// I8 1 (INT8 layers, int8_sm90.py; gemm_sm90.cu's INT8 GEMM tiles, int8_gemm_sm90.py): s8 operands
// (OPER i8, 128 K a stage = 4 wgmma k32, both K-major), int32 accumulators, and int8_out.cuh's output
// (dequantize, epilogue, requantize: int8.cu's arithmetic bit for bit; Out::dequantize8 / store8 on the
// 8-column path); ELEM is then the epilogue's float. Symmetric only (zero points 0: the zero-filled padding and past-K chunks are real
// zeros, the sums need no correction).
// F8 1 (FP8 layers, fp8_sm90.py): I8's kernel on e4m3 operands (OPER e4m3_t, wgmma m64nNk32
// f32.e4m3.e4m3, both K-major), fp32 accumulators, int8_out.cuh's output on float sums (dequantize,
// epilogue, float32 or saturating e4m3 store). Each stage's four k32 products (128 K) go to a
// fresh register block that the CUDA cores add to the accumulators (mainloop_f8): the tensor
// cores' FP8 accumulation keeps fewer bits than fp32 (about 14 on the H800, DeepSeek-V3 report
// 3.3.2), so no more than one stage's products are ever summed there. F8_PIECES > 1 (gemm_sm90.cu's
// FP8 tiles, fp8_gemm_sm90.py; conv_sm90.cu's, fp8_conv_sm90.py): the same sums with a stage's columns
// in pieces whose adds overlap the next piece's wgmma (mainloop_f8_pieces, F8_BUFS): the 192- and
// 256-column tiles' registers.
// F8_FAST 1 (the `_fast` FP8 tactics, fp8_sm90.py / fp8_gemm_sm90.py): the FP8 K loop without promotion,
// the 16-bit kernels' own `mainloop` on e4m3 operands: every stage's wgmma accumulate into the fp32
// accumulators (scale_d 1 after the first), one stage in flight while the next is issued, no register
// block for a stage's products and no CUDA-core adds (cuBLASLt's CUBLASLT_MATMUL_DESC_FAST_ACCUM, XLA's
// forward FP8 GEMMs, torch._scaled_mm(use_fast_accum=True)). The tensor cores then realign the running
// sum to their ~14 bits once a k32 wgmma for the whole K, not a stage, so the error bound grows with K
// (tests/kernels/cuda/test_fp8_sm90.py: tolerance() of a fast tactic); whole tiles only (F8_PIECES 1).
#pragma once
#include "sm90.cuh"

#include "epilogue_hook.cuh"
#ifndef EPI_VEC
#define EPI_VEC 1  // the epilogue (if any) has apply_epilogue8: 8 columns of a row at once
#endif
#ifndef I8
#define I8 0
#endif
#ifndef F8
#define F8 0
#endif
#ifndef F8_PIECES
#define F8_PIECES 1  // F8: a stage's columns in this many wgmma pieces (mainloop_f8_pieces when > 1)
#endif
#ifndef F8_FAST
#define F8_FAST 0  // F8: the stages' products accumulate in the wgmma accumulators (mainloop), no promotion
#endif
static_assert(!F8_FAST || (F8 && F8_PIECES == 1), "F8_FAST: an FP8 kernel on whole-tile wgmma (no pieces)");
#if I8 || F8
#include "int8_out.cuh"
#if F8
#define OPER e4m3_t
typedef float acc_t;
#else
#define OPER i8
typedef int acc_t;
#endif
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
#ifndef SPLITK
#define SPLITK 0  // 1: work units are (tile, K slice) pairs whose fp32 partials a reduce kernel sums
#endif
#define EPI_GROUP 4  // column blocks (8 columns each) whose epilogue loads are batched
constexpr int KE = 128 / sizeof(OPER);  // K elements of one stage (one 128-byte row)
constexpr int VEC = 16 / sizeof(OPER);  // elements of one 16-byte chunk
static_assert(!SPLIT3 || sizeof(ELEM) == 4, "3xTF32 splits float operands");
static_assert(!I8 || (!SPLIT3 && !B_MN), "s8 wgmma reads both operands K-major");
static_assert(!F8 || (!I8 && !SPLIT3 && !B_MN), "e4m3 wgmma reads both operands K-major");
static_assert(EPI_GROUP == 4, "quad_row transposes across a quad of lanes: 4 column blocks");
static_assert(BN % (8 * EPI_GROUP) == 0, "the epilogue finishes whole groups of 4 column blocks (finish_rows' EPI_GROUPS, "
              "finish_pairs' steps): a tile of 144 columns left 128..143 unwritten and wrote past its own columns");
constexpr bool B_SCRATCH = !I8 && !F8 && sizeof(ELEM) == 4 && (SPLIT3 || B_MN);
constexpr int SCRATCH_BUFS = 3;
constexpr int SMALL_OFF = B_MN ? BN * 128 : 0;  // B's small part in a scratch buffer (its big part first if B_MN)
constexpr int SCRATCH_BYTES = B_SCRATCH ? (B_MN + SPLIT3) * BN * 128 : 0;

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

#if F8_PIECES == 1  // (the piece tiles' widths have no whole-tile wgmma: mainloop_f8_pieces)
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
#endif

// zero the accumulators; add a stage's products (`part`, its wgmma done) to them on the CUDA cores
__device__ __forceinline__ void zero_acc(float (&acc)[MSUB][BN / 2]) {
#pragma unroll
  for (int s = 0; s < MSUB; ++s)
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[s][i] = 0.f;
}
__device__ __forceinline__ void add_part(float (&acc)[MSUB][BN / 2], float (&part)[MSUB][BN / 2]) {
#pragma unroll
  for (int s = 0; s < MSUB; ++s) {
    fence_regs<BN / 2>(part[s]);
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[s][i] += part[s][i];
  }
}

#if !F8 && !I8  // (FP8 / INT8 kernels never run it: their 160- and 96-column GEMM tiles have no tf32 wgmma)
// The 3xTF32 K loop: each stage's products go to `part` and are added to `acc` on the CUDA cores
// (round to nearest): the tensor cores' own fp32 accumulation truncates, a bias that grows with
// K (measured on the H100: 3e-5 relative at K 4096 with one accumulator). The wait for a stage's
// wgmma before the next stage's fragments are written is also what keeps the A registers of an
// in-flight wgmma unchanged.
__device__ __forceinline__ void mainloop_3xtf32(float (&acc)[MSUB][BN / 2], Ring& r, unsigned char* smem,
                                                unsigned char* scratch, u64* full, u64* empty, int ktiles, int row0,
                                                int ct, int tid) {
  const int warp = tid / 32, lane = tid % 32;
  zero_acc(acc);
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
    add_part(acc, part);
    if (tid == 0) bar_arrive(&empty[r.stage]);
  }
}
#endif

#if F8 && F8_PIECES == 1 && !F8_FAST
// The FP8 K loop: each stage's wgmma (4 x k32) write `part` (scale_d 0 on the first), which the CUDA
// cores add to `acc` in fp32 once they are done (module comment: F8); the producer refills the stage
// meanwhile. The wait for a stage's wgmma before its `part` is read also keeps the registers of an
// in-flight wgmma unchanged.
__device__ __forceinline__ void mainloop_f8(float (&acc)[MSUB][BN / 2], Ring& r, unsigned char* smem, u64* full,
                                            u64* empty, int ktiles, int row0, int tid) {
  zero_acc(acc);
  for (int kt = 0; kt < ktiles; ++kt, r.next_stage()) {
    bar_wait(&full[r.stage], r.phase);
    const u32 a = smem_addr(smem + r.stage * STAGE_BYTES);
    float part[MSUB][BN / 2];
    wgmma_fence();
    wgmma_stage<BN, MSUB, 0, OPER>(part, a, a + BM * 128, row0, true);
    wgmma_commit();
    wgmma_wait<0>();
    add_part(acc, part);
    if (tid == 0) bar_arrive(&empty[r.stage]);
  }
}
#endif

#if F8 && F8_PIECES > 1
// The FP8 K loop of the GEMM and conv piece tiles (fp8_gemm_sm90.py, fp8_conv_sm90.py): a stage's BN
// columns in F8_PIECES pieces of F8_NP columns, each piece's four k32 wgmma into a fresh register
// block (scale_d 0 on the first) that the CUDA cores add to its columns of `acc`: every piece still
// holds one stage's products only (the F8 contract). F8_BUFS 2: two blocks, piece c + 1's wgmma issued before piece c is added
// (wait_group 1), so a warpgroup's adds overlap its own wgmma within the stage; the last piece's adds
// overlap the other consumer's wgmma only (a piece in flight across the stage loop's back edge makes
// ptxas serialize every wgmma, C7514). F8_BUFS 1: one block, each piece waited for and added (the
// 256-column tile's registers), the adds overlapping the other consumer's wgmma. Registers: BN / 2
// accumulators + F8_BUFS x F8_NP / 2 a thread (the m64nN fragment: 4 registers an 8-column block, in
// column order, so piece c is acc[s][c * F8_NP / 2 ..]).
#ifndef F8_BUFS
#define F8_BUFS 2
#endif
constexpr int F8_NP = BN / F8_PIECES;
static_assert(BN % F8_PIECES == 0 && F8_NP % 8 == 0 && (F8_BUFS == 1 || F8_BUFS == 2), "pieces of 8-column blocks");
__device__ __forceinline__ void add_piece(float (&acc)[MSUB][BN / 2], float (&part)[MSUB][F8_NP / 2], int c) {
#pragma unroll
  for (int s = 0; s < MSUB; ++s) {
    fence_regs<F8_NP / 2>(part[s]);
#pragma unroll
    for (int i = 0; i < F8_NP / 2; ++i) acc[s][c * (F8_NP / 2) + i] += part[s][i];
  }
}
__device__ __forceinline__ void mainloop_f8_pieces(float (&acc)[MSUB][BN / 2], Ring& r, unsigned char* smem, u64* full,
                                                   u64* empty, int ktiles, int row0, int tid) {
  float part[F8_BUFS][MSUB][F8_NP / 2];  // piece c in part[c % F8_BUFS]
  zero_acc(acc);
  for (int kt = 0; kt < ktiles; ++kt, r.next_stage()) {
    bar_wait(&full[r.stage], r.phase);
    const u32 a = smem_addr(smem + r.stage * STAGE_BYTES), b = a + BM * 128;
#pragma unroll
    for (int c = 0; c < F8_PIECES; ++c) {
      wgmma_fence();
      wgmma_stage<F8_NP, MSUB, 0, OPER>(part[c % F8_BUFS], a, b + c * F8_NP * 128, row0, true);
      wgmma_commit();
      if (F8_BUFS == 1) {
        wgmma_wait<0>();
        add_piece(acc, part[0], c);
      } else if (c > 0) {
        wgmma_wait<1>();  // the piece before this one is done
        add_piece(acc, part[(c - 1) % F8_BUFS], c - 1);
      }
    }
    if (F8_BUFS == 2) {
      wgmma_wait<0>();
      add_piece(acc, part[(F8_PIECES - 1) % F8_BUFS], F8_PIECES - 1);
    }
    if (tid == 0) bar_arrive(&empty[r.stage]);
  }
}
#endif

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

// A persistent block's work unit: output tile `ti` over K tiles [k0, k1). SPLITK: unit u is slice
// u / tiles of tile u % tiles, the slices `splits` near-equal K ranges (none empty: splits <= ktiles);
// else the whole K of tile u (splits 1).
struct Unit {
  TileIdx ti;
  int slice, k0, k1;
};
__device__ __forceinline__ Unit unit_of(int u, int tiles_m, int tiles_n, int tiles, int ktiles, int splits) {
  Unit w;
  w.slice = SPLITK ? u / tiles : 0;
  w.ti = tile_of(SPLITK ? u - w.slice * tiles : u, tiles_m, tiles_n, GROUP);
  w.k0 = SPLITK ? (int)((i64)w.slice * ktiles / splits) : 0;
  w.k1 = SPLITK ? (int)((i64)(w.slice + 1) * ktiles / splits) : ktiles;
  return w;
}

// advance a (stage, phase) ring position
__device__ __forceinline__ void next_stage(int& stage, u32& phase) {
  if (++stage == STAGES) {
    stage = 0;
    phase ^= 1;
  }
}

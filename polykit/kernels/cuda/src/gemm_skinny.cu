// gemm_skinny: Y [M, N] = alpha * A [M, K] x W + beta * C (+ the fused epilogue) for memory-bound
// GEMM shapes: M large, K small (the whole K of a tile of A fits in shared memory), any N. It runs
// 1x1 stride-1 channels-last convolutions (A = X as [NB*H*W, C], W the KRSC weight [N, K], the
// bias as C with scn 1) and MatMul / Gemm layers (gemm_skinny.py, conv_skinny.py).
//
// W is [N, K] (K contiguous: B_KN 0, a KRSC weight or a transposed Gemm B) or [K, N] (B_KN 1,
// N contiguous). A row-major [M, K] with K % 8 == 0 (16-byte rows); with B_KN 1, N % 8 == 0. ELEM is
// half_t or bf16_t; fp32 accumulation with mma.sync m16n8k16 (sm_80+).
// One block of 4 warps per BM-row tile of A (grid x ceil(M / BM); grid y splits N's chunks when
// there are too few row tiles to fill the GPU, each y its A tile again, from L2): it loads the tile's BM x K block of
// A once into shared memory with 16-byte cp.async (zeros past M and from K up to KP, K rounded up
// to 16), then walks N in chunks of BN columns; the chunks of W (BN x KP, from L2 after the first
// block) are double-buffered, the next loading while the current one's products and epilogue run.
// So A is read from DRAM once and Y written once: the traffic the shape's roofline counts. Warp w
// owns rows w * BM / 4.. of the tile and all BN columns of a chunk (fragments by ldmatrix; rows of
// shared memory padded by 8 elements, an odd number of 16-byte units: conflict-free ldmatrix).
// The epilogue stores column pairs as the accumulators lie: alpha * acc (+ beta * C[m * scm + n *
// scn]) with gemm_sm90's roundings, then apply_epilogue (epilogue_hook.cuh), at Y[m * LDY + n]: LDY
// (runtime) is N, or a channels-last Concat's channel total where a convolution's output is placed in
// its slice (conv_skinny.py); C and the epilogue's inputs keep the dense index m * N + n.
// Launch: grid (ceil(M / BM), n_splits <= ceil(N / BN)), block 128, dynamic shared memory skinny_smem (gemm_skinny.py):
// 2 * (BM * SK + 2 * WTILE) bytes, SK = KP + 8, WTILE = BN * SK (B_KN 0) or KP * (BN + 8) (B_KN 1).
#include "dtypes.cuh"
#include "epilogue_hook.cuh"

#ifndef B_KN
#define B_KN 0
#endif
#define WARPS 4
#define WM (BM / WARPS)  // rows of a warp
#define MT (WM / 16)     // m16 tiles of a warp
#define NT (BN / 8)      // n8 tiles of a chunk
static_assert(WM % 16 == 0 && BN % 16 == 0, "warp rows and chunk columns in whole mma tile pairs");

__device__ __forceinline__ u32 smem_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void cp16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_u32(dst)), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }
__device__ __forceinline__ void ldsm_x4(u32 (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm_x4_t(u32 (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(p)));
}
// MmaOp<T>::run(c, a, b0, b1): c += A (16 x 16) x B (16 x 8), T the operands' type (PTX name P)
template <class T> struct MmaOp;
#define SKINNY_MMA(T, P)                                                                                          \
  template <> struct MmaOp<T> {                                                                                   \
    __device__ static __forceinline__ void run(float* c, const u32* a, u32 b0, u32 b1) {                          \
      asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." P "." P ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, " \
                   "{%0,%1,%2,%3};\n"                                                                             \
                   : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                               \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));                              \
    }                                                                                                             \
  };
SKINNY_MMA(half_t, "f16")
SKINNY_MMA(bf16_t, "bf16")

// chunk `n0`'s W (BN columns, all KP of K) into `ws`, 16-byte pieces spread over the block
__device__ __forceinline__ void load_w(ELEM* ws, const ELEM* W, i64 N, int K, int KP, int SK, i64 n0) {
#if B_KN
  constexpr int PER_ROW = BN / 8;  // 16-byte pieces of a K row of the chunk
  for (int i = threadIdx.x; i < KP * PER_ROW; i += 128) {
    const int k = i / PER_ROW, c = i - k * PER_ROW;
    const i64 n = n0 + c * 8;
    const bool ok = k < K && n < N;
    cp16(ws + k * (BN + 8) + c * 8, W + (ok ? (i64)k * N + n : 0), ok);
  }
#else
  const int per_row = KP / 8;
  for (int i = threadIdx.x; i < BN * per_row; i += 128) {
    const int r = i / per_row, c = i - r * per_row;
    const bool ok = n0 + r < N && c * 8 < K;
    cp16(ws + r * SK + c * 8, W + (ok ? (n0 + r) * K + c * 8 : 0), ok);
  }
#endif
}

extern "C" __global__ void __launch_bounds__(128, 4) gemm_skinny(const ELEM* A, const ELEM* W, const ELEM* C, ELEM* Y,
                                                              i64 M, i64 N, int K, i64 scm, i64 scn, float alpha,
                                                              float beta, i64 LDY EPI_PARAMS) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int KP = (K + 15) & ~15, SK = KP + 8;
  constexpr int WS_KN = BN + 8;  // B_KN 1: a K row of a W chunk
  const int wtile = B_KN ? KP * WS_KN : BN * SK;
  ELEM* as = (ELEM*)smem_raw;
  ELEM* ws0 = as + BM * SK;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const i64 m0 = (i64)blockIdx.x * BM;
  {  // the A tile: rows m0.., all KP columns (zeros past M and K)
    const int per_row = KP / 8;
    for (int i = threadIdx.x; i < BM * per_row; i += 128) {
      const int r = i / per_row, c = i - r * per_row;
      const bool ok = m0 + r < M && c * 8 < K;
      cp16(as + r * SK + c * 8, A + (ok ? (m0 + r) * K + c * 8 : 0), ok);
    }
  }
  // this block's chunks of N: an even share of them by blockIdx.y (grid y > 1 when M has too few
  // tiles to fill the GPU)
  const int chunks = (int)((N + BN - 1) / BN), per = (chunks + gridDim.y - 1) / gridDim.y;
  const int c_begin = blockIdx.y * per, c_end = min(chunks, c_begin + per);
  load_w(ws0, W, N, K, KP, SK, (i64)c_begin * BN);
  cp_commit();
#if HAS_EPILOGUE
  const EpiState E = make_epi(EPI_ARGS);
#endif
  const int row = lane / 4, pair = 2 * (lane % 4);
  for (int ch = c_begin; ch < c_end; ++ch) {
    const i64 n0 = (i64)ch * BN;
    ELEM* ws = ws0 + ((ch - c_begin) & 1) * wtile;
    if (ch + 1 < c_end) {
      load_w(ws0 + ((ch - c_begin + 1) & 1) * wtile, W, N, K, KP, SK, n0 + BN);
      cp_commit();
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    __syncthreads();
    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.f;
    // columns past N hold zeros in W: their products are computed and never stored
    for (int k0 = 0; k0 < KP; k0 += 16) {
      u32 af[MT][4];
#pragma unroll
      for (int i = 0; i < MT; ++i)
        ldsm_x4(af[i], as + (warp * WM + i * 16 + lane % 16) * SK + k0 + (lane / 16) * 8);
#pragma unroll
      for (int j = 0; j < NT; j += 2) {
        u32 bf[4];  // n8 tiles j and j + 1: b0, b1 of each
        const int q = lane / 8, r = lane % 8;
#if B_KN
        ldsm_x4_t(bf, ws + (k0 + (q % 2) * 8 + r) * WS_KN + j * 8 + (q / 2) * 8);
#else
        ldsm_x4(bf, ws + (j * 8 + (q / 2) * 8 + r) * SK + k0 + (q % 2) * 8);
#endif
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          MmaOp<ELEM>::run(acc[i][j], af[i], bf[0], bf[1]);
          MmaOp<ELEM>::run(acc[i][j + 1], af[i], bf[2], bf[3]);
        }
      }
    }
    // epilogue: rows row, row + 8 of each m16 tile, columns pair, pair + 1 of each n8 tile
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const i64 m = m0 + warp * WM + i * 16 + row + h * 8;
        if (m >= M) continue;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          const i64 n = n0 + j * 8 + pair;
          if (n >= N) continue;
          float v[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float a = acc[i][j][2 * h + e];
            const i64 ne = n + e < N ? n + e : n;
            v[e] = C ? __fmaf_rn(beta, ld(C, m * scm + ne * scn), __fmul_rn(alpha, a)) : __fmul_rn(alpha, a);
#if HAS_EPILOGUE
            v[e] = apply_epilogue(E, v[e], m * N + ne, ne);
#endif
          }
          ELEM* y = Y + m * LDY + n;
          if (n + 1 < N && ((N | LDY) & 1) == 0 && ((u64)Y & (2 * sizeof(ELEM) - 1)) == 0) {
            struct __align__(2 * sizeof(ELEM)) Pair { ELEM v[2]; } p2;
            st(p2.v, 0, v[0]);
            st(p2.v, 1, v[1]);
            *(Pair*)y = p2;
          } else {
            st(y, 0, v[0]);
            if (n + 1 < N) st(y, 1, v[1]);
          }
        }
      }
    __syncthreads();  // every warp is done with this chunk's W buffer before it is refilled
  }
}

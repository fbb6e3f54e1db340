// MatMul / Gemm: Y[z] = alpha * A[z] (M x K) * B[z] (K x N) + beta * C, fp32 accumulation.
//
// ELEM (define) is the storage type of A, B, C, Y: float or half_t.
// A, B are addressed through element strides (sam, sak) and (sbk, sbn), so transposes and
// 1-D operands need no copy. Batch: z = blockIdx.z runs over up to 4 collapsed batch dims
// (d0 implied, d1..d3 innermost last) with per-operand batch strides (0 = broadcast);
// Y is contiguous (z, M, N). C (Gemm only, may be null) is broadcast to (M, N) by strides.
// Launch: gemm_simt  grid (ceil(N/64), ceil(M/64), batch * splits), block 256 (64x64x16 tiles, 4x4/thread)
//         gemm_simt_wide  grid (ceil(N/128), ceil(M/128), batch * splits), block 256 (128x128x16, 8x8/thread)
//         gemm_mma   grid (ceil(N/128), ceil(M/128), batch * splits), block 256 (mma.sync m16n8k16)
//         gemm_splitk_reduce  grid (ceil(M*N/256) capped, 1, batch), block 256, after either of
//                    them ran with splits > 1 into `partial` (fp32, batch * splits * M * N)
#include "gemm_core.cuh"

// the fused-epilogue hook (HAS_EPILOGUE, EPI_PARAMS, ...; epilogue_hook.cuh)
#include "epilogue_hook.cuh"

struct GemmP {
  const ELEM* A; const ELEM* B; const ELEM* C; ELEM* Y;
  i64 M, N, K, sam, sak, sbk, sbn, scm, scn;
  float alpha, beta;
  i64 ybase;
#if HAS_EPILOGUE
  EpiState epi;
#endif
  __device__ __forceinline__ float a(i64, i64 m, i64 k) const { return (float)ld(A, m * sam + k * sak); }
  typedef i64 Col;  // column n's offset into B
  __device__ __forceinline__ Col col(i64, i64 n) const { return n * sbn; }
  __device__ __forceinline__ float b(i64, i64 k, Col c) const { return (float)ld(B, k * sbk + c); }
  __device__ __forceinline__ void store(i64, i64 m, i64 n, float acc) const {
    float v = alpha * acc;
    if (C) v += beta * (float)ld(C, m * scm + n * scn);
#if HAS_EPILOGUE
    v = apply_epilogue(epi, v, ybase + m * N + n, n);
#endif
    st(Y, m * N + n, v);
  }
};

__device__ __forceinline__ GemmP make_problem(
    i64 z, const ELEM* A, const ELEM* B, const ELEM* C, ELEM* Y, i64 M, i64 N, i64 K, i64 sam, i64 sak, i64 sbk,
    i64 sbn, i64 scm, i64 scn, float alpha, float beta, i64 d1, i64 d2, i64 d3, i64 a0, i64 a1, i64 a2, i64 a3,
    i64 b0, i64 b1, i64 b2, i64 b3) {
  const i64 item = z;
  const i64 i3 = z % d3; z /= d3;
  const i64 i2 = z % d2; z /= d2;
  const i64 i1 = z % d1; const i64 i0 = z / d1;
  GemmP p;
  p.A = A + i0 * a0 + i1 * a1 + i2 * a2 + i3 * a3;
  p.B = B + i0 * b0 + i1 * b1 + i2 * b2 + i3 * b3;
  p.C = C; p.ybase = item * M * N; p.Y = Y + p.ybase;
  p.M = M; p.N = N; p.K = K; p.sam = sam; p.sak = sak; p.sbk = sbk; p.sbn = sbn; p.scm = scm; p.scn = scn;
  p.alpha = alpha; p.beta = beta;
  return p;
}

#define GEMM_PARAMS                                                                                          \
  const ELEM *A, const ELEM *B, const ELEM *C, ELEM *Y, i64 M, i64 N, i64 K, i64 sam, i64 sak, i64 sbk,     \
      i64 sbn, i64 scm, i64 scn, float alpha, float beta, i64 d1, i64 d2, i64 d3, i64 a0, i64 a1, i64 a2,     \
      i64 a3, i64 b0, i64 b1, i64 b2, i64 b3, i64 splits, float *partial EPI_PARAMS
#define GEMM_ARGS A, B, C, Y, M, N, K, sam, sak, sbk, sbn, scm, scn, alpha, beta, d1, d2, d3, a0, a1, a2, a3, b0, b1, b2, b3

__device__ __forceinline__ GemmP problem_of(i64 z, GEMM_PARAMS) {
  GemmP p = make_problem(z, GEMM_ARGS);
#if HAS_EPILOGUE
  p.epi = make_epi(EPI_ARGS);
#endif
  return p;
}
#define ALL_ARGS GEMM_ARGS, splits, partial EPI_COMMA_ARGS

extern "C" __global__ void __launch_bounds__(256) gemm_simt(GEMM_PARAMS) {
  const KSlice t = k_slice(K, splits, 16);
  simt_gemm<GemmP, 64, 64, 16, 4, 4>(problem_of(t.z, ALL_ARGS), t, splits > 1 ? partial : nullptr);
}

// 128 x 128 x 16 tiles, 8 x 8 outputs a thread: twice the FMAs per shared-memory load of gemm_simt
extern "C" __global__ void __launch_bounds__(256) gemm_simt_wide(GEMM_PARAMS) {
  const KSlice t = k_slice(K, splits, 16);
  simt_gemm<GemmP, 128, 128, 16, 8, 8>(problem_of(t.z, ALL_ARGS), t, splits > 1 ? partial : nullptr);
}

extern "C" __global__ void __launch_bounds__(256) gemm_mma(GEMM_PARAMS) {
  const KSlice t = k_slice(K, splits, MMA_BK);
  mma_gemm<GemmP>(problem_of(t.z, ALL_ARGS), t, splits > 1 ? partial : nullptr);
}

extern "C" __global__ void __launch_bounds__(256) gemm_splitk_reduce(GEMM_PARAMS) {
  splitk_reduce<GemmP>([&](i64 z) { return problem_of(z, ALL_ARGS); }, splits, partial);
}

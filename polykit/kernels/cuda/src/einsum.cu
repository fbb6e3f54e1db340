// Einsum of one or two operands as ONE batched contraction Y[b, m, n] = sum_k A[b, m, k] * B[b, k, n].
//
// The host (einsum.py) sorts every letter of the equation into four groups -- batch (in
// both operands and the output), M (first operand and output), N (second operand and
// output), K (summed) -- and collapses each group to <= 4 strided dims (size, element
// stride in A, in B, in Y; stride 0 where a tensor lacks the letter or broadcasts it;
// repeated letters of one term add their strides: diagonals). So transposes, diagonals,
// broadcasting and single-operand reductions need no copies. With one operand, B == 0 and
// counts as 1.
// Geometry: blockDim = 256 (16 x 16), one block per 64 x 64 tile of (M, N) (grid.x over N,
// grid.y over M), grid.z grid-strides over batch. Each thread accumulates a 4 x 4 micro tile
// (rows ty + 16i, cols tx + 16j: consecutive threads -> consecutive n). K advances in
// tiles of 16 staged in shared memory; a_k_inner / b_n_inner choose the load order so the
// unit-stride dimension of each operand is read by consecutive threads (coalesced).
// Accumulates in fp32 (fp16/bf16/fp32 storage), fp64 (double) or 64-bit integers; deterministic.
#include "dtypes.cuh"

template <class T> struct EsAcc { typedef typename Compute<T>::type type; };
template <> struct EsAcc<i32> { typedef i64 type; };

#define ES_TM 64
#define ES_TN 64
#define ES_TK 16
#define ES_MAXD 4

struct EsGroup { i64 n[ES_MAXD], a[ES_MAXD], b[ES_MAXD], y[ES_MAXD]; };

// offsets in A, B and Y of index i of a group (dim 0 innermost)
__device__ __forceinline__ void es_offsets(const EsGroup& g, i64 i, i64& oa, i64& ob, i64& oy) {
  oa = ob = oy = 0;
#pragma unroll
  for (int d = 0; d < ES_MAXD; ++d) {
    const i64 q = i / g.n[d], r = i - q * g.n[d];
    oa += r * g.a[d]; ob += r * g.b[d]; oy += r * g.y[d];
    i = q;
  }
}

__device__ __forceinline__ i64 es_total(const EsGroup& g) { return g.n[0] * g.n[1] * g.n[2] * g.n[3]; }

template <class T>
__device__ void einsum_impl(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ Y,
                            const EsGroup& gb, const EsGroup& gm, const EsGroup& gn, const EsGroup& gk,
                            i64 a_k_inner, i64 b_n_inner) {
  typedef typename EsAcc<T>::type Acc;
  __shared__ Acc As[ES_TK][ES_TM];
  __shared__ Acc Bs[ES_TK][ES_TN];
  __shared__ i64 am[ES_TM], ym[ES_TM], bn[ES_TN], yn[ES_TN], ak[ES_TK], bk[ES_TK];
  const i64 nb = es_total(gb), M = es_total(gm), N = es_total(gn), K = es_total(gk);
  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  const i64 m0 = (i64)blockIdx.y * ES_TM, n0 = (i64)blockIdx.x * ES_TN;
  i64 da, db, dy;
  if (tid < ES_TM && m0 + tid < M) { es_offsets(gm, m0 + tid, da, db, dy); am[tid] = da; ym[tid] = dy; }
  if (tid >= 64 && tid < 64 + ES_TN && n0 + tid - 64 < N) {
    es_offsets(gn, n0 + tid - 64, da, db, dy); bn[tid - 64] = db; yn[tid - 64] = dy;
  }
  __syncthreads();
  for (i64 bz = blockIdx.z; bz < nb; bz += gridDim.z) {
    i64 ba, bb, by;
    es_offsets(gb, bz, ba, bb, by);
    Acc acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][j] = 0;
    for (i64 k0 = 0; k0 < K; k0 += ES_TK) {
      __syncthreads();  // previous tile consumed; am/bn written
      if (tid < ES_TK && k0 + tid < K) { es_offsets(gk, k0 + tid, da, db, dy); ak[tid] = da; bk[tid] = db; }
      __syncthreads();
#pragma unroll
      for (int r = 0; r < (ES_TM * ES_TK) / 256; ++r) {
        const int e = tid + 256 * r;
        const int mm = a_k_inner ? e / ES_TK : e % ES_TM, kk = a_k_inner ? e % ES_TK : e / ES_TM;
        As[kk][mm] = (m0 + mm < M && k0 + kk < K) ? (Acc)ld(A, ba + am[mm] + ak[kk]) : (Acc)0;
      }
#pragma unroll
      for (int r = 0; r < (ES_TN * ES_TK) / 256; ++r) {
        const int e = tid + 256 * r;
        const int nn = b_n_inner ? e % ES_TN : e / ES_TK, kk = b_n_inner ? e / ES_TN : e % ES_TK;
        Bs[kk][nn] = (n0 + nn < N && k0 + kk < K) ? (B ? (Acc)ld(B, bb + bk[kk] + bn[nn]) : (Acc)1) : (Acc)0;
      }
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < ES_TK; ++kk) {
        Acc av[4], bv[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) av[i] = As[kk][ty + 16 * i];
#pragma unroll
        for (int j = 0; j < 4; ++j) bv[j] = Bs[kk][tx + 16 * j];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[i][j] += av[i] * bv[j];
      }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int mm = ty + 16 * i, nn = tx + 16 * j;
        if (m0 + mm < M && n0 + nn < N) st(Y, by + ym[mm] + yn[nn], acc[i][j]);
      }
  }
}

#define ES_DIM(g, d) i64 g##n##d, i64 g##a##d, i64 g##b##d, i64 g##y##d
#define ES_GROUP_ARGS(g) ES_DIM(g, 0), ES_DIM(g, 1), ES_DIM(g, 2), ES_DIM(g, 3)
#define ES_GROUP(g)                                                    \
  const EsGroup g = {{g##n0, g##n1, g##n2, g##n3}, {g##a0, g##a1, g##a2, g##a3}, \
                     {g##b0, g##b1, g##b2, g##b3}, {g##y0, g##y1, g##y2, g##y3}};
#define EINSUM(T, code)                                                                                  \
  extern "C" __global__ void __launch_bounds__(256) einsum_##code(                                      \
      const T* A, const T* B, T* Y, i64 a_k_inner, i64 b_n_inner, ES_GROUP_ARGS(gb), ES_GROUP_ARGS(gm), \
      ES_GROUP_ARGS(gn), ES_GROUP_ARGS(gk)) {                                                            \
    ES_GROUP(gb) ES_GROUP(gm) ES_GROUP(gn) ES_GROUP(gk)                                                  \
    einsum_impl<T>(A, B, Y, gb, gm, gn, gk, a_k_inner, b_n_inner);                                       \
  }

EINSUM(float, f32)
EINSUM(half_t, f16)
EINSUM(bf16_t, bf16)
EINSUM(double, f64)
EINSUM(i32, i32)
EINSUM(i64, i64)

// ai.polykit Attention: Y = softmax(Q K^T * scale + mask) V, softmax over keys. Simple and exact.
//
// Layout: Q [B.., S, D], K [B.., Skv, D], V [B.., Skv, Dv] contiguous; batch dims broadcast
// (per-tensor batch strides, 0 on broadcast dims, collapsed on the host to <= 8 dims); mask
// (optional) additive (T) or boolean keep-mask, broadcast to [B.., S, Skv] through strides.
// Geometry: one block per (batch, query row), grid-stride; dynamic shared memory holds the
// query row (D values) and the row's scores (Skv values) in the compute type A: float for
// fp32/fp16 tensors, double for fp64 ones. Scores: thread per key (dot over D);
// softmax with deterministic block reductions; output: thread per Dv column, serial over keys
// (coalesced reads of V rows). FLOPs 2*S*Skv*(D+Dv) per batch; bytes ~ S*Skv*D reads of K
// (L2-resident for BERT-sized heads). attention_tiled_* below is the fast path for float/half
// with D, Dv <= 128; this kernel serves float64 and wider heads.
#include "blockreduce.cuh"

#define STR8(p) i64 p##0, i64 p##1, i64 p##2, i64 p##3, i64 p##4, i64 p##5, i64 p##6, i64 p##7
#define ARR8(name, p) const i64 name[8] = {p##0, p##1, p##2, p##3, p##4, p##5, p##6, p##7}

// score + mask in the compute type A (float, or double for float64 tensors)
template <class A, class M> struct MaskOp {
  __device__ static A apply(A s, M m) { return s + (A)m; }
};
template <class A> struct MaskOp<A, half_t> {
  __device__ static A apply(A s, half_t m) { return s + (A)h2f(m); }
};
template <class A> struct MaskOp<A, bool> {
  __device__ static A apply(A s, bool m) { return m ? s : -(A)__int_as_float(0x7f800000); }
};

__device__ __forceinline__ float att_exp(float x) { return expf(x); }
__device__ __forceinline__ double att_exp(double x) { return exp(x); }

template <class T, class M, class A>
__device__ void attention(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                          const M* __restrict__ mask, T* __restrict__ y, i64 nb, i64 nbd, const i64* bd,
                          const i64* qs, const i64* ks, const i64* vs, const i64* ms, i64 ms_s, i64 ms_j,
                          i64 S, i64 Skv, i64 D, i64 Dv, A scale, i64 nan_to_zero) {
  extern __shared__ __align__(8) unsigned char att_sh[];
  A* qrow = (A*)att_sh;
  A* score = qrow + D;
  __shared__ A red[32];
  const A ninf = -(A)__int_as_float(0x7f800000);
  for (i64 row = blockIdx.x; row < nb * S; row += gridDim.x) {
    const i64 b = row / S, s = row - b * S;
    i64 r = b, qo = 0, ko = 0, vo = 0, mo = 0;
    for (int d = (int)nbd - 1; d >= 0; --d) {
      const i64 qq = d ? r / bd[d] : 0, c = r - qq * bd[d];
      qo += c * qs[d]; ko += c * ks[d]; vo += c * vs[d]; mo += c * ms[d];
      r = qq;
    }
    const T* qr = q + qo + s * D;
    const T* kb = k + ko;
    const T* vb = v + vo;
    __syncthreads();
    for (i64 j = threadIdx.x; j < D; j += blockDim.x) qrow[j] = (A)ld(qr, j);
    __syncthreads();
    A m = ninf;
    for (i64 j = threadIdx.x; j < Skv; j += blockDim.x) {
      const T* kr = kb + j * D;
      A acc = 0;
      for (i64 t = 0; t < D; ++t) acc += qrow[t] * (A)ld(kr, t);
      acc *= scale;
      if (mask) acc = MaskOp<A, M>::apply(acc, mask[mo + s * ms_s + j * ms_j]);
      score[j] = acc;
      m = OpMax()(m, acc);
    }
    m = block_reduce(m, OpMax(), ninf, red);
    A sum = 0;
    for (i64 j = threadIdx.x; j < Skv; j += blockDim.x) {
      const A e = att_exp(score[j] - m);
      score[j] = e;
      sum += e;
    }
    sum = block_reduce(sum, OpSum(), (A)0, red);
    const A inv = (A)1 / sum;
    __syncthreads();
    for (i64 c = threadIdx.x; c < Dv; c += blockDim.x) {
      A acc = 0;
      for (i64 j = 0; j < Skv; ++j) {
        A p = score[j] * inv;
        if (nan_to_zero && p != p) p = 0;
        acc += p * (A)ld(vb, j * Dv + c);
      }
      st(y, row * Dv + c, acc);
    }
  }
}

// ---- tiled: float compute, D and Dv <= 128 (the transformer case) ------------------------------
// One block of 4 warps per (batch, AT_QT query rows); K and V stream through shared memory in
// tiles of AT_KT keys (one key per lane for the scores), so each K/V element is read once per
// AT_QT rows instead of once per row. Online softmax per row (running max m, sum l, output
// accumulators rescaled by exp(m_old - m_new)); warp reductions in a fixed order, so the
// result is deterministic. A row whose softmax is undefined in the simple kernel (every score
// -inf, or a NaN/+inf score: l ends NaN or m stays -inf) gives NaN, or 0 with nan_to_zero,
// exactly as there. Dynamic shared memory: 4 * (AT_QT*D + AT_KT*(D+1) + AT_KT*Dv) bytes.
// Grid min(nb * ceil(S / AT_QT), 2^20), block 128. HD > 0: D == Dv == HD known at compile time
// (the _h64 / _h128 kernels: unrolled dot products, shifts instead of divisions), else both
// taken at run time.
#define AT_QT 16
#define AT_KT 32
#define AT_RW 4  // rows per warp (AT_QT / 4 warps)
#define AT_CU 4  // output columns per lane (Dv <= 128)

__device__ __forceinline__ float warp_max_nan(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = OpMax()(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

template <class T, class M, int HD>
__device__ void attention_tiled(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                const M* __restrict__ mask, T* __restrict__ y, i64 nb, i64 nbd, const i64* bd,
                                const i64* qs, const i64* ks, const i64* vs, const i64* ms, i64 ms_s, i64 ms_j,
                                i64 S, i64 Skv, i64 D_, i64 Dv_, float scale, i64 nan_to_zero) {
  const int D = HD ? HD : (int)D_, Dv = HD ? HD : (int)Dv_;
  extern __shared__ __align__(8) unsigned char att_sh[];
  float* Qs = (float*)att_sh;        // [AT_QT][D]
  float* Ks = Qs + AT_QT * D;        // [AT_KT][D + 1] (odd pitch: lanes read different rows)
  float* Vs = Ks + AT_KT * (D + 1);  // [AT_KT][Dv]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float ninf = -__int_as_float(0x7f800000);
  const i64 tiles = (S + AT_QT - 1) / AT_QT;
  for (i64 blk = blockIdx.x; blk < nb * tiles; blk += gridDim.x) {
    const i64 b = blk / tiles, s0 = (blk - b * tiles) * AT_QT;
    i64 r = b, qo = 0, ko = 0, vo = 0, mo = 0;
    for (int d = (int)nbd - 1; d >= 0; --d) {
      const i64 qq = d ? r / bd[d] : 0, c = r - qq * bd[d];
      qo += c * qs[d]; ko += c * ks[d]; vo += c * vs[d]; mo += c * ms[d];
      r = qq;
    }
    __syncthreads();  // the previous block-iteration is done with shared memory
    for (int i = threadIdx.x; i < AT_QT * D; i += blockDim.x) {
      const int row = i / D;
      Qs[i] = s0 + row < S ? (float)ld(q + qo, (s0 + row) * D + (i - row * D)) : 0.f;
    }
    float m[AT_RW], l[AT_RW], acc[AT_RW][AT_CU];
#pragma unroll
    for (int rr = 0; rr < AT_RW; ++rr) {
      m[rr] = ninf; l[rr] = 0.f;
#pragma unroll
      for (int u = 0; u < AT_CU; ++u) acc[rr][u] = 0.f;
    }
    for (i64 j0 = 0; j0 < Skv; j0 += AT_KT) {
      __syncthreads();  // the previous tile is consumed
      for (int i = threadIdx.x; i < AT_KT * D; i += blockDim.x) {
        const int row = i / D, t = i - row * D;
        Ks[row * (D + 1) + t] = j0 + row < Skv ? (float)ld(k + ko, (j0 + row) * D + t) : 0.f;
      }
      for (int i = threadIdx.x; i < AT_KT * Dv; i += blockDim.x) {
        const int row = i / Dv;
        Vs[i] = j0 + row < Skv ? (float)ld(v + vo, (j0 + row) * Dv + (i - row * Dv)) : 0.f;
      }
      __syncthreads();
      const i64 j = j0 + lane;
      const bool jok = j < Skv;
      const int nk = Skv - j0 < AT_KT ? (int)(Skv - j0) : AT_KT;
#pragma unroll
      for (int rr = 0; rr < AT_RW; ++rr) {
        const int qrow = warp * AT_RW + rr;
        const i64 s = s0 + qrow;
        if (s >= S) break;  // warp-uniform
        const float* qv = Qs + qrow * D;
        const float* kv = Ks + lane * (D + 1);
        float sc = 0.f;
#pragma unroll(HD ? 16 : 1)
        for (int t = 0; t < D; ++t) sc += qv[t] * kv[t];
        sc *= scale;
        if (mask && jok) sc = MaskOp<float, M>::apply(sc, mask[mo + s * ms_s + j * ms_j]);
        if (!jok) sc = ninf;
        const float mn = OpMax()(m[rr], warp_max_nan(sc));
        float p = 0.f, alpha = 1.f;
        if (mn != ninf) {
          p = jok ? expf(sc - mn) : 0.f;
          alpha = expf(m[rr] - mn);
        }
        l[rr] = l[rr] * alpha + warp_sum(p);
        m[rr] = mn;
#pragma unroll
        for (int u = 0; u < AT_CU; ++u) acc[rr][u] *= alpha;
#pragma unroll(HD ? 4 : 1)
        for (int jj = 0; jj < nk; ++jj) {
          const float pj = __shfl_sync(0xffffffffu, p, jj);
          const float* vr = Vs + jj * Dv;
#pragma unroll
          for (int u = 0; u < AT_CU; ++u) {
            const int c = lane + 32 * u;
            if (c < Dv) acc[rr][u] += pj * vr[c];
          }
        }
      }
    }
#pragma unroll
    for (int rr = 0; rr < AT_RW; ++rr) {
      const i64 s = s0 + warp * AT_RW + rr;
      if (s >= S) break;
      const bool undefined = !(l[rr] == l[rr]) || m[rr] == ninf;
      const float nan = __int_as_float(0x7fc00000);
      const float inv = 1.f / l[rr];
#pragma unroll
      for (int u = 0; u < AT_CU; ++u) {
        const int c = lane + 32 * u;
        if (c < Dv) st(y, (b * S + s) * Dv + c, undefined ? (nan_to_zero ? 0.f : nan) : acc[rr][u] * inv);
      }
    }
  }
}

#define ATTN_TILED_HD(T, M, code, HD)                                                                             \
  extern "C" __global__ void __launch_bounds__(128) attention_tiled_##code(                                       \
      const T* q, const T* k, const T* v, const M* mask, T* y, i64 nb, i64 nbd, STR8(b), STR8(q), STR8(k), STR8(v), \
      STR8(m), i64 ms_s, i64 ms_j, i64 S, i64 Skv, i64 D, i64 Dv, float scale, i64 nz) {                           \
    ARR8(bd, b); ARR8(qs, q); ARR8(ks, k); ARR8(vs, v); ARR8(ms, m);                                               \
    attention_tiled<T, M, HD>(q, k, v, mask, y, nb, nbd, bd, qs, ks, vs, ms, ms_s, ms_j, S, Skv, D, Dv, scale, nz); \
  }
#define ATTN_TILED(T, M, code)          \
  ATTN_TILED_HD(T, M, code, 0)          \
  ATTN_TILED_HD(T, M, code##_h64, 64)   \
  ATTN_TILED_HD(T, M, code##_h128, 128)
ATTN_TILED(float, float, f32)
ATTN_TILED(float, bool, f32_b8)
ATTN_TILED(half_t, half_t, f16)
ATTN_TILED(half_t, bool, f16_b8)

#define ATTN(T, M, A, code)                                                                                      \
  extern "C" __global__ void attention_##code(const T* q, const T* k, const T* v, const M* mask, T* y, i64 nb,   \
                                              i64 nbd, STR8(b), STR8(q), STR8(k), STR8(v), STR8(m), i64 ms_s,    \
                                              i64 ms_j, i64 S, i64 Skv, i64 D, i64 Dv, A scale, i64 nz) {        \
    ARR8(bd, b); ARR8(qs, q); ARR8(ks, k); ARR8(vs, v); ARR8(ms, m);                                             \
    attention<T, M, A>(q, k, v, mask, y, nb, nbd, bd, qs, ks, vs, ms, ms_s, ms_j, S, Skv, D, Dv, scale, nz);     \
  }
ATTN(float, float, float, f32)
ATTN(float, bool, float, f32_b8)
ATTN(half_t, half_t, float, f16)
ATTN(half_t, bool, float, f16_b8)
ATTN(double, double, double, f64)
ATTN(double, bool, double, f64_b8)

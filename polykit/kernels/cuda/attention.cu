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
// (L2-resident for BERT-sized heads) -- a flash-style tiled kernel is the faster successor.
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

// ai.polykit Attention: Y = softmax(Q K^T * scale + mask) V, softmax over keys. Simple and exact.
//
// Layout: Q [B.., S, D], K [B.., Skv, D], V [B.., Skv, Dv] contiguous; batch dims broadcast
// (per-tensor batch strides, 0 on broadcast dims, collapsed on the host to <= 8 dims); mask
// (optional) additive (T) or boolean keep-mask, broadcast to [B.., S, Skv] through strides.
// Geometry: one block per (batch, query row), grid-stride; dynamic shared memory holds the
// query row (D floats) and the row's scores (Skv floats). Scores: thread per key (dot over D);
// softmax with deterministic block reductions; output: thread per Dv column, serial over keys
// (coalesced reads of V rows). FLOPs 2*S*Skv*(D+Dv) per batch; bytes ~ S*Skv*D reads of K
// (L2-resident for BERT-sized heads) -- a flash-style tiled kernel is the faster successor.
#include "blockreduce.cuh"

#define STR8(p) i64 p##0, i64 p##1, i64 p##2, i64 p##3, i64 p##4, i64 p##5, i64 p##6, i64 p##7
#define ARR8(name, p) const i64 name[8] = {p##0, p##1, p##2, p##3, p##4, p##5, p##6, p##7}

template <class M> struct MaskOp {
  __device__ static float apply(float s, M m) { return s + (float)m; }
};
template <> struct MaskOp<half_t> {
  __device__ static float apply(float s, half_t m) { return s + h2f(m); }
};
template <> struct MaskOp<bool> {
  __device__ static float apply(float s, bool m) { return m ? s : -__int_as_float(0x7f800000); }
};

template <class T, class M>
__device__ void attention(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                          const M* __restrict__ mask, T* __restrict__ y, i64 nb, i64 nbd, const i64* bd,
                          const i64* qs, const i64* ks, const i64* vs, const i64* ms, i64 ms_s, i64 ms_j,
                          i64 S, i64 Skv, i64 D, i64 Dv, float scale, i64 nan_to_zero) {
  extern __shared__ float sh[];
  float* qrow = sh;
  float* score = sh + D;
  __shared__ float red[32];
  const float ninf = -__int_as_float(0x7f800000);
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
    for (i64 j = threadIdx.x; j < D; j += blockDim.x) qrow[j] = (float)ld(qr, j);
    __syncthreads();
    float m = ninf;
    for (i64 j = threadIdx.x; j < Skv; j += blockDim.x) {
      const T* kr = kb + j * D;
      float acc = 0.f;
      for (i64 t = 0; t < D; ++t) acc += qrow[t] * (float)ld(kr, t);
      acc *= scale;
      if (mask) acc = MaskOp<M>::apply(acc, mask[mo + s * ms_s + j * ms_j]);
      score[j] = acc;
      m = OpMax()(m, acc);
    }
    m = block_reduce(m, OpMax(), ninf, red);
    float sum = 0.f;
    for (i64 j = threadIdx.x; j < Skv; j += blockDim.x) {
      const float e = expf(score[j] - m);
      score[j] = e;
      sum += e;
    }
    sum = block_reduce(sum, OpSum(), 0.f, red);
    const float inv = 1.f / sum;
    __syncthreads();
    for (i64 c = threadIdx.x; c < Dv; c += blockDim.x) {
      float acc = 0.f;
      for (i64 j = 0; j < Skv; ++j) {
        float p = score[j] * inv;
        if (nan_to_zero && p != p) p = 0.f;
        acc += p * (float)ld(vb, j * Dv + c);
      }
      st(y, row * Dv + c, acc);
    }
  }
}

#define ATTN(T, M, code)                                                                                         \
  extern "C" __global__ void attention_##code(const T* q, const T* k, const T* v, const M* mask, T* y, i64 nb,   \
                                              i64 nbd, STR8(b), STR8(q), STR8(k), STR8(v), STR8(m), i64 ms_s,    \
                                              i64 ms_j, i64 S, i64 Skv, i64 D, i64 Dv, float scale, i64 nz) {    \
    ARR8(bd, b); ARR8(qs, q); ARR8(ks, k); ARR8(vs, v); ARR8(ms, m);                                             \
    attention<T, M>(q, k, v, mask, y, nb, nbd, bd, qs, ks, vs, ms, ms_s, ms_j, S, Skv, D, Dv, scale, nz);        \
  }
ATTN(float, float, f32)
ATTN(float, bool, f32_b8)
ATTN(half_t, half_t, f16)
ATTN(half_t, bool, f16_b8)

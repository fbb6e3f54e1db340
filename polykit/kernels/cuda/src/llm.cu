// The newest LLM ops (kernels/reference/llm.py is the contract): RotaryEmbedding, SwiGLU,
// TensorScatter, CausalConvWithState, LinearAttention. Float compute (double for float64),
// rounding to the storage type where the reference does.
#include "dtypes.cuh"

#define GRID_STRIDE(e, n) for (i64 e = blockIdx.x * (i64)blockDim.x + threadIdx.x; e < (n); e += (i64)gridDim.x * blockDim.x)

__device__ __forceinline__ float ex(float x) { return expf(x); }
__device__ __forceinline__ double ex(double x) { return exp(x); }

template <class T, class A> __device__ __forceinline__ A round_to(A x) { return x; }
template <> __device__ __forceinline__ float round_to<half_t, float>(float x) { return h2f(f2h(x)); }
template <> __device__ __forceinline__ float round_to<bf16_t, float>(float x) { return b2f(f2b(x)); }

// ---- RotaryEmbedding ----------------------------------------------------------------------------
// X / Y logically [B, S, H, D] read through (batch, head, seq) element strides (rank 4 [B, H, S, D]
// or rank 3 [B, S, H*D]); cos / sin rows of rot/2 values: cache[pos[b*S + s]] with position ids,
// else cache[b*S + s]. One thread per element, grid-stride.
template <class T>
__device__ void rotary(const T* __restrict__ x, const T* __restrict__ cosc, const T* __restrict__ sinc,
                       const i64* __restrict__ pos, T* __restrict__ y, i64 B, i64 S, i64 H, i64 D, i64 sb, i64 sh,
                       i64 ss, i64 rot, i64 interleaved) {
  const i64 half = rot / 2;
  GRID_STRIDE(e, B * S * H * D) {
    const i64 d = e % D, h = (e / D) % H, s = (e / (D * H)) % S, b = e / (D * H * S);
    const T* xr = x + b * sb + h * sh + s * ss;
    const i64 o = b * sb + h * sh + s * ss + d;
    if (d >= rot) { y[o] = xr[d]; continue; }
    const i64 f = interleaved ? d / 2 : (d < half ? d : d - half);
    const bool first = interleaved ? (d % 2 == 0) : d < half;
    const i64 row = pos ? pos[b * S + s] : b * S + s;
    const float c = (float)ld(cosc, row * half + f), sn = (float)ld(sinc, row * half + f);
    const float x1 = (float)ld(xr, interleaved ? 2 * f : f), x2 = (float)ld(xr, interleaved ? 2 * f + 1 : f + half);
    st(y, o, first ? c * x1 - sn * x2 : sn * x1 + c * x2);
  }
}

#define ROTARY(name, T)                                                                                             \
  extern "C" __global__ void rotary_##name(const T* x, const T* c, const T* s_, const i64* pos, T* y, i64 B, i64 S, \
                                           i64 H, i64 D, i64 sb, i64 sh, i64 ss, i64 rot, i64 il) {               \
    rotary<T>(x, c, s_, pos, y, B, S, H, D, sb, sh, ss, rot, il);                                                   \
  }
ROTARY(f32, float)
ROTARY(f16, half_t)
ROTARY(bf16, bf16_t)

// ---- SwiGLU: y = (a * sigmoid(alpha a)) * b, each product rounded to T ------------------------------
template <class T, class A>
__device__ void swiglu(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y, i64 n, A alpha) {
  GRID_STRIDE(e, n) {
    const A av = (A)ld(a, e);
    const A sig = round_to<T>((A)1 / ((A)1 + ex(-alpha * av)));
    st(y, e, round_to<T>(av * sig) * (A)ld(b, e));
  }
}
#define SWIGLU(name, T, A) \
  extern "C" __global__ void swiglu_##name(const T* a, const T* b, T* y, i64 n, A alpha) { swiglu<T, A>(a, b, y, n, alpha); }
SWIGLU(f32, float, float)
SWIGLU(f16, half_t, float)
SWIGLU(bf16, bf16_t, float)
SWIGLU(f64, double, double)

// ---- TensorScatter: present (already a copy of past_cache) gets update [P, n, I] written at
// positions idx[b] + s (mod L when circular) of the axis, P = the dims before the axis (batch
// first, `per_batch` of them per batch entry), I the elements after it. Raw element bits; writes
// outside [0, L) in linear mode are dropped. One thread per update element.
template <class E>
__device__ void tensor_scatter(const E* __restrict__ upd, const i64* __restrict__ idx, E* __restrict__ out, i64 P,
                               i64 per_batch, i64 n, i64 I, i64 L, i64 circular) {
  GRID_STRIDE(e, P * n * I) {
    const i64 inner = e % I, s = (e / I) % n, p = e / (I * n);
    i64 dst = (idx ? idx[p / per_batch] : 0) + s;
    if (circular) dst = ((dst % L) + L) % L;
    if (dst < 0 || dst >= L) continue;
    out[(p * L + dst) * I + inner] = upd[e];
  }
}
#define SCATTER(E, w)                                                                                            \
  extern "C" __global__ void tensor_scatter_##w(const E* u, const i64* idx, E* o, i64 P, i64 pb, i64 n, i64 I, \
                                                i64 L, i64 circ) {                                              \
    tensor_scatter<E>(u, idx, o, P, pb, n, I, L, circ);                                                         \
  }
SCATTER(u8, b1)
SCATTER(u16, b2)
SCATTER(u32, b4)
SCATTER(u64, b8)

// ---- CausalConvWithState: input [B, C, L] after past [B, C, k-1] (zeros when null), weight
// [C, 1, k], bias [C] or null; optional SiLU on the rounded conv; present = the last k-1 steps
// of the padded sequence. One thread per output element, then per present element.
template <class T>
__device__ __forceinline__ float padded_at(const T* x, const T* past, i64 bc, i64 L, i64 K, i64 t) {
  if (t < K - 1) return past ? (float)ld(past, bc * (K - 1) + t) : 0.f;
  return (float)ld(x, bc * L + t - (K - 1));
}

template <class T>
__device__ void causal_conv(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                            const T* __restrict__ past, T* __restrict__ y, T* __restrict__ present, i64 BC, i64 C,
                            i64 L, i64 K, i64 silu) {
  GRID_STRIDE(e, BC * (L + K - 1)) {
    if (e < BC * L) {
      const i64 l = e % L, bc = e / L, c = bc % C;
      float acc = 0.f;
      for (i64 j = 0; j < K; ++j) acc += padded_at(x, past, bc, L, K, l + j) * (float)ld(w, c * K + j);
      if (bias) acc += (float)ld(bias, c);
      if (silu) {
        acc = round_to<T>(acc);
        acc = acc / (1.f + expf(-acc));
      }
      st(y, e, acc);
    } else if (present) {
      const i64 r = e - BC * L, s = r % (K - 1), bc = r / (K - 1);
      st(present, r, padded_at(x, past, bc, L, K, L + s));
    }
  }
}
#define CCONV(name, T)                                                                                             \
  extern "C" __global__ void causal_conv_##name(const T* x, const T* w, const T* b, const T* p, T* y, T* pr,      \
                                                i64 BC, i64 C, i64 L, i64 K, i64 silu) {                           \
    causal_conv<T>(x, w, b, p, y, pr, BC, C, L, K, silu);                                                         \
  }
CCONV(f32, float)
CCONV(f16, half_t)
CCONV(bf16, bf16_t)

// ---- LinearAttention: one block per (batch, kv head); thread m owns column m of the float state
// S [dk, dv] (in `state`, workspace or nothing else), so steps need no synchronization. Per step
// t: S *= exp(decay) (gated: per key dim, or one value per head when dg == 1), v = beta * (v -
// S^T k) (delta), S += k v^T, out[hq] = scale * S^T q[hq] for the group's query heads.
template <class T>
__device__ void linear_attention(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                 const T* __restrict__ past, const T* __restrict__ decay, const T* __restrict__ beta,
                                 T* __restrict__ y, T* __restrict__ present, float* __restrict__ state, i64 Tn,
                                 i64 Hkv, i64 group, i64 dk, i64 dv, i64 dg, i64 nb, float scale) {
  const i64 b = blockIdx.x / Hkv, hk = blockIdx.x % Hkv, Hq = Hkv * group;
  float* S = state + blockIdx.x * dk * dv;
  for (i64 m = threadIdx.x; m < dv; m += blockDim.x) {
    for (i64 d = 0; d < dk; ++d) S[d * dv + m] = past ? (float)ld(past, (blockIdx.x * dk + d) * dv + m) : 0.f;
    for (i64 t = 0; t < Tn; ++t) {
      const i64 bt = b * Tn + t;
      const T* kt = k + (bt * Hkv + hk) * dk;
      if (decay)
        for (i64 d = 0; d < dk; ++d) S[d * dv + m] *= expf((float)ld(decay, (bt * Hkv + hk) * dg + (dg == 1 ? 0 : d)));
      float vt = (float)ld(v, (bt * Hkv + hk) * dv + m);
      if (beta) {
        float r = 0.f;
        for (i64 d = 0; d < dk; ++d) r += S[d * dv + m] * (float)ld(kt, d);
        vt = (float)ld(beta, bt * nb + (nb == 1 ? 0 : hk)) * (vt - r);
      }
      for (i64 d = 0; d < dk; ++d) S[d * dv + m] += (float)ld(kt, d) * vt;
      for (i64 g = 0; g < group; ++g) {
        const i64 hq = hk * group + g;
        const T* qt = q + (bt * Hq + hq) * dk;
        float o = 0.f;
        for (i64 d = 0; d < dk; ++d) o += (float)ld(qt, d) * S[d * dv + m];
        st(y, (bt * Hq + hq) * dv + m, scale * o);
      }
    }
    if (present)
      for (i64 d = 0; d < dk; ++d) st(present, (blockIdx.x * dk + d) * dv + m, S[d * dv + m]);
  }
}
#define LINATT(name, T)                                                                                              \
  extern "C" __global__ void linear_attention_##name(const T* q, const T* k, const T* v, const T* past,             \
                                                     const T* decay, const T* beta, T* y, T* present, float* state, \
                                                     i64 Tn, i64 Hkv, i64 group, i64 dk, i64 dv, i64 dg, i64 nb,   \
                                                     float scale) {                                                 \
    linear_attention<T>(q, k, v, past, decay, beta, y, present, state, Tn, Hkv, group, dk, dv, dg, nb, scale);     \
  }
LINATT(f32, float)
LINATT(f16, half_t)
LINATT(bf16, bf16_t)

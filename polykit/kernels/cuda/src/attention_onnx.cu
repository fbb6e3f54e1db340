// ONNX Attention (opset 23-25), every variant: Y = softmax(softcap(Q K^T * scale) + bias) V,
// with the qk_matmul_output of `mode` 0-3 (kernels/reference/attention_onnx.py is the contract).
//
// Layout: Q and Y are read / written through (batch, head, seq) element strides with the head
// dim contiguous (rank 4 [B, H, S, D], or rank 3 [B, S, H*D]: the host passes the strides).
// K and V are the present tensors [B, Hkv, Skv, D] / [B, Hkv, Skv, Dv], contiguous (the host
// has copied past + new into them); query head h reads key/value head h / group.
// The bias combines the mask (bool keep-mask or additive float of type M, broadcast through
// (b, h, q, k) strides, keys j >= mlen masked), the causal rule (j <= i + off), the window
// (off + i - left <= j <= off + i + right for each side >= 0) and nonpad_kv_seqlen (j <
// nonpad[b]); off = nonpad[b] - Sq when nonpad is given without a past, else `past`. A row
// whose bias is -inf for every key gives probabilities 0 (Y = 0).
// Precision: float accumulation (double for float64). For 16-bit T each stage the
// spec computes in T rounds to T (scaled Q and K, scores, softcap, biased scores,
// probabilities, Y); the softmax rounds to half (sm = 1), bfloat16 (sm = 2) or not (sm = 0).
// Sums follow numpy's order for the type: float (rounded once) for half, one rounded addition
// at a time in key order for bfloat16 (thread 0 of the block: O(Skv) serial, bf16 only).
// Geometry: one block per (batch, head, query row), grid-stride, blockDim.x a multiple of 32;
// dynamic shared memory holds the scaled query row (D values) and the row's scores (Skv
// values) in the compute type A. Scores: thread per key (dot over D); output: thread per Dv
// column, serial over keys.
#include "blockreduce.cuh"

__device__ __forceinline__ float r_half(float x) { return h2f(f2h(x)); }
__device__ __forceinline__ float r_bf16(float x) { return b2f(f2b(x)); }
__device__ __forceinline__ float r_sm(float x, i64 sm) { return sm == 1 ? r_half(x) : sm == 2 ? r_bf16(x) : x; }
__device__ __forceinline__ double r_sm(double x, i64) { return x; }

__device__ __forceinline__ float ao_exp(float x) { return expf(x); }
__device__ __forceinline__ double ao_exp(double x) { return exp(x); }
__device__ __forceinline__ float ao_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double ao_tanh(double x) { return tanh(x); }

// a mask element as an additive bias in A
template <class A, class M> __device__ __forceinline__ A mask_bias(const M* m, i64 i) { return (A)ld(m, i); }
template <> __device__ __forceinline__ float mask_bias<float, bool>(const bool* m, i64 i) {
  return m[i] ? 0.f : -__int_as_float(0x7f800000);
}
template <> __device__ __forceinline__ double mask_bias<double, bool>(const bool* m, i64 i) {
  return m[i] ? 0.0 : -(double)__int_as_float(0x7f800000);
}

template <class T, class A> __device__ __forceinline__ A rt(A x) { return round_as<T>(x); }

template <class T, class M, class A>
__device__ void attention_onnx(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                               const M* __restrict__ mask, const i64* __restrict__ nonpad, T* __restrict__ y,
                               T* __restrict__ qk, i64 B, i64 Hq, i64 group, i64 Sq, i64 Skv, i64 D, i64 Dv,
                               i64 qsb, i64 qsh, i64 qss, i64 ysb, i64 ysh, i64 yss, i64 msb, i64 msh, i64 msq,
                               i64 msk, i64 mlen, i64 past, i64 causal, i64 left, i64 right, i64 mode, A root,
                               A softcap, i64 sm) {
  extern __shared__ __align__(8) unsigned char ao_sh[];
  A* qrow = (A*)ao_sh;
  A* score = qrow + D;
  __shared__ A red[32];
  const A ninf = -(A)__int_as_float(0x7f800000);
  const i64 Hkv = Hq / group;
  for (i64 row = blockIdx.x; row < B * Hq * Sq; row += gridDim.x) {
    const i64 i = row % Sq, h = (row / Sq) % Hq, b = row / (Sq * Hq);
    const T* qr = q + b * qsb + h * qsh + i * qss;
    const i64 kvh = b * Hkv + h / group;
    const T* kb = k + kvh * Skv * D;
    const T* vb = v + kvh * Skv * Dv;
    const i64 np = nonpad ? nonpad[b] : Skv;
    const i64 off = (nonpad && past == 0) ? np - Sq : past;
    __syncthreads();
    for (i64 t = threadIdx.x; t < D; t += blockDim.x) qrow[t] = rt<T>((A)ld(qr, t) * root);
    __syncthreads();
    A top = ninf, btop = ninf;
    for (i64 j = threadIdx.x; j < Skv; j += blockDim.x) {
      const T* kr = kb + j * D;
      A acc = 0;
      for (i64 t = 0; t < D; ++t) acc += qrow[t] * rt<T>((A)ld(kr, t) * root);
      A s = rt<T>(acc);
      if (softcap > 0) s = rt<T>(rt<T>(ao_tanh(rt<T>(s / softcap))) * softcap);
      A bias = 0;
      if (mask) bias = j < mlen ? mask_bias<A, M>(mask, b * msb + h * msh + i * msq + j * msk) : ninf;
      const i64 front = i + off;
      if ((causal && j > front) || (left >= 0 && front - j > left) || (right >= 0 && j - front > right) || j >= np)
        bias = ninf;
      const A biased = rt<T>(s + rt<T>(bias));
      if (qk && mode < 3) st(qk, row * Skv + j, mode == 2 ? biased : s);
      score[j] = r_sm(biased, sm);
      top = OpMax()(top, score[j]);
      btop = OpMax()(btop, bias);
    }
    top = block_reduce(top, OpMax(), ninf, red);
    btop = block_reduce(btop, OpMax(), ninf, red);
    const A shift = top == ninf ? (A)0 : top;
    A sum = 0;
    for (i64 j = threadIdx.x; j < Skv; j += blockDim.x) {
      const A e = r_sm(ao_exp(r_sm(score[j] - shift, sm)), sm);
      score[j] = e;
      sum += e;
    }
    // numpy sums the reference's bfloat16 probabilities one rounded addition at a time
    sum = sm == 2 ? serial_sum_as<bf16_t>(score, Skv, red) : r_sm(block_reduce(sum, OpSum(), (A)0, red), sm);
    const A total = sum == (A)0 ? (A)1 : sum;
    const bool hidden = btop == ninf;
    for (i64 j = threadIdx.x; j < Skv; j += blockDim.x) {
      const A p = hidden ? (A)0 : rt<T>(r_sm(score[j] / total, sm));
      score[j] = p;
      if (qk && mode == 3) st(qk, row * Skv + j, p);
    }
    __syncthreads();
    for (i64 c = threadIdx.x; c < Dv; c += blockDim.x) {
      A acc = 0;
      for (i64 j = 0; j < Skv; ++j) acc += score[j] * (A)ld(vb, j * Dv + c);
      st(y, b * ysb + h * ysh + i * yss + c, acc);
    }
  }
}

#define AO_ARGS(T, M, A)                                                                                        \
  const T *q, const T *k, const T *v, const M *mask, const i64 *nonpad, T *y, T *qk, i64 B, i64 Hq, i64 group, \
      i64 Sq, i64 Skv, i64 D, i64 Dv, i64 qsb, i64 qsh, i64 qss, i64 ysb, i64 ysh, i64 yss, i64 msb, i64 msh,  \
      i64 msq, i64 msk, i64 mlen, i64 past, i64 causal, i64 left, i64 right, i64 mode, A root, A softcap, i64 sm
#define AO_PASS \
  q, k, v, mask, nonpad, y, qk, B, Hq, group, Sq, Skv, D, Dv, qsb, qsh, qss, ysb, ysh, yss, msb, msh, msq, msk, mlen, \
      past, causal, left, right, mode, root, softcap, sm
#define AO(name, T, M, A) \
  extern "C" __global__ void attention_onnx_##name(AO_ARGS(T, M, A)) { attention_onnx<T, M, A>(AO_PASS); }
#define AO_ALL_MASKS(tname, T, A) \
  AO(tname##_b8, T, bool, A)      \
  AO(tname##_f16, T, half_t, A)   \
  AO(tname##_bf16, T, bf16_t, A)  \
  AO(tname##_f32, T, float, A)    \
  AO(tname##_f64, T, double, A)

AO_ALL_MASKS(f32, float, float)
AO_ALL_MASKS(f16, half_t, float)
AO_ALL_MASKS(bf16, bf16_t, float)
AO_ALL_MASKS(f64, double, double)

// is_causal without a mask on the fused path: a [Sq, Skv] bool keep-mask (j <= i + past)
extern "C" __global__ void attention_onnx_causal_mask(bool* keep, i64 Sq, i64 Skv, i64 past) {
  for (i64 e = blockIdx.x * (i64)blockDim.x + threadIdx.x; e < Sq * Skv; e += (i64)gridDim.x * blockDim.x)
    keep[e] = e % Skv <= e / Skv + past;
}

// is_causal with a mask on the flash route (attention_onnx_flash.py): the mask, read through element
// strides (mb, mh, mq, mk; 0 on broadcast dims), as a contiguous [nb, nh, Sq, Skv] mask whose elements
// with j > i + past are `fill` (the bits of false / -inf). Elements are moved as raw bits (1, 2 or 4 bytes).
template <class E>
__device__ __forceinline__ void causal_merge(const E* mask, E* out, i64 nb, i64 nh, i64 Sq, i64 Skv, i64 mb, i64 mh,
                                             i64 mq, i64 mk, i64 past, E fill) {
  const i64 n = nb * nh * Sq * Skv;
  for (i64 e = blockIdx.x * (i64)blockDim.x + threadIdx.x; e < n; e += (i64)gridDim.x * blockDim.x) {
    const i64 j = e % Skv, r = e / Skv, i = r % Sq, bh = r / Sq, h = bh % nh, b = bh / nh;
    out[e] = j <= i + past ? mask[b * mb + h * mh + i * mq + j * mk] : fill;
  }
}
extern "C" __global__ void attention_onnx_causal_merge_1(const u8* mask, u8* out, i64 nb, i64 nh, i64 Sq, i64 Skv,
                                                         i64 mb, i64 mh, i64 mq, i64 mk, i64 past, i64 fill) {
  causal_merge<u8>(mask, out, nb, nh, Sq, Skv, mb, mh, mq, mk, past, (u8)fill);
}
extern "C" __global__ void attention_onnx_causal_merge_2(const u16* mask, u16* out, i64 nb, i64 nh, i64 Sq, i64 Skv,
                                                         i64 mb, i64 mh, i64 mq, i64 mk, i64 past, i64 fill) {
  causal_merge<u16>(mask, out, nb, nh, Sq, Skv, mb, mh, mq, mk, past, (u16)fill);
}
extern "C" __global__ void attention_onnx_causal_merge_4(const u32* mask, u32* out, i64 nb, i64 nh, i64 Sq, i64 Skv,
                                                         i64 mb, i64 mh, i64 mq, i64 mk, i64 past, i64 fill) {
  causal_merge<u32>(mask, out, nb, nh, Sq, Skv, mb, mh, mq, mk, past, (u32)fill);
}

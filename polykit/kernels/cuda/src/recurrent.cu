// RNN / GRU / LSTM recurrence, one launch per time step (after gemm.cu's gemm_simt computed the
// input projection XW = X W^T of every step and direction at once).
//
// CELL (define): 0 RNN (gates i), 1 GRU (z, r, h), 2 LSTM (i, o, f, c); float32 storage.
// Buffers (all contiguous float):
//   xw     (D, rows, G*H)  rows = T*N in X's own row order (layout 0: t*N+n, layout 1: n*T+t)
//   R      (D, G*H, H)     bias (D, 2*G*H) or null (Wb then Rb), peep (D, 3*H) or null (i, o, f)
//   lens   (N) int32 or null (every item T steps)
//   h_prev/h_next, c_prev/c_next  (D, N, H) state ping-pong; gate_buf (2, D, N, H): GRU z and r*h
//   Y (layout 0: T, D, N, H; layout 1: N, T, D, H), Yh / Yc (D, N, H or N, D, H); each may be null
// At step s an item with s >= lens[n] keeps its state and gets zeros in Y at time s; else the
// forward direction computes time s, the reverse one time lens[n]-1-s.
// Launch: rnn_init_* grid (ceil(D*N*H/256)), block 256: states from initial_h/c (or 0) and Yh/Yc.
//         rnn_step_*  grid (ceil(H*ceil(N/RNN_NB)/8), D), block 256: one warp per hidden unit j and
//                     RNN_NB batch items; lanes split the H-long dot products of R's rows with the
//                     state (R read once for RNN_NB items) and lane b finishes item n0+b.
//         phase 0: the whole step (RNN, LSTM, GRU with linear_before_reset=1). GRU without
//         linear_before_reset runs each step twice: phase 1 computes z and r*h_prev into
//         gate_buf, phase 2 the candidate from (r*h_prev) R_h^T and the new state.
#include "dtypes.cuh"

#ifndef RNN_NB
#define RNN_NB 4
#endif
#if CELL == 0
#define GATES 1
#elif CELL == 1
#define GATES 3
#else
#define GATES 4
#endif

// activation codes: the order of polykit.compiler.ops.recurrent.ACTIVATIONS
__device__ __forceinline__ float rnn_act(int code, float x, float a, float b) {
  switch (code) {
    case 0: return fmaxf(x, 0.f);                                  // Relu
    case 1: return tanhf(x);                                       // Tanh
    case 2: return 1.f / (1.f + expf(-x));                         // Sigmoid
    case 3: return x / (1.f + fabsf(x));                           // Softsign
    case 4: return x > 20.f ? x : log1pf(expf(x));                 // Softplus
    case 5: return a * x + b;                                      // Affine
    case 6: return x >= 0.f ? x : a * x;                           // LeakyRelu
    case 7: return x > a ? x : 0.f;                                // ThresholdedRelu
    case 8: return a * tanhf(b * x);                               // ScaledTanh
    case 9: return fminf(fmaxf(a * x + b, 0.f), 1.f);              // HardSigmoid
    default: return x >= 0.f ? x : a * (expf(x) - 1.f);            // Elu
  }
}

struct RnnActs {
  int code[3];
  float alpha[3], beta[3];
  __device__ __forceinline__ float f(int k, float x) const { return rnn_act(code[k], x, alpha[k], beta[k]); }
};

#define RNN_PARAMS                                                                                            \
  const float *__restrict__ xw, const float *__restrict__ R, const float *__restrict__ bias,                 \
      const float *__restrict__ peep, const i32 *__restrict__ lens, const float *__restrict__ h_prev,       \
      float *__restrict__ h_next, const float *__restrict__ c_prev, float *__restrict__ c_next,             \
      float *__restrict__ gate_buf, float *__restrict__ Y, float *__restrict__ Yh, float *__restrict__ Yc,  \
      i64 T, i64 N, i64 H, i64 s, i64 layout, i64 reverse_only, i64 phase, i64 input_forget,                \
      float clip, i64 f0, i64 f1, i64 f2, i64 b0, i64 b1, i64 b2, float fa0, float fa1, float fa2,          \
      float ba0, float ba1, float ba2, float fb0, float fb1, float fb2, float bb0, float bb1, float bb2

// acc[b][g] = <src[n0+b, :], R[rows[g]*H + j, :]> summed over the warp (every lane holds all sums)
template <int K>
__device__ __forceinline__ void warp_dots(float (&acc)[RNN_NB][K], const float *Rd, const int (&rows)[K],
                                          const float *src, i64 n0, i64 N, i64 H, i64 j, int lane) {
#pragma unroll
  for (int b = 0; b < RNN_NB; ++b)
#pragma unroll
    for (int g = 0; g < K; ++g) acc[b][g] = 0.f;
  for (i64 k = lane; k < H; k += 32) {
    float r[K];
#pragma unroll
    for (int g = 0; g < K; ++g) r[g] = Rd[(rows[g] * H + j) * H + k];
#pragma unroll
    for (int b = 0; b < RNN_NB; ++b) {
      if (n0 + b < N) {
        const float hv = src[(n0 + b) * H + k];
#pragma unroll
        for (int g = 0; g < K; ++g) acc[b][g] = fmaf(r[g], hv, acc[b][g]);
      }
    }
  }
#pragma unroll
  for (int b = 0; b < RNN_NB; ++b)
#pragma unroll
    for (int g = 0; g < K; ++g)
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) acc[b][g] += __shfl_xor_sync(0xffffffffu, acc[b][g], off);
}

// lane b < RNN_NB takes batch item n0 + b's sums
template <int K>
__device__ __forceinline__ void pick(float (&mine)[K], const float (&acc)[RNN_NB][K], int lane) {
#pragma unroll
  for (int g = 0; g < K; ++g) mine[g] = 0.f;
#pragma unroll
  for (int b = 0; b < RNN_NB; ++b)
    if (lane == b)
#pragma unroll
      for (int g = 0; g < K; ++g) mine[g] = acc[b][g];
}

__device__ __forceinline__ float clipped(float v, float clip) { return clip > 0.f ? fminf(fmaxf(v, -clip), clip) : v; }

extern "C" __global__ void __launch_bounds__(256) RNN_INIT_KERNEL(
    const float *__restrict__ h0, const float *__restrict__ c0, float *__restrict__ h, float *__restrict__ c,
    float *__restrict__ Yh, float *__restrict__ Yc, i64 D, i64 N, i64 H, i64 layout) {
  const i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x;
  if (i >= D * N * H) return;
  const i64 j = i % H, n = (i / H) % N, d = i / (H * N);
  const i64 io = layout ? (n * D + d) * H + j : i;  // index of (d, n, j) in initial_h / Y_h's layout
  const float hv = h0 ? h0[io] : 0.f;
  h[i] = hv;
  if (Yh) Yh[io] = hv;
  if (c) {
    const float cv = c0 ? c0[io] : 0.f;
    c[i] = cv;
    if (Yc) Yc[io] = cv;
  }
}

extern "C" __global__ void __launch_bounds__(256) RNN_STEP_KERNEL(RNN_PARAMS) {
  const int lane = threadIdx.x & 31;
  const i64 warp = (blockIdx.x * (i64)blockDim.x + threadIdx.x) >> 5;
  const i64 chunks = (N + RNN_NB - 1) / RNN_NB;
  if (warp >= H * chunks) return;  // whole warps leave together
  const i64 j = warp % H, n0 = (warp / H) * RNN_NB;
  const i64 d = blockIdx.y, D = gridDim.y, GH = GATES * H;
  const float *Rd = R + d * GH * H;
  const float *hp = h_prev + d * N * H;
  float *zbuf = gate_buf, *rhbuf = gate_buf ? gate_buf + D * N * H : nullptr;
#if CELL == 0
  const int rows[1] = {0};
  float acc[RNN_NB][1], dot[1];
  warp_dots<1>(acc, Rd, rows, hp, n0, N, H, j, lane);
#elif CELL == 2
  const int rows[4] = {0, 1, 2, 3};
  float acc[RNN_NB][4], dot[4];
  warp_dots<4>(acc, Rd, rows, hp, n0, N, H, j, lane);
#else
  float dot[3] = {0.f, 0.f, 0.f};
  if (phase == 2) {  // candidate of GRU without linear_before_reset: (r * h_prev) R_h^T
    const int rows[1] = {2};
    float acc[RNN_NB][1], one[1];
    warp_dots<1>(acc, Rd, rows, rhbuf + d * N * H, n0, N, H, j, lane);
    pick<1>(one, acc, lane);
    dot[2] = one[0];
  } else if (phase == 1) {
    const int rows[2] = {0, 1};
    float acc[RNN_NB][2], two[2];
    warp_dots<2>(acc, Rd, rows, hp, n0, N, H, j, lane);
    pick<2>(two, acc, lane);
    dot[0] = two[0], dot[1] = two[1];
  } else {
    const int rows[3] = {0, 1, 2};
    float acc[RNN_NB][3];
    warp_dots<3>(acc, Rd, rows, hp, n0, N, H, j, lane);
    pick<3>(dot, acc, lane);
  }
#endif
#if CELL != 1
  pick<GATES>(dot, acc, lane);
#endif
  const i64 n = n0 + lane;
  if (lane >= RNN_NB || n >= N) return;
  const i64 len = lens ? (i64)lens[n] : T;
  const bool live = s < len;
  const i64 st = (d * N + n) * H + j;
  const i64 ys = layout ? (n * D + d) * H + j : st;  // Y_h / Y_c index
  if (phase == 1) {  // GRU gates z, r (only for live items; phase 2 holds the others)
    if (!live) return;
    const i64 t = (reverse_only || d == 1) ? len - 1 - s : s;
    const float *x = xw + (d * T * N + (layout ? n * T + t : t * N + n)) * GH;
    const float *wb = bias ? bias + d * 2 * GH : nullptr;
    RnnActs a;
    a.code[0] = (int)(d ? b0 : f0), a.alpha[0] = d ? ba0 : fa0, a.beta[0] = d ? bb0 : fb0;
    float pz = x[j] + dot[0], pr = x[H + j] + dot[1];
    if (wb) pz += wb[j] + wb[GH + j], pr += wb[H + j] + wb[GH + H + j];
    zbuf[st] = a.f(0, clipped(pz, clip));
    rhbuf[st] = a.f(0, clipped(pr, clip)) * hp[n * H + j];
    return;
  }
  const float hold = hp[n * H + j];
  if (!live) {
    h_next[st] = hold;
    if (Yh) Yh[ys] = hold;
#if CELL == 2
    c_next[st] = c_prev[st];
    if (Yc) Yc[ys] = c_prev[st];
#endif
    if (Y) Y[layout ? ((n * T + s) * D + d) * H + j : ((s * D + d) * N + n) * H + j] = 0.f;
    return;
  }
  const i64 t = (reverse_only || d == 1) ? len - 1 - s : s;
  const float *x = xw + (d * T * N + (layout ? n * T + t : t * N + n)) * GH;
  const float *wb = bias ? bias + d * 2 * GH : nullptr;
  const float *rb = wb ? wb + GH : nullptr;
  RnnActs a;
  a.code[0] = (int)(d ? b0 : f0), a.code[1] = (int)(d ? b1 : f1), a.code[2] = (int)(d ? b2 : f2);
  a.alpha[0] = d ? ba0 : fa0, a.alpha[1] = d ? ba1 : fa1, a.alpha[2] = d ? ba2 : fa2;
  a.beta[0] = d ? bb0 : fb0, a.beta[1] = d ? bb1 : fb1, a.beta[2] = d ? bb2 : fb2;
  float pre[GATES];
#pragma unroll
  for (int g = 0; g < GATES; ++g) pre[g] = x[g * H + j] + (wb ? wb[g * H + j] : 0.f);
  float hn;
#if CELL == 0
  hn = a.f(0, clipped(pre[0] + dot[0] + (rb ? rb[j] : 0.f), clip));
#elif CELL == 1
  float z, cand;
  if (phase == 2) {
    z = zbuf[st];
    cand = pre[2] + dot[2] + (rb ? rb[2 * H + j] : 0.f);
  } else {
    z = a.f(0, clipped(pre[0] + dot[0] + (rb ? rb[j] : 0.f), clip));
    const float r = a.f(0, clipped(pre[1] + dot[1] + (rb ? rb[H + j] : 0.f), clip));
    cand = pre[2] + r * (dot[2] + (rb ? rb[2 * H + j] : 0.f));  // linear_before_reset
  }
  hn = (1.f - z) * a.f(1, clipped(cand, clip)) + z * hold;
#else
  const float cp = c_prev[st];
  const float *pd = peep ? peep + d * 3 * H : nullptr;
  const float gi = a.f(0, clipped(pre[0] + dot[0] + (rb ? rb[j] : 0.f) + (pd ? pd[j] * cp : 0.f), clip));
  const float gf = input_forget ? 1.f - gi
                                : a.f(0, clipped(pre[2] + dot[2] + (rb ? rb[2 * H + j] : 0.f) + (pd ? pd[2 * H + j] * cp : 0.f), clip));
  const float cn = gf * cp + gi * a.f(1, clipped(pre[3] + dot[3] + (rb ? rb[3 * H + j] : 0.f), clip));
  const float go = a.f(0, clipped(pre[1] + dot[1] + (rb ? rb[H + j] : 0.f) + (pd ? pd[H + j] * cn : 0.f), clip));
  hn = go * a.f(2, cn);
  c_next[st] = cn;
  if (Yc) Yc[ys] = cn;
#endif
  h_next[st] = hn;
  if (Yh) Yh[ys] = hn;
  if (Y) Y[layout ? ((n * T + t) * D + d) * H + j : ((t * D + d) * N + n) * H + j] = hn;
}

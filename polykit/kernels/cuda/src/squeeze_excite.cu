// ai.polykit SqueezeExcite (polykit.compiler.ops.nn.squeeze_excite): a squeeze-excitation gate,
// s[n, c] = gate(W2 . act(W1 . mean_hw(x[n]) + b1) + b2), in two launches without atomics or a memset,
// tactic cuda.squeeze_excite (polykit.kernels.cuda.reduce.squeeze_excite).
//
// The generated prelude defines ELEM (x's storage type: weights, biases and s have it too) and
//   float se_act(float v, const ELEM* e0, ..., const ELEM* e3)   the act body on the FC1 value
//   float se_gate(float v, const ELEM* e0, ..., const ELEM* e3)  the gate body on the FC2 value
// (e0..e3: the bodies' one-element extra inputs, null when unused).
//
// se_pool_{nhwc,nchw}, grid (P, Q, N), BLOCK threads: block (p, q, n) sums pixels
// [p * chunk, min((p + 1) * chunk, HW)) of sample n over channels [q * cs, min((q + 1) * cs, C)) in fp32
// (NHWC: threads along the channels, 16 bytes a thread where `vec`, TY = BLOCK / tx rows of threads over
// the pixels joined in row order through shared memory; NCHW: a warp a channel, lanes along the pixels,
// a shuffle tree), divides by HW (P == 1: the whole mean, rounded to ELEM as the ReduceMean stored it;
// P > 1: its share of the mean, FC1 being linear) and multiplies its channels' block of W1 (a warp a
// hidden unit, lanes along the channels, a shuffle tree): FC1 partials part[n][p][q][Cr] (fp32, workspace).
// se_fc2, grid (Q2, N): every block sums sample n's P * Q partials in (p, q) order (the same order in
// every block, so every block gets the same bits), adds b1, rounds, applies se_act (hidden, in shared
// memory), then computes output channels [q2 * cs2, ...) of FC2 (a warp a channel) + b2, rounded, se_gate,
// stored to s[n * C + c] ([N, 1, 1, C] and [N, C, 1, 1] are the same bytes). A layer with `scale` (it
// absorbed the Mul y = x * s) runs se_fc2_scale_<layout> instead (below): s never reaches memory.
// Deterministic: the split is shape-only and every sum has a fixed order. The FCs' weights are read once over the grid, spread over
// its blocks, never by one block alone.
//
// Host emulation of the index math: tests/kernels/cuda/test_squeeze_excite.py.

#ifndef SE_BLOCK
#define SE_BLOCK 256
#endif

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}

// row . v over K elements by one warp (lanes strided, a shuffle tree: every lane gets the sum)
__device__ __forceinline__ float warp_dot(const ELEM* __restrict__ row, const float* v, int K, int lane) {
  float acc = 0.f;
  for (int k = lane; k < K; k += 32) acc += (float)ld(row, k) * v[k];
  return warp_sum(acc);
}

// the tail of both pools: the block's channel sums `pooled[0, width)` -> its FC1 partials
__device__ __forceinline__ void se_fc1_part(float* pooled, const ELEM* __restrict__ w1, float* __restrict__ part,
                                            int HW, int C, int Cr, int c0, int width, int P, i64 slot) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int c = threadIdx.x; c < width; c += SE_BLOCK) {
    const float m = pooled[c] / (float)HW;
    pooled[c] = P == 1 ? round_as<ELEM>(m) : m;
  }
  __syncthreads();
  for (int j = warp; j < Cr; j += SE_BLOCK / 32) {
    const float acc = warp_dot(w1 + (i64)j * C + c0, pooled, width, lane);
    if (lane == 0) part[slot * Cr + j] = acc;
  }
}

// both pools' parameters (the host passes the same list: squeeze_excite.launch_plan)
#define SE_POOL_PARAMS                                                                                    \
  const ELEM *__restrict__ x, const ELEM *__restrict__ w1, float *__restrict__ part, int HW, int C,      \
      int Cr, int chunk, int cs, int vec, int tx

extern "C" __global__ void __launch_bounds__(SE_BLOCK) se_pool_nhwc(SE_POOL_PARAMS) {
  extern __shared__ float se_smem[];
  constexpr int V = 16 / sizeof(ELEM);
  const int p = blockIdx.x, q = blockIdx.y, n = blockIdx.z, P = gridDim.x, Q = gridDim.y;
  const int ty = SE_BLOCK / tx, lane = threadIdx.x % tx, row = threadIdx.x / tx;
  const int r0 = p * chunk, r1 = min(HW, r0 + chunk), c0 = q * cs, width = min(cs, C - c0);
  float* pooled = se_smem;   // [cs]
  float* red = pooled + cs;  // [ty][cs]
  const ELEM* xn = x + (i64)n * HW * C + c0;
  if (vec) {
    for (int g = lane; g * V < width; g += tx) {
      float acc[V];
#pragma unroll
      for (int i = 0; i < V; ++i) acc[i] = 0.f;
      for (int r = r0 + row; r < r1; r += ty) {
        __align__(16) ELEM v[V];
        *reinterpret_cast<uint4*>(v) = __ldg(reinterpret_cast<const uint4*>(xn + (i64)r * C + g * V));
#pragma unroll
        for (int i = 0; i < V; ++i) acc[i] += (float)ld(v, i);
      }
#pragma unroll
      for (int i = 0; i < V; ++i) red[row * cs + g * V + i] = acc[i];
    }
  } else {
    for (int c = lane; c < width; c += tx) {
      float acc = 0.f;
      for (int r = r0 + row; r < r1; r += ty) acc += (float)ld(xn, (i64)r * C + c);
      red[row * cs + c] = acc;
    }
  }
  __syncthreads();
  for (int c = threadIdx.x; c < width; c += SE_BLOCK) {
    float acc = 0.f;
    for (int k = 0; k < ty; ++k) acc += red[k * cs + c];
    pooled[c] = acc;
  }
  __syncthreads();
  se_fc1_part(pooled, w1, part, HW, C, Cr, c0, width, P, ((i64)n * P + p) * Q + q);
}

extern "C" __global__ void __launch_bounds__(SE_BLOCK) se_pool_nchw(SE_POOL_PARAMS) {
  extern __shared__ float se_smem[];
  const int p = blockIdx.x, q = blockIdx.y, n = blockIdx.z, P = gridDim.x, Q = gridDim.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int r0 = p * chunk, r1 = min(HW, r0 + chunk), c0 = q * cs, width = min(cs, C - c0);
  float* pooled = se_smem;  // [cs]
  for (int c = warp; c < width; c += SE_BLOCK / 32) {
    const ELEM* plane = x + ((i64)n * C + c0 + c) * HW;
    float acc = 0.f;
    for (int r = r0 + lane; r < r1; r += 32) acc += (float)ld(plane, r);
    acc = warp_sum(acc);
    if (lane == 0) pooled[c] = acc;
  }
  __syncthreads();
  se_fc1_part(pooled, w1, part, HW, C, Cr, c0, width, P, ((i64)n * P + p) * Q + q);
}

// sample n's hidden units into shared memory `hidden` [Cr]: its `parts` FC1 partials summed in (p, q)
// order (the same order in every block, so every block gets the same bits), + b1, rounded, se_act, rounded
__device__ __forceinline__ void se_hidden(const float* __restrict__ part, const ELEM* __restrict__ b1, float* hidden,
                                          int Cr, int parts, int n, const ELEM* e0, const ELEM* e1, const ELEM* e2,
                                          const ELEM* e3) {
  const float* mine = part + (i64)n * parts * Cr;
  for (int j = threadIdx.x; j < Cr; j += SE_BLOCK) {
    float acc = 0.f;
    for (int k = 0; k < parts; ++k) acc += mine[(i64)k * Cr + j];
    hidden[j] = round_as<ELEM>(se_act(round_as<ELEM>(acc + (float)ld(b1, j)), e0, e1, e2, e3));
  }
}

// the gate of channel c by one warp (every lane gets it): FC2 row c . hidden + b2, rounded, se_gate, rounded
__device__ __forceinline__ float se_gate_of(const ELEM* __restrict__ w2, const ELEM* __restrict__ b2,
                                            const float* hidden, int c, int Cr, int lane, const ELEM* e0,
                                            const ELEM* e1, const ELEM* e2, const ELEM* e3) {
  const float acc = warp_dot(w2 + (i64)c * Cr, hidden, Cr, lane);
  return round_as<ELEM>(se_gate(round_as<ELEM>(acc + (float)ld(b2, c)), e0, e1, e2, e3));
}

#define SE_EXTRAS const ELEM *e0, const ELEM *e1, const ELEM *e2, const ELEM *e3

extern "C" __global__ void __launch_bounds__(SE_BLOCK)
se_fc2(const float* __restrict__ part, const ELEM* __restrict__ b1, const ELEM* __restrict__ w2,
       const ELEM* __restrict__ b2, ELEM* __restrict__ s, int C, int Cr, int parts, int cs2, SE_EXTRAS) {
  extern __shared__ float se_smem[];
  const int q2 = blockIdx.x, n = blockIdx.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float* hidden = se_smem;  // [Cr]
  se_hidden(part, b1, hidden, Cr, parts, n, e0, e1, e2, e3);
  __syncthreads();
  const int c1 = min(C, (q2 + 1) * cs2);
  for (int c = q2 * cs2 + warp; c < c1; c += SE_BLOCK / 32) {
    const float g = se_gate_of(w2, b2, hidden, c, Cr, lane, e0, e1, e2, e3);
    if (lane == 0) st(s, (i64)n * C + c, g);
  }
}

// se_fc2_scale_{nhwc,nchw}, grid (Q2, P3, N): y = x * s without storing s. Block (q2, p3, n) computes
// the gates of channels [c0, c0 + width), c0 = q2 * cs2, into shared memory as se_fc2 does (every
// block of a (q2, n) the same bits), then scales pixels [p3 * chunk, min((p3 + 1) * chunk, HW)) of
// those channels: y = x * gate, rounded to ELEM. NHWC: a pixel's channel slice is contiguous (16 bytes
// a thread where `vec`: C * sizeof(ELEM) % 16 == 0 and x, y 16-byte aligned); NCHW: a channel's pixel
// chunk is (`vec`: HW and chunk multiples of 16 / sizeof(ELEM), x, y aligned). Each element of y is
// read from x and written by the same thread, so y may even alias x.
#define SE_SCALE_PARAMS                                                                                     \
  const float *__restrict__ part, const ELEM *__restrict__ b1, const ELEM *__restrict__ w2,                \
      const ELEM *__restrict__ b2, const ELEM *x, ELEM *y, int C, int Cr, int parts, int cs2, int HW,       \
      int chunk, int vec, SE_EXTRAS

// the shared head of both scale kernels: the block's gates -> gate[0, width)
__device__ __forceinline__ void se_slice_gates(SE_SCALE_PARAMS, float* hidden, float* gate, int c0, int width,
                                               int n) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  se_hidden(part, b1, hidden, Cr, parts, n, e0, e1, e2, e3);
  __syncthreads();
  for (int c = warp; c < width; c += SE_BLOCK / 32) {
    const float g = se_gate_of(w2, b2, hidden, c0 + c, Cr, lane, e0, e1, e2, e3);
    if (lane == 0) gate[c] = g;
  }
  __syncthreads();
}

#define SE_SCALE_ARGS part, b1, w2, b2, x, y, C, Cr, parts, cs2, HW, chunk, vec, e0, e1, e2, e3

// both layouts' scaling: element e of the block is e / inner along the outer axis (a pixel in NHWC, a
// channel in NCHW; `stride` elements apart) and e % inner along the contiguous one (a channel of the
// slice, a pixel of the chunk); runs of V = 16 / sizeof(ELEM) elements where vec (inner % V == 0)
template <bool NHWC>
__device__ __forceinline__ void se_fc2_scale(SE_SCALE_PARAMS) {
  extern __shared__ float se_smem[];
  const int q2 = blockIdx.x, p3 = blockIdx.y, n = blockIdx.z;
  const int c0 = q2 * cs2, width = min(cs2, C - c0), r0 = p3 * chunk, r1 = min(HW, r0 + chunk);
  float* hidden = se_smem;     // [Cr]
  float* gate = se_smem + Cr;  // [cs2]
  se_slice_gates(SE_SCALE_ARGS, hidden, gate, c0, width, n);
  const int inner = NHWC ? width : r1 - r0, items = (r1 - r0) * width;
  const i64 stride = NHWC ? C : HW;
  const i64 base = NHWC ? ((i64)n * HW + r0) * C + c0 : ((i64)n * C + c0) * HW + r0;
  if (vec) {
    constexpr int V = 16 / sizeof(ELEM);
    for (int i = threadIdx.x; i < items / V; i += SE_BLOCK) {
      const int e = i * V, outer = e / inner, in = e % inner;
      const i64 o = base + (i64)outer * stride + in;
      __align__(16) ELEM v[V];
      *reinterpret_cast<uint4*>(v) = *reinterpret_cast<const uint4*>(x + o);
#pragma unroll
      for (int k = 0; k < V; ++k) st(v, k, (float)ld(v, k) * gate[NHWC ? in + k : outer]);
      *reinterpret_cast<uint4*>(y + o) = *reinterpret_cast<const uint4*>(v);
    }
  } else {
    for (int e = threadIdx.x; e < items; e += SE_BLOCK) {
      const int outer = e / inner, in = e % inner;
      const i64 o = base + (i64)outer * stride + in;
      st(y, o, (float)ld(x, o) * gate[NHWC ? in : outer]);
    }
  }
}

extern "C" __global__ void __launch_bounds__(SE_BLOCK) se_fc2_scale_nhwc(SE_SCALE_PARAMS) {
  se_fc2_scale<true>(SE_SCALE_ARGS);
}

extern "C" __global__ void __launch_bounds__(SE_BLOCK) se_fc2_scale_nchw(SE_SCALE_PARAMS) {
  se_fc2_scale<false>(SE_SCALE_ARGS);
}

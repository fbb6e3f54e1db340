// ai.polykit SqueezeExcite (polykit.compiler.ops.nn.squeeze_excite): a squeeze-excitation gate in one
// launch, s[n, c] = gate(W2 . act(W1 . mean_hw(x[n]) + b1) + b2), tactic cuda.squeeze_excite
// (polykit.kernels.cuda.conv.squeeze_excite).
//
// The generated prelude defines ELEM (x's storage type: weights, biases and s have it too) and
//   float se_act(float v, const ELEM* e0, ..., const ELEM* e3)   the act body on the FC1 value
//   float se_gate(float v, const ELEM* e0, ..., const ELEM* e3)  the gate body on the FC2 value
// (e0..e3: the bodies' one-element extra inputs, null when unused).
//
// Grid (splits, N), BLOCK threads. Block (k, n) sums the pixels [k * chunk, min((k + 1) * chunk, HW))
// of sample n per channel in fp32:
//   se_nhwc  threads along C (`vec`: 16 bytes of channels a thread, C * sizeof(ELEM) % 16 == 0 and
//            x 16-byte aligned), TY rows of threads over the pixels, the TY sums joined in row order
//            through shared memory;
//   se_nchw  a warp a channel, lanes along the pixels, a shuffle tree.
// With splits == 1 the block goes on. Otherwise it stores its C sums to part[n][k][:], fences, and
// counts itself in counters[n] (zeroed by a memset before the launch); the block that counts last
// sums the splits' partials IN SPLIT ORDER (the result does not depend on which block finishes),
// resets its counter to 0 and goes on: mean (rounded to ELEM as the ReduceMean stored it), FC1
// (a warp a hidden unit, lanes along C, a shuffle tree) + b1, rounded, se_act -> shared; FC2 (a warp
// an output channel) + b2, rounded, se_gate, stored to s[n * C + c] ([N, 1, 1, C] and [N, C, 1, 1]
// are the same bytes). Dynamic shared memory: (C + Cr + red) floats, red = TY * C for se_nhwc.
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

// the tail every block that holds sample n's channel sums in `pooled` runs (sums -> s[n, :])
__device__ __forceinline__ void se_finish(float* pooled, float* hidden, const ELEM* __restrict__ w1,
                                          const ELEM* __restrict__ b1, const ELEM* __restrict__ w2,
                                          const ELEM* __restrict__ b2, ELEM* __restrict__ s, int n, int HW, int C,
                                          int Cr, const ELEM* e0, const ELEM* e1, const ELEM* e2, const ELEM* e3) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = SE_BLOCK / 32;
  for (int c = threadIdx.x; c < C; c += SE_BLOCK) pooled[c] = round_as<ELEM>(pooled[c] / (float)HW);
  __syncthreads();
  for (int j = warp; j < Cr; j += warps) {
    const float acc = warp_dot(w1 + (i64)j * C, pooled, C, lane);
    if (lane == 0) hidden[j] = round_as<ELEM>(se_act(round_as<ELEM>(acc + (float)ld(b1, j)), e0, e1, e2, e3));
  }
  __syncthreads();
  for (int c = warp; c < C; c += warps) {
    const float acc = warp_dot(w2 + (i64)c * Cr, hidden, Cr, lane);
    if (lane == 0) st(s, (i64)n * C + c, se_gate(round_as<ELEM>(acc + (float)ld(b2, c)), e0, e1, e2, e3));
  }
}

// split: store this block's sums, count it; true in the block that counted last, which then holds the
// splits' sums (in split order) in `pooled`
__device__ __forceinline__ bool se_join(float* pooled, float* __restrict__ part, unsigned* __restrict__ counters,
                                        int n, int k, int splits, int C) {
  __shared__ unsigned last;
  float* mine = part + ((i64)n * splits + k) * C;
  for (int c = threadIdx.x; c < C; c += SE_BLOCK) mine[c] = pooled[c];
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(counters + n, 1u) == (unsigned)(splits - 1);
  __syncthreads();
  if (!last) return false;
  __threadfence();
  const float* base = part + (i64)n * splits * C;
  for (int c = threadIdx.x; c < C; c += SE_BLOCK) {
    float acc = 0.f;
    for (int q = 0; q < splits; ++q) acc += __ldcg(base + (i64)q * C + c);
    pooled[c] = acc;
  }
  if (threadIdx.x == 0) counters[n] = 0u;  // the next run finds it zero even without the memset
  __syncthreads();
  return true;
}

// both kernels' parameters (the host passes the same list: squeeze_excite.launch_plan)
#define SE_PARAMS                                                                                         \
  const ELEM *__restrict__ x, const ELEM *__restrict__ w1, const ELEM *__restrict__ b1,                  \
      const ELEM *__restrict__ w2, const ELEM *__restrict__ b2, ELEM *__restrict__ s,                    \
      float *__restrict__ part, unsigned *__restrict__ counters, int HW, int C, int Cr, int chunk,       \
      int splits, int vec, int tx, const ELEM *e0, const ELEM *e1, const ELEM *e2, const ELEM *e3

extern "C" __global__ void __launch_bounds__(SE_BLOCK)
se_nhwc(SE_PARAMS) {
  extern __shared__ float se_smem[];
  constexpr int V = 16 / sizeof(ELEM);
  const int k = blockIdx.x, n = blockIdx.y;
  const int ty = SE_BLOCK / tx, lane = threadIdx.x % tx, row = threadIdx.x / tx;
  const int r0 = k * chunk, r1 = min(HW, r0 + chunk);
  float* pooled = se_smem;
  float* hidden = pooled + C;
  float* red = hidden + Cr;  // [ty][C]
  const ELEM* xn = x + (i64)n * HW * C;
  if (row < ty) {
    if (vec) {
      for (int g = lane; g * V < C; g += tx) {
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
        for (int i = 0; i < V; ++i) red[row * C + g * V + i] = acc[i];
      }
    } else {
      for (int c = lane; c < C; c += tx) {
        float acc = 0.f;
        for (int r = r0 + row; r < r1; r += ty) acc += (float)ld(xn, (i64)r * C + c);
        red[row * C + c] = acc;
      }
    }
  }
  __syncthreads();
  for (int c = threadIdx.x; c < C; c += SE_BLOCK) {
    float acc = 0.f;
    for (int q = 0; q < ty; ++q) acc += red[q * C + c];
    pooled[c] = acc;
  }
  __syncthreads();
  if (splits > 1 && !se_join(pooled, part, counters, n, k, splits, C)) return;
  se_finish(pooled, hidden, w1, b1, w2, b2, s, n, HW, C, Cr, e0, e1, e2, e3);
}

extern "C" __global__ void __launch_bounds__(SE_BLOCK)
se_nchw(SE_PARAMS) {
  extern __shared__ float se_smem[];
  const int k = blockIdx.x, n = blockIdx.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int r0 = k * chunk, r1 = min(HW, r0 + chunk);
  float* pooled = se_smem;
  float* hidden = pooled + C;
  const ELEM* xn = x + (i64)n * C * HW;
  for (int c = warp; c < C; c += SE_BLOCK / 32) {
    const ELEM* plane = xn + (i64)c * HW;
    float acc = 0.f;
    for (int r = r0 + lane; r < r1; r += 32) acc += (float)ld(plane, r);
    acc = warp_sum(acc);
    if (lane == 0) pooled[c] = acc;
  }
  __syncthreads();
  if (splits > 1 && !se_join(pooled, part, counters, n, k, splits, C)) return;
  se_finish(pooled, hidden, w1, b1, w2, b2, s, n, HW, C, Cr, e0, e1, e2, e3);
}

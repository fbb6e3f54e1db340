// NegativeLogLikelihoodLoss (SoftmaxCrossEntropyLoss runs softmax.cu's LogSoftmax first and
// then these kernels on its log-probabilities).
//
// Layouts (contiguous): log-probabilities lp viewed as [N, C, D] (D = product of the dims after
// the class dim), target as [N, D] (int32, or int64 when t64), weight as [C] (null: all 1).
// Element i = n * D + d has target t; its loss is -weight[t] * lp[n, t, d] and its weight
// weight[t]; both are 0 where t == ignore_index (has_ignore), and NaN where t is outside [0, C)
// and not ignored (the reference rejects such input; the device cannot raise).
//   nll_none_<T>(lp, target, t64, weight, out, total, C, D, ignore, has_ignore)
//     1-D grid-stride loop, one thread per element, block 256: out[i] = loss_i.
//   nll_reduce_<T>(..., out, total, C, D, ignore, has_ignore, mean)
//     ONE block of 256 threads: each thread sums the losses and weights of elements
//     threadIdx.x, +256, ... in double, then a deterministic block reduction; thread 0 writes
//     the sum of losses, or (mean) that sum divided by the sum of weights.
#include "blockreduce.cuh"

#define LOSS_BLOCK 256

template <class T>
__device__ __forceinline__ void nll_term(const T* lp, const void* target, int t64, const T* weight, i64 i, i64 C,
                                         i64 D, i64 ignore, int has_ignore, double& loss, double& w) {
  const i64 n = i / D, d = i - n * D;
  const i64 t = t64 ? ((const i64*)target)[i] : (i64)((const i32*)target)[i];
  if (has_ignore && t == ignore) {
    loss = 0.0;
    w = 0.0;
  } else if (t < 0 || t >= C) {
    loss = __longlong_as_double(0x7ff8000000000000LL);
    w = loss;
  } else {
    w = weight ? (double)ld(weight, t) : 1.0;
    loss = -w * (double)ld(lp, (n * C + t) * D + d);
  }
}

template <class T>
__device__ void nll_none(const T* lp, const void* target, int t64, const T* weight, T* out, i64 total, i64 C, i64 D,
                         i64 ignore, int has_ignore) {
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
    double loss, w;
    nll_term(lp, target, t64, weight, i, C, D, ignore, has_ignore, loss, w);
    st(out, i, loss);
  }
}

template <class T>
__device__ void nll_reduce(const T* lp, const void* target, int t64, const T* weight, T* out, i64 total, i64 C,
                           i64 D, i64 ignore, int has_ignore, int mean) {
  __shared__ double smem[32];
  double loss_sum = 0.0, w_sum = 0.0;
  for (i64 i = threadIdx.x; i < total; i += blockDim.x) {
    double loss, w;
    nll_term(lp, target, t64, weight, i, C, D, ignore, has_ignore, loss, w);
    loss_sum += loss;
    w_sum += w;
  }
  loss_sum = block_reduce(loss_sum, OpSum(), 0.0, smem);
  w_sum = block_reduce(w_sum, OpSum(), 0.0, smem);
  if (threadIdx.x == 0) st(out, 0, mean ? loss_sum / w_sum : loss_sum);
}

#define NLL(T, code)                                                                                         \
  extern "C" __global__ void __launch_bounds__(LOSS_BLOCK) nll_none_##code(                                 \
      const T* lp, const void* target, int t64, const T* weight, T* out, i64 total, i64 C, i64 D, i64 ignore, \
      int has_ignore) {                                                                                      \
    nll_none<T>(lp, target, t64, weight, out, total, C, D, ignore, has_ignore);                              \
  }                                                                                                          \
  extern "C" __global__ void __launch_bounds__(LOSS_BLOCK) nll_reduce_##code(                               \
      const T* lp, const void* target, int t64, const T* weight, T* out, i64 total, i64 C, i64 D, i64 ignore, \
      int has_ignore, int mean) {                                                                            \
    nll_reduce<T>(lp, target, t64, weight, out, total, C, D, ignore, has_ignore, mean);                      \
  }

NLL(float, f32)
NLL(half_t, f16)
NLL(double, f64)

// Training-mode ops: Dropout with numpy's mask bit for bit, BatchNormalization with batch
// statistics. Scalars that are runtime inputs (ratio, training_mode) are read on the device.
//
// Real-valued tensors whose dtype is only known at run time are read and written through a
// dtype code (REAL_*), as double.
#include "blockreduce.cuh"

#define REAL_NONE 0
#define REAL_F32 1
#define REAL_F16 2
#define REAL_F64 3
#define REAL_BF16 4

__device__ __forceinline__ double ld_real(const void* p, int code, i64 i) {
  switch (code) {
    case REAL_F32: return (double)((const float*)p)[i];
    case REAL_F16: return (double)h2f(((const half_t*)p)[i]);
    case REAL_F64: return ((const double*)p)[i];
    case REAL_BF16: return (double)b2f(((const bf16_t*)p)[i]);
    default: return 0.0;
  }
}

__device__ __forceinline__ void st_real(void* p, int code, i64 i, double v) {
  switch (code) {
    case REAL_F32: ((float*)p)[i] = (float)v; break;
    case REAL_F16: ((half_t*)p)[i] = d2h(v); break;
    case REAL_F64: ((double*)p)[i] = v; break;
    case REAL_BF16: ((bf16_t*)p)[i] = f2b((float)v); break;
    default: break;
  }
}

// ---- Dropout --------------------------------------------------------------------------------
// The reference draws mask = RandomState(seed).uniform(0, 1, x.shape) >= ratio with numpy's
// legacy MT19937: init_genrand(seed), 624-word twists, tempering, and one double per two
// 32-bit outputs a, b: ((a >> 5) * 2^26 + (b >> 6)) / 2^53. ratio 0 or training false: the
// identity and an all-true mask.

#define MT_N 624
#define MT_M 397
#define MT_THREADS 640  // 20 warps; threads >= 624 only join the barriers

// ratio (absent: 0.5) and whether the op is the identity, read from device memory
__device__ __forceinline__ double dropout_ratio(const void* ratio, int ratio_code) {
  return ratio_code == REAL_NONE ? 0.5 : ld_real(ratio, ratio_code, 0);
}
__device__ __forceinline__ bool dropout_identity(const void* ratio, int ratio_code, const bool* training) {
  return training == 0 || !training[0] || dropout_ratio(ratio, ratio_code) == 0.0;
}

__device__ __forceinline__ u32 mt_next(const u32* mt, int i) {
  const u32 y = (mt[i] & 0x80000000u) | (mt[(i + 1) % MT_N] & 0x7fffffffu);
  return mt[(i + MT_M) % MT_N] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
}

__device__ __forceinline__ u32 mt_temper(u32 y) {
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= y >> 18;
  return y;
}

// dropout_mask: mask[i] = (i-th uniform of RandomState(seed)) >= ratio, i < n; nothing when
// the op is the identity (dropout_apply writes the all-true mask then).
// Geometry: ONE block of MT_THREADS threads. The state lives in shared memory; each twist
// runs in three dependency stages ([0,227) reads only old words, [227,454) reads words the
// first stage wrote, [454,624) the second's), every stage reading into registers before a
// barrier and writing after it. A twist yields 312 uniforms: thread t < 312 tempers words 2t
// and 2t+1 and writes mask element base + t. Sequential over ceil(n / 312) twists.
extern "C" __global__ void __launch_bounds__(MT_THREADS)
dropout_mask(const void* ratio, int ratio_code, const bool* training, u32 seed, bool* mask, i64 n) {
  __shared__ u32 mt[MT_N];
  if (dropout_identity(ratio, ratio_code, training)) return;
  const double r = dropout_ratio(ratio, ratio_code);
  const int t = threadIdx.x;
  if (t == 0) {  // init_genrand: a serial recurrence of 624 steps
    u32 s = seed;
    for (int i = 0; i < MT_N; ++i) {
      mt[i] = s;
      s = 1812433253u * (s ^ (s >> 30)) + (u32)(i + 1);
    }
  }
  __syncthreads();
  for (i64 base = 0; base < n; base += MT_N / 2) {
    const int lo[3] = {0, MT_N - MT_M, 2 * (MT_N - MT_M)}, hi[3] = {MT_N - MT_M, 2 * (MT_N - MT_M), MT_N};
#pragma unroll
    for (int s = 0; s < 3; ++s) {
      const bool mine = t >= lo[s] && t < hi[s];
      const u32 v = mine ? mt_next(mt, t) : 0u;
      __syncthreads();
      if (mine) mt[t] = v;
      __syncthreads();
    }
    if (t < MT_N / 2 && base + t < n) {
      const u32 a = mt_temper(mt[2 * t]) >> 5, b = mt_temper(mt[2 * t + 1]) >> 6;
      const double u = ((double)a * 67108864.0 + (double)b) / 9007199254740992.0;
      mask[base + t] = u >= r;
    }
    __syncthreads();  // the next twist overwrites the words just read
  }
}

// dropout_apply: y = mask * x * (1 / (1 - ratio)) like numpy (the factor rounded to T first,
// products in T's compute type, left to right); the identity (y = x, mask = true) when
// training is false or ratio is 0. Elementwise, grid-stride; y may alias x.
template <class T>
__device__ void dropout_apply(const T* x, T* y, bool* mask, const void* ratio, int ratio_code, const bool* training,
                              i64 n) {
  typedef typename Compute<T>::type C;
  const bool identity = dropout_identity(ratio, ratio_code, training);
  T factor[1];
  st(factor, 0, identity ? 1.0 : 1.0 / (1.0 - dropout_ratio(ratio, ratio_code)));
  const C f = ld(factor, 0);
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
    if (identity) {
      y[i] = x[i];
      mask[i] = true;
    } else {
      const C kept = (mask[i] ? (C)1 : (C)0) * ld(x, i);
      st(y, i, kept * f);
    }
  }
}

#define DROPOUT_APPLY(T, code)                                                                                   \
  extern "C" __global__ void dropout_apply_##code(const T* x, T* y, bool* mask, const void* ratio, int ratio_code, \
                                                  const bool* training, i64 n) {                                 \
    dropout_apply<T>(x, y, mask, ratio, ratio_code, training, n);                                                \
  }
DROPOUT_APPLY(float, f32)
DROPOUT_APPLY(half_t, f16)
DROPOUT_APPLY(bf16_t, bf16)
DROPOUT_APPLY(double, f64)

// ---- BatchNormalization, training_mode=1 -----------------------------------------------------
// X [N, C, inner..] contiguous. Per channel c, over the N * inner elements: mean, then the
// population variance as the mean of (x - mean)^2 (two passes, like numpy), in double with
// deterministic block reductions; y = (x - mean) / sqrt(var + eps) * scale + bias in double
// (no fused multiply-adds, as numpy rounds each step), stored in T; running statistics
// mean_in * momentum + batch * (1 - momentum) stored in their own dtypes (codes).
// Geometry: one block (blockDim a multiple of 32) per channel, grid-stride over channels.
template <class T>
__device__ void batchnorm_train(const T* __restrict__ x, const void* scale, int scale_code, const void* bias,
                                int bias_code, const void* mean, int mean_code, const void* var, int var_code,
                                T* __restrict__ y, void* run_mean, int run_mean_code, void* run_var, int run_var_code,
                                i64 N, i64 C, i64 inner, double eps, double momentum) {
  __shared__ double red[32];
  const i64 count = N * inner;
  for (i64 c = blockIdx.x; c < C; c += gridDim.x) {
    double sum = 0.0;
    for (i64 j = threadIdx.x; j < count; j += blockDim.x) {
      const i64 n = j / inner;
      sum += (double)ld(x, (n * C + c) * inner + (j - n * inner));
    }
    const double mu = block_reduce(sum, OpSum(), 0.0, red) / (double)count;
    double sq = 0.0;
    for (i64 j = threadIdx.x; j < count; j += blockDim.x) {
      const i64 n = j / inner;
      const double d = (double)ld(x, (n * C + c) * inner + (j - n * inner)) - mu;
      sq = __dadd_rn(sq, __dmul_rn(d, d));
    }
    const double v = block_reduce(sq, OpSum(), 0.0, red) / (double)count;
    const double den = sqrt(v + eps), g = ld_real(scale, scale_code, c), b = ld_real(bias, bias_code, c);
    for (i64 j = threadIdx.x; j < count; j += blockDim.x) {
      const i64 n = j / inner, at = (n * C + c) * inner + (j - n * inner);
      const double z = ((double)ld(x, at) - mu) / den;
      st(y, at, __dadd_rn(__dmul_rn(z, g), b));
    }
    if (threadIdx.x == 0) {
      const double keep = 1.0 - momentum;
      if (run_mean) st_real(run_mean, run_mean_code, c,
                            __dadd_rn(__dmul_rn(ld_real(mean, mean_code, c), momentum), __dmul_rn(mu, keep)));
      if (run_var) st_real(run_var, run_var_code, c,
                           __dadd_rn(__dmul_rn(ld_real(var, var_code, c), momentum), __dmul_rn(v, keep)));
    }
  }
}

#define BATCHNORM_TRAIN(T, code)                                                                                \
  extern "C" __global__ void batchnorm_train_##code(                                                            \
      const T* x, const void* scale, int scale_code, const void* bias, int bias_code, const void* mean,         \
      int mean_code, const void* var, int var_code, T* y, void* run_mean, int run_mean_code, void* run_var,     \
      int run_var_code, i64 N, i64 C, i64 inner, double eps, double momentum) {                                 \
    batchnorm_train<T>(x, scale, scale_code, bias, bias_code, mean, mean_code, var, var_code, y, run_mean,      \
                       run_mean_code, run_var, run_var_code, N, C, inner, eps, momentum);                       \
  }
BATCHNORM_TRAIN(float, f32)
BATCHNORM_TRAIN(half_t, f16)
BATCHNORM_TRAIN(bf16_t, bf16)
BATCHNORM_TRAIN(double, f64)

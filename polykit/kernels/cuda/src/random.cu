// Random ops on polykit's counter-based generator (polykit/compiler/ops/random.py): element i's
// k-th uniform is splitmix64(key + (2 i + k + 1) * golden) >> 11, times 2^-53 -- the bits the
// numpy reference computes, so both targets agree. No state: every element is independent.
//
// random_<T>(y, n, key, normal, a, b)
//   uniform (normal = 0): y[i] = a + (b - a) * u0(i)            (a = low, b = high)
//   normal  (normal = 1): y[i] = a + b * sqrt(-2 log(1 - u0)) cos(2 pi u1)   (a = mean, b = scale)
// bernoulli_<T>(p, y, y_code, n, key): y[i] = u0(i) < p[i] ? 1 : 0, stored as y_code's type
//   (0 f32, 1 f16, 2 f64, 3 bf16, 4 i8, 5 u8, 6 i16, 7 i32, 8 i64, 9 bool; see random.py).
// Values are formed in double and rounded once to the output type: uniforms and Bernoulli are
// bit-identical to the reference; normals use the device's log1p / cos, within an ulp or two of
// numpy's in double (float32 outputs almost always identical). 1-D grid-stride, block 256.
#include "dtypes.cuh"

#define GRID_LOOP(i, n) for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

__device__ __forceinline__ double uniform(u64 key, i64 i, int k) {
  u64 z = key + ((u64)i * 2ull + (u64)(k + 1)) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z = z ^ (z >> 31);
  return (double)(z >> 11) * 1.1102230246251565404e-16;  // 2^-53
}

template <class T>
__device__ void random_fill(T* y, i64 n, u64 key, int normal, double a, double b) {
  GRID_LOOP(i, n) {
    double v;
    if (normal) {
      const double r = sqrt(-2.0 * log1p(-uniform(key, i, 0)));
      v = a + b * (r * cos(2.0 * 3.14159265358979323846 * uniform(key, i, 1)));
    } else {
      v = __dadd_rn(a, __dmul_rn(b - a, uniform(key, i, 0)));  // no FMA: numpy's roundings
    }
    st(y, i, v);
  }
}

__device__ __forceinline__ void st_code(void* y, int code, i64 i, double v) {
  switch (code) {
    case 0: ((float*)y)[i] = (float)v; break;
    case 1: ((half_t*)y)[i] = d2h(v); break;
    case 2: ((double*)y)[i] = v; break;
    case 3: ((bf16_t*)y)[i] = f2b((float)v); break;
    case 4: ((i8*)y)[i] = (i8)v; break;
    case 5: ((u8*)y)[i] = (u8)v; break;
    case 6: ((i16*)y)[i] = (i16)v; break;
    case 7: ((i32*)y)[i] = (i32)v; break;
    case 8: ((i64*)y)[i] = (i64)v; break;
    default: ((bool*)y)[i] = v != 0.0; break;
  }
}

template <class T>
__device__ void bernoulli(const T* p, void* y, int y_code, i64 n, u64 key) {
  GRID_LOOP(i, n) st_code(y, y_code, i, uniform(key, i, 0) < (double)ld(p, i) ? 1.0 : 0.0);
}

#define RANDOM(T, code)                                                                                        \
  extern "C" __global__ void random_##code(T* y, i64 n, u64 key, int normal, double a, double b) {            \
    random_fill<T>(y, n, key, normal, a, b);                                                                   \
  }                                                                                                            \
  extern "C" __global__ void bernoulli_##code(const T* p, void* y, int y_code, i64 n, u64 key) {              \
    bernoulli<T>(p, y, y_code, n, key);                                                                        \
  }
RANDOM(float, f32)
RANDOM(half_t, f16)
RANDOM(double, f64)
RANDOM(bf16_t, bf16)

// Optimizer updates of the ai.onnx.preview.training domain (Adagrad, Adam, Momentum), one
// launch per state tensor: elementwise over x, 1-D grid-stride loop, block 256, in double.
//
// optimizer_<T>(kind, r, r_code, t, x, g, v, h, x_new, v_new, h_new, n, c0..c5)
//   r: the learning rate (float32 when r_code = 0, float64 when 1), t: the int64 update count,
//   both read on the device. v / h and their outputs are null where the op has no such state.
//   kind 0 Adagrad  (c0 norm_coefficient, c1 epsilon, c2 decay_factor)
//   kind 1 Adam     (c0 norm_coefficient, c1 epsilon, c2 alpha, c3 beta, c4 norm_coefficient_post)
//   kind 2 Momentum (c0 norm_coefficient, c2 alpha, c3 beta), kind 3 the same with Nesterov's step
// The formulas are ONNX's (see polykit/kernels/reference/optimizer.py).
#include "dtypes.cuh"

template <class T>
__device__ void optimizer(int kind, const void* r_p, int r_code, const i64* t_p, const T* x, const T* g, const T* v,
                          const T* h, T* x_new, T* v_new, T* h_new, i64 n, double c0, double c1, double c2,
                          double c3, double c4) {
  const double r = r_code ? *(const double*)r_p : (double)*(const float*)r_p;
  const i64 t = *t_p;
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
    const double xi = (double)ld(x, i);
    const double gr = c0 * xi + (double)ld(g, i);
    if (kind == 0) {
      const double hn = (double)ld(h, i) + gr * gr;
      st(x_new, i, xi - r / (1.0 + (double)t * c2) * gr / (sqrt(hn) + c1));
      st(h_new, i, hn);
    } else if (kind == 1) {
      const double vn = c2 * (double)ld(v, i) + (1.0 - c2) * gr;
      const double hn = c3 * (double)ld(h, i) + (1.0 - c3) * gr * gr;
      const double rate = t > 0 ? r * sqrt(1.0 - pow(c3, (double)t)) / (1.0 - pow(c2, (double)t)) : r;
      st(x_new, i, (1.0 - c4) * (xi - rate * (vn / (sqrt(hn) + c1))));
      st(v_new, i, vn);
      st(h_new, i, hn);
    } else {
      const double vn = c2 * (double)ld(v, i) + (t > 0 ? c3 : 1.0) * gr;
      st(x_new, i, xi - r * (kind == 3 ? gr + c2 * vn : vn));
      st(v_new, i, vn);
    }
  }
}

#define OPTIMIZER(T, code)                                                                                     \
  extern "C" __global__ void optimizer_##code(int kind, const void* r_p, int r_code, const i64* t_p,          \
                                              const T* x, const T* g, const T* v, const T* h, T* x_new,        \
                                              T* v_new, T* h_new, i64 n, double c0, double c1, double c2,      \
                                              double c3, double c4) {                                          \
    optimizer<T>(kind, r_p, r_code, t_p, x, g, v, h, x_new, v_new, h_new, n, c0, c1, c2, c3, c4);              \
  }
OPTIMIZER(float, f32)
OPTIMIZER(double, f64)

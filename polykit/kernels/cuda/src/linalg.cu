// Det: the determinant of each M x M matrix of x [B, M, M] (contiguous) into y [B].
//
// det_<T>(x, y, lu, B, M): one thread per matrix (1-D grid-stride loop, block 128) copies its
// matrix into `lu` (workspace, B * M * M doubles) and runs Gaussian elimination with partial
// pivoting in double: det = sign(row swaps) * product of the pivots (0 as soon as a pivot
// column is all zero). M = 0 gives 1, as numpy does.
#include "dtypes.cuh"

template <class T>
__device__ void det(const T* x, T* y, double* lu, i64 B, i64 M) {
  for (i64 b = blockIdx.x * (i64)blockDim.x + threadIdx.x; b < B; b += (i64)gridDim.x * blockDim.x) {
    double* a = lu + b * M * M;
    for (i64 e = 0; e < M * M; ++e) a[e] = (double)ld(x, b * M * M + e);
    double d = 1.0;
    for (i64 c = 0; c < M && d != 0.0; ++c) {
      i64 p = c;
      for (i64 r = c + 1; r < M; ++r)
        if (fabs(a[r * M + c]) > fabs(a[p * M + c])) p = r;
      if (a[p * M + c] == 0.0) { d = 0.0; break; }
      if (p != c) {
        for (i64 k = 0; k < M; ++k) { const double t = a[c * M + k]; a[c * M + k] = a[p * M + k]; a[p * M + k] = t; }
        d = -d;
      }
      const double piv = a[c * M + c];
      d *= piv;
      for (i64 r = c + 1; r < M; ++r) {
        const double f = a[r * M + c] / piv;
        for (i64 k = c + 1; k < M; ++k) a[r * M + k] -= f * a[c * M + k];
      }
    }
    st(y, b, d);
  }
}

#define DET(T, code) \
  extern "C" __global__ void det_##code(const T* x, T* y, double* lu, i64 B, i64 M) { det<T>(x, y, lu, B, M); }
DET(float, f32)
DET(half_t, f16)
DET(double, f64)

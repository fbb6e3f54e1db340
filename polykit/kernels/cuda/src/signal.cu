// Signal kernels: DFT, STFT, window functions, MelWeightMatrix. Direct (O(N^2)) transforms:
// simple and exact to ~1e-7 relative in fp32; every output element sums its own terms in double
// in a fixed order (deterministic). Angles are reduced exactly first ((k * n) mod N, then
// sincospi), so long transforms keep their accuracy.
//
// Sizes that live in input tensors (axis, dft_length, frame_step, frame_length, MelWeightMatrix's
// scalars) are read on the device: `scalar(ptr, code)` with code 0 int32, 1 int64, 2 float32,
// 3 float64, 4 float16 (see signal.py's SCALAR_CODES). Complex tensors are [..., 2] (real, imag).
//
// dft_<T>(x, y, rank, x dims d0..d7, axis, axis_code, dft_length (null: default), len_code,
//         in_complex, inverse, onesided, n)
//   x of rank <= 8, last dim 1 or 2; one thread per output (complex or real) element; n = their count.
// stft_<T>(x, y, window (null: ones), frame_length (null: from host), len_code, host_length,
//          frame_step, step_code, batch, signal_len, in_complex, n_frames, bins)
//   one thread per output complex element of y [batch, n_frames, bins, 2].
// window_<T>(y, size, a0, a1, a2, denom): y[n] = a0 - a1 cos(2 pi n / denom) + a2 cos(4 pi n / denom).
// mel_<T>(y, rows, bins, dft_length, len_code, sample_rate, rate_code, lower, lower_code, upper, upper_code)
//   y [rows, bins]: the triangle of mel bin i evaluated at spectrogram bin j.
// Every kernel is a 1-D grid-stride loop, block 256.
#include "dtypes.cuh"

#define GRID_LOOP(i, n) for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)
#define A8(p) i64 p##0, i64 p##1, i64 p##2, i64 p##3, i64 p##4, i64 p##5, i64 p##6, i64 p##7
#define L8(p) {p##0, p##1, p##2, p##3, p##4, p##5, p##6, p##7}

__device__ __forceinline__ double scalar(const void* p, int code) {
  switch (code) {
    case 0: return (double)*(const i32*)p;
    case 1: return (double)*(const i64*)p;
    case 2: return (double)*(const float*)p;
    case 3: return *(const double*)p;
    default: return (double)h2f(*(const half_t*)p);
  }
}

// e^{i 2 pi r / N} for 0 <= r < N, as (cos, sin)
__device__ __forceinline__ void twiddle(i64 r, i64 N, double& c, double& s) { sincospi(2.0 * (double)r / (double)N, &s, &c); }

template <class T>
__device__ void dft(const T* x, T* y, int rank, const i64* dims, const void* axis_p, int axis_code,
                    const void* len_p, int len_code, int in_complex, int inverse, int onesided, i64 n) {
  i64 a = (i64)scalar(axis_p, axis_code);
  if (a < 0) a += rank;
  const i64 in_len = dims[a];
  i64 inner = 1;
  for (int d = a + 1; d < rank - 1; ++d) inner *= dims[d];
  const bool irfft = inverse && onesided;
  const i64 N = len_p ? (i64)scalar(len_p, len_code) : (irfft ? 2 * (in_len - 1) : in_len);
  const i64 out_len = irfft ? N : (onesided ? N / 2 + 1 : N);
  const int ic = in_complex ? 2 : 1, oc = irfft ? 1 : 2;
  GRID_LOOP(i, n) {
    const i64 in_ = i % inner, t = i / inner, k = t % out_len, o = t / out_len;
    const i64 base = (o * in_len * inner + in_) * ic;  // x[o, 0, in_, 0]
    double re = 0.0, im = 0.0;
    if (irfft) {  // x[k'] for k' > N/2 is conj(x[N - k']); the output is the real part
      const i64 m = N / 2 + 1;
      for (i64 kk = 0; kk < N; ++kk) {
        const i64 s = kk < m ? kk : N - kk;
        if (s >= in_len) continue;
        const double xr = (double)ld(x, base + s * inner * ic);
        double xi = in_complex ? (double)ld(x, base + s * inner * ic + 1) : 0.0;
        if (kk >= m) xi = -xi;
        double c, sn;
        twiddle((kk * k) % N, N, c, sn);
        re += xr * c - xi * sn;
      }
      st(y, i, re / (double)N);
      continue;
    }
    const i64 terms = in_len < N ? in_len : N;
    for (i64 j = 0; j < terms; ++j) {
      const double xr = (double)ld(x, base + j * inner * ic);
      const double xi = in_complex ? (double)ld(x, base + j * inner * ic + 1) : 0.0;
      double c, sn;
      twiddle((j * k) % N, N, c, sn);
      if (!inverse) sn = -sn;
      re += xr * c - xi * sn;
      im += xr * sn + xi * c;
    }
    if (inverse) { re /= (double)N; im /= (double)N; }
    st(y, i * oc, re);
    st(y, i * oc + 1, im);
  }
}

template <class T>
__device__ void stft(const T* x, T* y, const T* window, const void* len_p, int len_code, i64 host_length,
                     const void* step_p, int step_code, i64 batch, i64 signal_len, int in_complex, i64 n_frames,
                     i64 bins) {
  const i64 L = host_length >= 0 ? host_length : (i64)scalar(len_p, len_code);
  const i64 step = (i64)scalar(step_p, step_code);
  const int ic = in_complex ? 2 : 1;
  GRID_LOOP(i, batch * n_frames * bins) {
    const i64 k = i % bins, t = i / bins, f = t % n_frames, b = t / n_frames;
    const i64 base = (b * signal_len + f * step) * ic;
    double re = 0.0, im = 0.0;
    for (i64 j = 0; j < L; ++j) {
      const double w = window ? (double)ld(window, j) : 1.0;
      const double xr = w * (double)ld(x, base + j * ic);
      const double xi = in_complex ? w * (double)ld(x, base + j * ic + 1) : 0.0;
      double c, sn;
      twiddle((j * k) % L, L, c, sn);
      re += xr * c + xi * sn;  // times e^{-i angle}
      im += xi * c - xr * sn;
    }
    st(y, 2 * i, re);
    st(y, 2 * i + 1, im);
  }
}

template <class T>
__device__ void window(T* y, i64 size, double a0, double a1, double a2, double denom) {
  GRID_LOOP(i, size) {
    const double angle = 2.0 * 3.14159265358979323846 * (double)i / denom;
    st(y, i, a0 - a1 * cos(angle) + a2 * cos(2.0 * angle));
  }
}

// the spectrogram bin of mel edge e (0 .. bins + 1), as the ONNX reference computes it
__device__ __forceinline__ i64 mel_edge(i64 e, i64 bins, double dft_length, double rate, double lower, double upper) {
  const double ln10 = 2.302585092994045684;
  const double low = 2595.0 * log1p(lower / 700.0) / ln10, high = 2595.0 * log1p(upper / 700.0) / ln10;
  const double mel = __dadd_rn(__dmul_rn((double)e, (high - low) / (double)(bins + 2)), low);  // no FMA: numpy's roundings
  const double hz = 700.0 * expm1(mel / 2595.0 * ln10);
  return (i64)floor((dft_length + 1.0) * hz / rate);
}

template <class T>
__device__ void mel(T* y, i64 rows, i64 bins, const void* len_p, int len_code, const void* rate_p, int rate_code,
                    const void* lower_p, int lower_code, const void* upper_p, int upper_code) {
  const double dft_length = scalar(len_p, len_code), rate = scalar(rate_p, rate_code);
  const double lower = scalar(lower_p, lower_code), upper = scalar(upper_p, upper_code);
  GRID_LOOP(idx, rows * bins) {
    const i64 j = idx / bins, i = idx % bins;
    const i64 left = mel_edge(i, bins, dft_length, rate, lower, upper);
    const i64 center = mel_edge(i + 1, bins, dft_length, rate, lower, upper);
    const i64 right = mel_edge(i + 2, bins, dft_length, rate, lower, upper);
    double v = 0.0;
    if (center == left) v = j == center ? 1.0 : 0.0;
    else if (j >= left && j <= center) v = (double)(j - left) / (double)(center - left);
    if (right > center && j >= center && j < right) v = (double)(right - j) / (double)(right - center);
    st(y, idx, v);
  }
}

#define SIGNAL(T, code)                                                                                          \
  extern "C" __global__ void dft_##code(const T* x, T* y, int rank, A8(d), const void* axis_p, int axis_code,   \
                                        const void* len_p, int len_code, int in_complex, int inverse,            \
                                        int onesided, i64 n) {                                                   \
    const i64 dims[8] = L8(d);                                                                                   \
    dft<T>(x, y, rank, dims, axis_p, axis_code, len_p, len_code, in_complex, inverse, onesided, n);              \
  }                                                                                                              \
  extern "C" __global__ void stft_##code(const T* x, T* y, const T* w, const void* len_p, int len_code,          \
                                         i64 host_length, const void* step_p, int step_code, i64 batch,          \
                                         i64 signal_len, int in_complex, i64 n_frames, i64 bins) {               \
    stft<T>(x, y, w, len_p, len_code, host_length, step_p, step_code, batch, signal_len, in_complex, n_frames,   \
            bins);                                                                                               \
  }                                                                                                              \
  extern "C" __global__ void window_##code(T* y, i64 size, double a0, double a1, double a2, double denom) {     \
    window<T>(y, size, a0, a1, a2, denom);                                                                       \
  }                                                                                                              \
  extern "C" __global__ void mel_##code(T* y, i64 rows, i64 bins, const void* len_p, int len_code,              \
                                        const void* rate_p, int rate_code, const void* lower_p, int lower_code,  \
                                        const void* upper_p, int upper_code) {                                   \
    mel<T>(y, rows, bins, len_p, len_code, rate_p, rate_code, lower_p, lower_code, upper_p, upper_code);         \
  }
SIGNAL(float, f32)
SIGNAL(half_t, f16)
SIGNAL(double, f64)

// Reformats between NCHW and NHWC for the few-channel tensors at the edges of a channels-last
// chain (a model's 3-channel image input), and the channel padding that follows, by element
// size E (u16 / u32 / u8 / u64; the dtype does not matter). One thread per pixel: for each
// channel the threads of a warp touch consecutive pixels (coalesced on the planar side) and
// each thread moves its C channels contiguously on the packed side. 32-bit indices (the host
// checks sizes < 2^31).
//
// to_nhwc:   X [N, C, P] -> Y [N, P, C]     (P = H * W)   grid-stride over N * P
// from_nhwc: X [N, P, C] -> Y [N, C, P]
// pad_last:  X [R, Cin] -> Y [R, Cout]: ONNX constant Pad of the last axis only; its begin pad
//            is read on the device from the op's pads input (int64 or int32, `rank` axes), the
//            fill value from the optional constant input (else 0); grid-stride over R rows.
// pad_chunks: the same with one thread per W-byte chunk of an output row (W = 4, 8 or 16 bytes,
//            a divisor of the row, y aligned to W): a padded stem pixel (3 -> 8 halves, 3 -> 16
//            int8) is one 16-byte store. grid-stride over R * Cout / V chunks, V = W / sizeof(E).
#include "dtypes.cuh"

#define GRID_LOOP32(i, n) for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += gridDim.x * blockDim.x)

template <class E>
__device__ __forceinline__ void to_nhwc(const E* __restrict__ x, E* __restrict__ y, int N, int C, int P) {
  GRID_LOOP32(i, N * P) {
    const int n = i / P, p = i - n * P;
    const E* src = x + n * C * P + p;
    E* dst = y + i * C;
    for (int c = 0; c < C; ++c) dst[c] = src[c * P];
  }
}

template <class E>
__device__ __forceinline__ void from_nhwc(const E* __restrict__ x, E* __restrict__ y, int N, int C, int P) {
  GRID_LOOP32(i, N * P) {
    const int n = i / P, p = i - n * P;
    const E* src = x + i * C;
    E* dst = y + n * C * P + p;
    for (int c = 0; c < C; ++c) dst[c * P] = src[c];
  }
}

template <class E>
__device__ __forceinline__ void pad_last(const E* __restrict__ x, E* __restrict__ y, const E* cval, int R, int Cin,
                                         int Cout, const void* pads, int rank, int is64) {
  const E fill = cval ? *cval : E();
  const int begin = is64 ? (int)((const i64*)pads)[rank - 1] : ((const i32*)pads)[rank - 1];
  GRID_LOOP32(r, R) {
    const E* src = x + r * Cin;
    E* dst = y + r * Cout;
    for (int c = 0; c < Cout; ++c) {
      const int s = c - begin;
      dst[c] = (s >= 0 && s < Cin) ? src[s] : fill;
    }
  }
}

template <class E, int V> struct alignas(sizeof(E) * V) Chunk { E e[V]; };

template <class E, int V>
__device__ __forceinline__ void pad_chunks(const E* __restrict__ x, E* __restrict__ y, const E* cval, int R, int Cin,
                                           int Cout, const void* pads, int rank, int is64) {
  const E fill = cval ? *cval : E();
  const int begin = is64 ? (int)((const i64*)pads)[rank - 1] : ((const i32*)pads)[rank - 1];
  const int per_row = Cout / V;
  GRID_LOOP32(k, R * per_row) {
    const int r = k / per_row, c0 = (k - r * per_row) * V - begin;
    const E* src = x + (i64)r * Cin;
    Chunk<E, V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) out.e[j] = (c0 + j >= 0 && c0 + j < Cin) ? src[c0 + j] : fill;
    *(Chunk<E, V>*)(y + (i64)k * V) = out;
  }
}

// pad_chunks with W bytes a chunk (a runtime choice among the widths E divides)
template <class E>
__device__ __forceinline__ void pad_chunks_w(const E* x, E* y, const E* cval, int R, int Cin, int Cout,
                                             const void* pads, int rank, int is64, int W) {
  if constexpr (sizeof(E) <= 4) {
    if (W == 4) { pad_chunks<E, 4 / sizeof(E)>(x, y, cval, R, Cin, Cout, pads, rank, is64); return; }
  }
  if (W == 8) pad_chunks<E, 8 / sizeof(E)>(x, y, cval, R, Cin, Cout, pads, rank, is64);
  else pad_chunks<E, 16 / sizeof(E)>(x, y, cval, R, Cin, Cout, pads, rank, is64);
}

#define REFORMAT(E, code)                                                                                    \
  extern "C" __global__ void to_nhwc_##code(const E* x, E* y, int N, int C, int P) { to_nhwc<E>(x, y, N, C, P); } \
  extern "C" __global__ void from_nhwc_##code(const E* x, E* y, int N, int C, int P) {                       \
    from_nhwc<E>(x, y, N, C, P);                                                                             \
  }                                                                                                          \
  extern "C" __global__ void pad_last_##code(const E* x, E* y, const E* cval, int R, int Cin, int Cout,        \
                                             const void* pads, int rank, int is64) {                         \
    pad_last<E>(x, y, cval, R, Cin, Cout, pads, rank, is64);                                                 \
  }                                                                                                          \
  extern "C" __global__ void pad_chunks_##code(const E* x, E* y, const E* cval, int R, int Cin, int Cout,      \
                                               const void* pads, int rank, int is64, int W) {                 \
    pad_chunks_w<E>(x, y, cval, R, Cin, Cout, pads, rank, is64, W);                                          \
  }
REFORMAT(u8, 1)
REFORMAT(u16, 2)
REFORMAT(u32, 4)
REFORMAT(u64, 8)

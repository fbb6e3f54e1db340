// CenterCropPad and Col2Im.
//
// crop_pad_<es>(x, y, n, rank, out d0..d7, in d0..d7, offset o0..o7)
//   y (contiguous, dims `out`, rank <= 8) from x (contiguous, dims `in`): output index o of
//   axis a reads input index o + offset[a]; an element with any index outside the input is 0.
//   Elements are copied as raw es-byte words (any dtype). 1-D grid-stride loop, block 256.
// col2im_<T>(x, y, block_shape, N, C, nd, image i0..i3, dil, pad_begin, pad_end, stride)
//   x [N, C * K, L] (K = prod(block), L = prod(n_blocks)) -> y [N, C, image...], nd <= 4
//   spatial dims. The block shape is read on the device from the int64 `block_shape` input
//   (the plan keeps no host copy); n_blocks[d] = (image + pads - dil * (block - 1) - 1) / stride + 1. One thread per output element gathers every (kernel offset, block) pair that
//   lands on it (no atomics: deterministic), summing in the compute type (fp32 for fp16).
#include "dtypes.cuh"

#define GRID_LOOP(i, n) for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)
#define A8(p) i64 p##0, i64 p##1, i64 p##2, i64 p##3, i64 p##4, i64 p##5, i64 p##6, i64 p##7
#define L8(p) {p##0, p##1, p##2, p##3, p##4, p##5, p##6, p##7}
#define A4(p) i64 p##0, i64 p##1, i64 p##2, i64 p##3
#define L4(p) {p##0, p##1, p##2, p##3}

template <class E>
__device__ void crop_pad(const E* x, E* y, i64 n, int rank, const i64* out, const i64* in, const i64* off) {
  GRID_LOOP(i, n) {
    i64 rest = i, src = 0, stride = 1;
    bool inside = true;
    for (int a = rank - 1; a >= 0; --a) {
      const i64 o = rest % out[a];
      rest /= out[a];
      const i64 s = o + off[a];
      inside = inside && s >= 0 && s < in[a];
      src += s * stride;
      stride *= in[a];
    }
    y[i] = inside ? x[src] : (E)0;
  }
}

#define CROP_PAD(E, es)                                                                                       \
  extern "C" __global__ void crop_pad_##es(const E* x, E* y, i64 n, int rank, A8(out), A8(in), A8(off)) {    \
    const i64 o[8] = L8(out), d[8] = L8(in), f[8] = L8(off);                                                  \
    crop_pad<E>(x, y, n, rank, o, d, f);                                                                      \
  }
CROP_PAD(u8, 1)
CROP_PAD(u16, 2)
CROP_PAD(u32, 4)
CROP_PAD(u64, 8)

template <class T>
__device__ void col2im(const T* x, T* y, const i64* block_shape, i64 N, i64 C, int nd, const i64* image,
                       const i64* dil, const i64* pad, const i64* pad_end, const i64* stride) {
  typedef typename Compute<T>::type A;
  i64 block[4], nblk[4], spatial = 1, K = 1, L = 1;
  for (int d = 0; d < nd; ++d) {
    block[d] = block_shape[d];
    nblk[d] = (image[d] + pad[d] + pad_end[d] - dil[d] * (block[d] - 1) - 1) / stride[d] + 1;
    spatial *= image[d];
    K *= block[d];
    L *= nblk[d];
  }
  GRID_LOOP(i, N * C * spatial) {
    const i64 nc = i / spatial;  // n * C + c
    i64 pos[4], rest = i - nc * spatial;
    for (int d = nd - 1; d >= 0; --d) { pos[d] = rest % image[d]; rest /= image[d]; }
    A acc = (A)0;
    for (i64 k = 0; k < K; ++k) {
      i64 kr = k, blk = 0, scale = 1;
      bool hit = true;
      for (int d = nd - 1; d >= 0 && hit; --d) {
        const i64 kd = kr % block[d];
        kr /= block[d];
        const i64 t = pos[d] + pad[d] - kd * dil[d];
        if (t < 0 || t % stride[d] != 0 || t / stride[d] >= nblk[d]) hit = false;
        else { blk += (t / stride[d]) * scale; scale *= nblk[d]; }
      }
      if (hit) acc += (A)ld(x, (nc * K + k) * L + blk);
    }
    st(y, i, acc);
  }
}

#define COL2IM(T, code)                                                                                        \
  extern "C" __global__ void col2im_##code(const T* x, T* y, const i64* block_shape, i64 N, i64 C, int nd,     \
                                           A4(img), A4(dl), A4(pb), A4(pe), A4(sd)) {                         \
    const i64 image[4] = L4(img), dil[4] = L4(dl), pad[4] = L4(pb), pad_end[4] = L4(pe), stride[4] = L4(sd);   \
    col2im<T>(x, y, block_shape, N, C, nd, image, dil, pad, pad_end, stride);                                  \
  }
COL2IM(float, f32)
COL2IM(half_t, f16)
COL2IM(double, f64)

// ai.polykit PermutedCopy (kernels/cuda/movement/permuted_copy.py): one pass that rolls, windows,
// transposes across reshapes and rolls again; by element size (1/2/4/8 bytes, and 16 when the
// host widened a contiguous innermost run). One thread per output element (grid-stride, block 256),
// output written contiguously (coalesced), source read through three index phases the host
// prepared (each skipped when its rank is 0, every dim list innermost last):
//   1. output roll: i -> coordinates over od[nj] (the output shape, unshifted neighbours merged),
//      c' = (c + oo) mod od, back to a linear index `lin` of the unrolled output;
//   2. permutation: lin -> coordinates over fd[nk] (the permuted view, contiguous runs merged),
//      w = sum c * fs (the view's own strides): the linear index into the window;
//   3. window: w -> coordinates over wd[nl] (the window), c' = (c + st) mod sd (the input dims),
//      source offset = sum c' * ss (the input's strides).
// Starts and offsets are in [0, dim) and c < window <= dim, so one conditional subtraction wraps.
// The loops run over all 8 slots (unrolled, constant indices: the tables stay in registers).
#include "dtypes.cuh"

#define PC8(p) i64 p##0, i64 p##1, i64 p##2, i64 p##3, i64 p##4, i64 p##5, i64 p##6, i64 p##7
#define PC_ARR(name, p) const i64 name[8] = {p##0, p##1, p##2, p##3, p##4, p##5, p##6, p##7}
#define PC_ARGS8(p) p##0, p##1, p##2, p##3, p##4, p##5, p##6, p##7
#define PC_PARAMS const void* src, void* dst, i64 n, i64 nj, PC8(od), PC8(oo), i64 nk, PC8(fd), PC8(fs), i64 nl, \
                  PC8(wd), PC8(st), PC8(sd), PC8(ss)
#define PC_ARGS src, dst, n, nj, PC_ARGS8(od), PC_ARGS8(oo), nk, PC_ARGS8(fd), PC_ARGS8(fs), nl, PC_ARGS8(wd), \
                PC_ARGS8(st), PC_ARGS8(sd), PC_ARGS8(ss)

template <class E>
__device__ void permuted_copy(const E* __restrict__ src, E* __restrict__ dst, i64 n, i64 nj, const i64* od,
                              const i64* oo, i64 nk, const i64* fd, const i64* fs, i64 nl, const i64* wd,
                              const i64* st, const i64* sd, const i64* ss) {
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
    i64 lin = i;
    if (nj) {
      i64 r = i, acc = 1;
      lin = 0;
#pragma unroll
      for (int d = 7; d >= 0; --d) {
        if (d >= nj) continue;
        const i64 q = d ? r / od[d] : 0;
        i64 c = r - q * od[d] + oo[d];
        if (c >= od[d]) c -= od[d];
        lin += c * acc;
        acc *= od[d];
        r = q;
      }
    }
    i64 w = lin;
    if (nk) {
      i64 r = lin;
      w = 0;
#pragma unroll
      for (int k = 7; k >= 0; --k) {
        if (k >= nk) continue;
        const i64 q = k ? r / fd[k] : 0;
        w += (r - q * fd[k]) * fs[k];
        r = q;
      }
    }
    i64 so = w;
    if (nl) {
      i64 r = w;
      so = 0;
#pragma unroll
      for (int a = 7; a >= 0; --a) {
        if (a >= nl) continue;
        const i64 q = a ? r / wd[a] : 0;
        i64 c = r - q * wd[a] + st[a];
        if (c >= sd[a]) c -= sd[a];
        so += c * ss[a];
        r = q;
      }
    }
    dst[i] = src[so];
  }
}

#define PERMUTED_COPY(E, code)                                                                        \
  extern "C" __global__ void permuted_copy_##code(PC_PARAMS) {                                        \
    PC_ARR(od_, od); PC_ARR(oo_, oo); PC_ARR(fd_, fd); PC_ARR(fs_, fs);                               \
    PC_ARR(wd_, wd); PC_ARR(st_, st); PC_ARR(sd_, sd); PC_ARR(ss_, ss);                               \
    permuted_copy<E>((const E*)src, (E*)dst, n, nj, od_, oo_, nk, fd_, fs_, nl, wd_, st_, sd_, ss_);  \
  }
// one compile unit per element size when PK_SPLIT is defined
#if !defined(PK_SPLIT) || defined(PK_ONLY_1)
PERMUTED_COPY(u8, 1)
#endif
#if !defined(PK_SPLIT) || defined(PK_ONLY_2)
PERMUTED_COPY(u16, 2)
#endif
#if !defined(PK_SPLIT) || defined(PK_ONLY_4)
PERMUTED_COPY(u32, 4)
#endif
#if !defined(PK_SPLIT) || defined(PK_ONLY_8)
PERMUTED_COPY(u64, 8)
#endif
#if !defined(PK_SPLIT) || defined(PK_ONLY_16)
PERMUTED_COPY(uint4, 16)
#endif

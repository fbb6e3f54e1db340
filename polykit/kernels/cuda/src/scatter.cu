// GatherND, ScatterND, ScatterElements (reduction none/add/mul/max/min) and MaxUnpool.
//
// One thread per output (gather) or per update element (scatter), 1-D grid-stride loops,
// block 256. Indices are int64 or int32 (is64); negative ones wrap, out-of-range ones are
// clamped (gathers) or skipped (scatters): the device cannot raise, the reference rejects them.
// Scatters run after the host copied data into the output. Reduction "none" stores (by
// element size: duplicate indices leave an unspecified one of the updates, as ONNX allows);
// the reductions (op code: 0 add, 1 mul, 2 max, 3 min) update atomically in the element's
// compute type (f16 through float), so float results depend on the order of duplicates.
#include "dtypes.cuh"

#define GRID_LOOP(i, n) for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)
#define STR8(p) i64 p##0, i64 p##1, i64 p##2, i64 p##3, i64 p##4, i64 p##5, i64 p##6, i64 p##7
#define ARR8(name, p) const i64 name[8] = {p##0, p##1, p##2, p##3, p##4, p##5, p##6, p##7}

__device__ __forceinline__ i64 load_index(const void* idx, i64 i, i64 is64) {
  return is64 ? ((const i64*)idx)[i] : (i64)((const i32*)idx)[i];
}
__device__ __forceinline__ i64 wrap(i64 k, i64 dim) { return k < 0 ? k + dim : k; }

// ---- update operations ------------------------------------------------------------------------
// op: 0 add, 1 mul, 2 max, 3 min (numpy maximum/minimum: NaN wins)
template <class C> __device__ __forceinline__ C combine(C a, C u, int op) {
  switch (op) {
    case 0: return a + u;
    case 1: return a * u;
    case 2: return a != a ? a : (u != u ? u : (u > a ? u : a));
    default: return a != a ? a : (u != u ? u : (u < a ? u : a));
  }
}

template <int S> struct Word;
template <> struct Word<2> { typedef unsigned short type; };
template <> struct Word<4> { typedef unsigned int type; };
template <> struct Word<8> { typedef unsigned long long type; };

template <class T> __device__ __forceinline__ typename Compute<T>::type decode(typename Word<sizeof(T)>::type w) {
  T v; memcpy(&v, &w, sizeof(T)); return ld(&v, 0);
}
template <class T> __device__ __forceinline__ typename Word<sizeof(T)>::type encode(typename Compute<T>::type c) {
  T v; st(&v, 0, c); typename Word<sizeof(T)>::type w; memcpy(&w, &v, sizeof(T)); return w;
}

// atomically p[0] = combine(p[0], u, op) through a compare-and-swap loop on the element's word
template <class T> struct Update {
  __device__ static void run(T* p, typename Compute<T>::type u, int op) {
    typedef typename Word<sizeof(T)>::type W;
    W* a = (W*)p;
    W old = *a, assumed;
    do {
      assumed = old;
      old = atomicCAS(a, assumed, encode<T>(combine(decode<T>(assumed), u, op)));
    } while (old != assumed);
  }
};
// add has hardware atomics for these types
#define FAST_ADD(T, A)                                                                          \
  template <> struct Update<T> {                                                               \
    __device__ static void run(T* p, T u, int op) {                                            \
      if (op == 0) { atomicAdd((A*)p, (A)u); return; }                                          \
      typedef typename Word<sizeof(T)>::type W;                                                 \
      W* a = (W*)p;                                                                             \
      W old = *a, assumed;                                                                      \
      do {                                                                                      \
        assumed = old;                                                                          \
        old = atomicCAS(a, assumed, encode<T>(combine(decode<T>(assumed), u, op)));             \
      } while (old != assumed);                                                                 \
    }                                                                                           \
  };
FAST_ADD(float, float)
FAST_ADD(double, double)
FAST_ADD(i32, i32)
FAST_ADD(i64, unsigned long long)

// reduction "none": a plain store (op unused)
template <class T> struct Store { __device__ static void run(T* p, T u, int) { *p = u; } };

// ---- GatherND ------------------------------------------------------------------------------------
// data viewed as [batch, D0..D(k-1), inner], indices as [batch, m, k], output as [batch, m, inner].
template <class E>
__device__ void gather_nd(const E* __restrict__ data, const void* __restrict__ idx, E* __restrict__ out, i64 is64,
                          i64 batch, i64 m, i64 k, i64 inner, const i64* dims) {
  i64 block = inner;
  for (int j = 0; j < k; ++j) block *= dims[j];
  GRID_LOOP(i, batch * m * inner) {
    const i64 in_ = i % inner, t = i / inner, b = t / m;
    i64 off = 0;
    for (int j = 0; j < k; ++j) {
      i64 c = wrap(load_index(idx, t * k + j, is64), dims[j]);
      c = c < 0 ? 0 : (c >= dims[j] ? dims[j] - 1 : c);
      off = off * dims[j] + c;
    }
    out[i] = data[b * block + off * inner + in_];
  }
}

// ---- ScatterND -----------------------------------------------------------------------------------
// out viewed as [D0..D(k-1), inner]; indices [m, k]; updates [m, inner].
template <class U, class T>
__device__ void scatter_nd(T* out, const void* __restrict__ idx, const T* __restrict__ upd, i64 is64, i64 m, i64 k,
                           i64 inner, const i64* dims, int op) {
  GRID_LOOP(i, m * inner) {
    const i64 in_ = i % inner, r = i / inner;
    i64 off = 0;
    bool ok = true;
    for (int j = 0; j < k; ++j) {
      const i64 c = wrap(load_index(idx, r * k + j, is64), dims[j]);
      ok = ok && c >= 0 && c < dims[j];
      off = off * dims[j] + c;
    }
    if (ok) U::run(out + off * inner + in_, ld(upd, i), op);
  }
}

// ---- ScatterElements -----------------------------------------------------------------------------
// updates/indices have dims idims (rank <= 8), out has ddims; the target of update i is its own
// coordinate with the axis coordinate replaced by the index.
template <class U, class T>
__device__ void scatter_elements(T* out, const void* __restrict__ idx, const T* __restrict__ upd, i64 is64, i64 n,
                                 i64 rank, i64 axis, const i64* idims, const i64* ddims, int op) {
  i64 dst[8];
  i64 acc = 1;
  for (int d = (int)rank - 1; d >= 0; --d) { dst[d] = acc; acc *= ddims[d]; }
  GRID_LOOP(i, n) {
    const i64 kx = wrap(load_index(idx, i, is64), ddims[axis]);
    if (kx < 0 || kx >= ddims[axis]) continue;
    i64 r = i, off = 0;
    for (int d = (int)rank - 1; d >= 0; --d) {
      const i64 q = r / idims[d], c = r - q * idims[d];
      off += (d == axis ? kx : c) * dst[d];
      r = q;
    }
    U::run(out + off, ld(upd, i), op);
  }
}

// ---- MaxUnpool -----------------------------------------------------------------------------------
// out is zero-filled first (zero_<es>); x element i goes to flat index idx[i] of the unpooled
// shape `udims`, which sits at the top-left corner of the output shape `odims`.
template <class E>
__device__ void max_unpool(const E* __restrict__ x, const i64* __restrict__ idx, E* __restrict__ out, i64 n, i64 rank,
                           const i64* udims, const i64* odims) {
  i64 usize = 1;
  for (int d = 0; d < rank; ++d) usize *= udims[d];
  GRID_LOOP(i, n) {
    i64 r = idx[i];
    if (r < 0 || r >= usize) continue;
    i64 off = 0, stride = 1;
    for (int d = (int)rank - 1; d >= 0; --d) {
      const i64 q = r / udims[d];
      off += (r - q * udims[d]) * stride;
      stride *= odims[d];
      r = q;
    }
    out[off] = x[i];
  }
}

#define BY_SIZE(E, es)                                                                                          \
  extern "C" __global__ void gather_nd_##es(const E* data, const void* idx, E* out, i64 is64, i64 batch, i64 m, \
                                            i64 k, i64 inner, STR8(d)) {                                        \
    ARR8(dims, d); gather_nd<E>(data, idx, out, is64, batch, m, k, inner, dims);                                \
  }                                                                                                             \
  extern "C" __global__ void scatter_nd_none_##es(E* out, const void* idx, const E* upd, i64 is64, i64 m, i64 k, \
                                                  i64 inner, STR8(d)) {                                         \
    ARR8(dims, d); scatter_nd<Store<E>, E>(out, idx, upd, is64, m, k, inner, dims, 0);                               \
  }                                                                                                             \
  extern "C" __global__ void scatter_elements_none_##es(E* out, const void* idx, const E* upd, i64 is64, i64 n,  \
                                                        i64 rank, i64 axis, STR8(a), STR8(b)) {                 \
    ARR8(idims, a); ARR8(ddims, b); scatter_elements<Store<E>, E>(out, idx, upd, is64, n, rank, axis, idims, ddims, 0); \
  }                                                                                                             \
  extern "C" __global__ void max_unpool_##es(const E* x, const i64* idx, E* out, i64 n, i64 rank, STR8(a),      \
                                             STR8(b)) {                                                         \
    ARR8(udims, a); ARR8(odims, b); max_unpool<E>(x, idx, out, n, rank, udims, odims);                          \
  }                                                                                                             \
  extern "C" __global__ void zero_##es(E* out, i64 n) { GRID_LOOP(i, n) out[i] = (E)0; }
BY_SIZE(u8, 1)
BY_SIZE(u16, 2)
BY_SIZE(u32, 4)
BY_SIZE(u64, 8)

#define REDUCE(T, code)                                                                                       \
  extern "C" __global__ void scatter_nd_reduce_##code(T* out, const void* idx, const T* upd, i64 is64, i64 m, i64 k, \
                                                      i64 inner, STR8(d), int op) {                              \
    ARR8(dims, d); scatter_nd<Update<T>, T>(out, idx, upd, is64, m, k, inner, dims, op);                         \
  }                                                                                                              \
  extern "C" __global__ void scatter_elements_reduce_##code(T* out, const void* idx, const T* upd, i64 is64,     \
                                                            i64 n, i64 rank, i64 axis, STR8(a), STR8(b), int op) { \
    ARR8(idims, a); ARR8(ddims, b); scatter_elements<Update<T>, T>(out, idx, upd, is64, n, rank, axis, idims, ddims, op); \
  }
REDUCE(float, f32)
REDUCE(half_t, f16)
REDUCE(double, f64)
REDUCE(i32, i32)
REDUCE(i64, i64)

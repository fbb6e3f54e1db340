// LayerNormalization / RMSNormalization over the last L elements with the row in registers
// (cuda.norm.warp, norm.py): one read of x, one write of y.
//
// X, Y viewed as [rows, L]; scale / bias hold L elements or one (a broadcast scalar); fp32 math.
// A row belongs to NW_LANES consecutive lanes of a warp (a power of two, 4..32; NW_THREADS /
// NW_LANES rows a block): lane l holds the 16-byte vectors l, l + NW_LANES, ... (NW_CHUNKS of
// them, NW_VEC = 16 / sizeof(ELEM) elements each) as raw storage words, so element j of the row
// is chunk c = j / (NW_VEC * NW_LANES), lane (j / NW_VEC) % NW_LANES, slot j % NW_VEC.
// vec != 0 (the host checks L % NW_VEC == 0 and 16-byte aligned x, y and the L-element scale /
// bias): 16-byte loads and stores; else element by element into the same registers (tails,
// misaligned views). Statistics as norm_rows, two-pass from the registers: mean = sum / L, then
// var = sum((x - mean)^2) / L (rms != 0: mean 0, var = mean(x^2)); the lanes of a row combine
// their partial sums with xor shuffles (every lane gets the same bits). y = (x - mean) * rstd *
// scale + bias, rstd = rsqrt(var + eps); float32 mean / inv_std outputs per row when not null.
//
// NW_Q8 1 (ai.polykit LayerNormQuantize): the output stage also writes Yq[i] = e4m3(saturate(y_i / y_scale[0])),
// y_i the value stored as ELEM (QuantizeLinear of Y: lowp.cuh's round-to-nearest-even encode of the IEEE
// quotient, as quantize.cu's quantize_linear computes it; by e4m3_quantize.cuh: no division for a scale in
// [2^-90, 2^90], two values a conversion), NW_VEC bytes a store when vec (Yq 8-byte aligned for fp16/bf16, 4 for
// fp32: the host checks); Y is written only when not null (the float output's other readers).
// NW_MAPS 1 (a LayerNorm / RMSNorm with a row map or an input map, norm_row_map.cuh, compiled only into
// the layers that have one: a plain norm's code is the same without it): input row `row` goes to output row
// rm_dest(row) (dims == 0 is the identity), and the input map reads the row's vectors / elements at
// X[im_elem(row, j)] (16-byte vectors when its segments are whole vectors: the host checks).
//
// Defines: ELEM (float, half_t, bf16_t), NW_LANES, NW_CHUNKS (1..32 fp32, 1..16 fp16/bf16:
// L <= NW_CHUNKS * NW_LANES * NW_VEC), NW_Q8 (0, 1), NW_MAPS (0, 1). grid: min(ceil(rows / NW_ROWS), 2^20) blocks of NW_THREADS,
// stepping over row groups (every thread of a block runs the same iterations, shuffles included;
// rows past the end only skip their stores).
#include "dtypes.cuh"
#include "norm_row_map.cuh"

#ifndef ELEM
#define ELEM half_t
#endif
#ifndef NW_LANES
#define NW_LANES 32
#endif
#ifndef NW_CHUNKS
#define NW_CHUNKS 1
#endif
#ifndef NW_Q8
#define NW_Q8 0
#endif
#if NW_Q8
#include "e4m3_quantize.cuh"
#endif
#define NW_THREADS 128
#define NW_VEC ((int)(16 / sizeof(ELEM)))
#define NW_ROWS (NW_THREADS / NW_LANES)

// the 32-bit word i (0..3) of a 16-byte vector (i compile-time after unrolling: a register)
__device__ __forceinline__ unsigned nw_word(const uint4& r, int i) {
  return i == 0 ? r.x : (i == 1 ? r.y : (i == 2 ? r.z : r.w));
}
__device__ __forceinline__ void nw_set_word(uint4& r, int i, unsigned w) {
  if (i == 0) r.x = w; else if (i == 1) r.y = w; else if (i == 2) r.z = w; else r.w = w;
}

// element e of a vector of T as float, and a float as T's bits
template <class T> __device__ __forceinline__ float nw_get(const uint4& r, int e);
template <> __device__ __forceinline__ float nw_get<float>(const uint4& r, int e) { return __uint_as_float(nw_word(r, e)); }
template <> __device__ __forceinline__ float nw_get<half_t>(const uint4& r, int e) {
  half_t h;
  h.x = (unsigned short)(nw_word(r, e >> 1) >> ((e & 1) * 16));
  return h2f(h);
}
template <> __device__ __forceinline__ float nw_get<bf16_t>(const uint4& r, int e) {
  bf16_t b;
  b.x = (unsigned short)(nw_word(r, e >> 1) >> ((e & 1) * 16));
  return b2f(b);
}
__device__ __forceinline__ unsigned nw_bits(float v, float*) { return __float_as_uint(v); }
__device__ __forceinline__ unsigned nw_bits(float v, half_t*) { return f2h(v).x; }
__device__ __forceinline__ unsigned nw_bits(float v, bf16_t*) { return f2b(v).x; }
__device__ __forceinline__ unsigned nw_raw(float v) { return __float_as_uint(v); }
__device__ __forceinline__ unsigned nw_raw(half_t v) { return v.x; }
__device__ __forceinline__ unsigned nw_raw(bf16_t v) { return v.x; }

// element e of vector `r` set to the storage bits `bits` (the other half of its word kept)
template <class T> __device__ __forceinline__ void nw_put(uint4& r, int e, unsigned bits) {
  if (sizeof(T) == 4) {
    nw_set_word(r, e, bits);
  } else {
    const int sh = (e & 1) * 16;
    nw_set_word(r, e >> 1, (nw_word(r, e >> 1) & ~(0xffffu << sh)) | ((bits & 0xffffu) << sh));
  }
}

// the sum of `v` over the NW_LANES lanes of a row (aligned lane groups: xor offsets stay inside)
__device__ __forceinline__ float nw_row_sum(float v) {
#pragma unroll
  for (int m = NW_LANES / 2; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}

// 16 bytes of row `row` of X through the input map at vector q (vec: a segment holds whole vectors)
// or its elements q * NW_VEC.. below L one by one, zeros past L and for a row that is not `live`.
// `base`: with `shared` (the map has dims and the row's spr = L / seg segments fit its lanes), lane s <
// spr of the row holds im_base(row, s): each vector takes its segment's start from that lane by a
// shuffle (every lane of the warp runs it), so a row evaluates the map once a lane, not once a vector
// (the divisions of rm_dest in front of every load made the patch mergings' norms latency-bound)
__device__ __forceinline__ uint4 nw_load_x(const ELEM* X, i64 row, bool live, int q, int L, int vec, const InMap& im,
                                           bool shared, int spr, i64 base) {
  uint4 r = make_uint4(0u, 0u, 0u, 0u);
  if (vec) {
    const int j = q * NW_VEC;
    if (shared) {
      const int s0 = j / im.seg, s = s0 < spr ? s0 : spr - 1;  // a vector past L asks the last segment: not loaded
      const i64 b = __shfl_sync(0xffffffffu, base, s, NW_LANES);
      if (live && j < L) r = *(const uint4*)(X + b + (j - s * im.seg));
    } else if (live && j < L) {
      r = *(const uint4*)(X + im_elem(row, j, L, im));
    }
  } else if (live) {
#pragma unroll
    for (int e = 0; e < NW_VEC; ++e) {
      const int j = q * NW_VEC + e;
      if (j < L) nw_put<ELEM>(r, e, nw_raw(X[im_elem(row, j, L, im)]));
    }
  }
  return r;
}

// 16 bytes of p at vector q (vec) or elements q * NW_VEC.. below L one by one, zeros past L
__device__ __forceinline__ uint4 nw_load(const ELEM* p, int q, int L, int vec) {
  uint4 r = make_uint4(0u, 0u, 0u, 0u);
  if (vec) {
    if (q * NW_VEC < L) r = ((const uint4*)p)[q];
  } else {
#pragma unroll
    for (int e = 0; e < NW_VEC; ++e) {
      const int j = q * NW_VEC + e;
      if (j < L) nw_put<ELEM>(r, e, nw_raw(p[j]));
    }
  }
  return r;
}

#define NW_PARAMS                                                                                          \
  const ELEM *__restrict__ X, const ELEM *__restrict__ scale, const ELEM *__restrict__ bias, ELEM *__restrict__ Y, \
      float *__restrict__ mean_out, float *__restrict__ rstd_out, i64 rows, int L, int n_scale, int n_bias,      \
      float eps, int rms, int vec NW_Q8_PARAMS NW_MAP_PARAMS
#define NW_ARGS X, scale, bias, Y, mean_out, rstd_out, rows, L, n_scale, n_bias, eps, rms, vec NW_Q8_ARGS NW_MAP_ARGS
#ifndef NW_MAPS
#define NW_MAPS 0
#endif
#if NW_MAPS
#define NW_MAP_PARAMS , RM_PARAMS, IM_PARAMS
#define NW_MAP_ARGS , RM_ARGS, IM_ARGS
#define NW_DEST(row) rm_dest(row, map)
#define NW_OUT_ROW dest  // computed before the loads
#else
#define NW_MAP_PARAMS
#define NW_MAP_ARGS
#define NW_DEST(row) (row)
#define NW_OUT_ROW row
#endif
#if NW_Q8
#define NW_Q8_PARAMS , u8 *__restrict__ Yq, const float *__restrict__ y_scale
#define NW_Q8_ARGS , Yq, y_scale
#else
#define NW_Q8_PARAMS
#define NW_Q8_ARGS
#endif

extern "C" __global__ void __launch_bounds__(NW_THREADS) norm_warp(NW_PARAMS) {
  const int lane = threadIdx.x % NW_LANES;
  const int sub = threadIdx.x / NW_LANES;
  const float inv_l = 1.0f / (float)L;
  const float s0 = ld(scale, 0), b0 = bias ? ld(bias, 0) : 0.0f;
#if NW_Q8
  const E4m3Quantizer quant = e4m3_quantizer(y_scale[0]);  // one reciprocal a thread
#endif
#if NW_MAPS
  const RowMap map = rm_make(RM_ARGS);
  const InMap im = {rm_make(IM_MAP_ARGS), im_seg, im_offset};
  const int spr = im.m.dims ? L / im.seg : 0;       // segments a row (the input map's)
  const bool shared = vec && spr > 0 && spr <= NW_LANES;  // warp-uniform: every lane shuffles or none
#endif
  for (i64 row0 = (i64)blockIdx.x * NW_ROWS; row0 < rows; row0 += (i64)gridDim.x * NW_ROWS) {
    const i64 row = row0 + sub;
    const bool live = row < rows;
    uint4 r[NW_CHUNKS];
#if NW_MAPS
    const i64 dest = NW_DEST(live ? row : 0);  // the output row, evaluated while the loads are in flight
    i64 base = 0;
    if (shared && lane < spr) base = im_base(live ? row : 0, lane, L, im);
#pragma unroll
    for (int c = 0; c < NW_CHUNKS; ++c) r[c] = nw_load_x(X, row, live, c * NW_LANES + lane, L, vec, im, shared, spr, base);
#else
    const ELEM* xr = X + (live ? row : 0) * L;
#pragma unroll
    for (int c = 0; c < NW_CHUNKS; ++c)
      r[c] = live ? nw_load(xr, c * NW_LANES + lane, L, vec) : make_uint4(0u, 0u, 0u, 0u);
#endif
    float mean = 0.0f;
    if (!rms) {
      float s = 0.0f;
#pragma unroll
      for (int c = 0; c < NW_CHUNKS; ++c)
#pragma unroll
        for (int e = 0; e < NW_VEC; ++e) s += nw_get<ELEM>(r[c], e);  // zeros past L
      mean = nw_row_sum(s) * inv_l;
    }
    float q = 0.0f;
#pragma unroll
    for (int c = 0; c < NW_CHUNKS; ++c)
#pragma unroll
      for (int e = 0; e < NW_VEC; ++e) {
        const float d = nw_get<ELEM>(r[c], e) - mean;
        if ((c * NW_LANES + lane) * NW_VEC + e < L) q += d * d;
      }
    const float rstd = rsqrtf(nw_row_sum(q) * inv_l + eps);
    if (!live) continue;
    ELEM* yr = Y + NW_OUT_ROW * L;
#if NW_Q8
    u8* qr = Yq + NW_OUT_ROW * L;
#endif
#pragma unroll
    for (int c = 0; c < NW_CHUNKS; ++c) {
      const int qv = c * NW_LANES + lane;
      if (qv * NW_VEC >= L) break;
      const uint4 sv = n_scale == 1 ? make_uint4(0u, 0u, 0u, 0u) : nw_load(scale, qv, L, vec);
      const uint4 bv = (bias == nullptr || n_bias == 1) ? make_uint4(0u, 0u, 0u, 0u) : nw_load(bias, qv, L, vec);
      uint4 out = make_uint4(0u, 0u, 0u, 0u);
#if NW_Q8
      float ye[NW_VEC];  // y as stored (ELEM), read back as float
#endif
#pragma unroll
      for (int e = 0; e < NW_VEC; ++e) {
        const float g = n_scale == 1 ? s0 : nw_get<ELEM>(sv, e);
        const float b = n_bias == 1 ? b0 : nw_get<ELEM>(bv, e);
        const float v = (nw_get<ELEM>(r[c], e) - mean) * rstd * g + (bias ? b : 0.0f);
#if NW_Q8
        uint4 one = make_uint4(0u, 0u, 0u, 0u);
        nw_put<ELEM>(one, 0, nw_bits(v, (ELEM*)nullptr));
        ye[e] = nw_get<ELEM>(one, 0);
        if (Y == nullptr) continue;
#endif
        if (vec) {
          nw_put<ELEM>(out, e, nw_bits(v, (ELEM*)nullptr));
        } else if (qv * NW_VEC + e < L) {
          st(yr, qv * NW_VEC + e, v);
        }
      }
#if NW_Q8
      unsigned short qp[NW_VEC / 2];  // the e4m3 bytes of elements 2k, 2k + 1
#pragma unroll
      for (int k = 0; k < NW_VEC / 2; ++k) qp[k] = quant.pair(ye[2 * k], ye[2 * k + 1]);
      if (vec) {
        unsigned w[NW_VEC / 4];
#pragma unroll
        for (int k = 0; k < NW_VEC / 4; ++k) w[k] = qp[2 * k] | (unsigned)qp[2 * k + 1] << 16;
        if (NW_VEC == 8) ((uint2*)qr)[qv] = uint2{w[0], w[NW_VEC / 4 - 1]};
        else ((unsigned*)qr)[qv] = w[0];
      } else {
#pragma unroll
        for (int e = 0; e < NW_VEC; ++e)
          if (qv * NW_VEC + e < L) qr[qv * NW_VEC + e] = (u8)(qp[e / 2] >> (8 * (e & 1)));
      }
      if (Y == nullptr) continue;
#endif
      if (vec) ((uint4*)yr)[qv] = out;
    }
    if (lane == 0) {
      if (mean_out) mean_out[row] = mean;
      if (rstd_out) rstd_out[row] = rstd;
    }
  }
}

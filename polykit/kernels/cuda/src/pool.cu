// Pooling (NCHW, 1-3 spatial dims mapped onto D x H x W; and 2-D channels last), fp32 compute,
// ELEM storage.
//
// POOL_MODE (define): 0 max, 1 average, 2 Lp. Window geometry as resolved by the compiler
// (begin pads P*, end pads E*, ceil_mode already folded into the output sizes).

#include "dtypes.cuh"

#define POOL_GEOMETRY                                                                                    \
  i64 D, i64 H, i64 W, i64 OD, i64 OH, i64 OW, i64 KD, i64 KH, i64 KW, i64 SD, i64 SH, i64 SW, i64 PD, i64 PH,   \
      i64 PW, i64 ED, i64 EH, i64 EW, i64 DD, i64 DH, i64 DW, i64 count_include_pad, float p
#define POOL_GEOMETRY_ARGS \
  D, H, W, OD, OH, OW, KD, KH, KW, SD, SH, SW, PD, PH, PW, ED, EH, EW, DD, DH, DW, count_include_pad, p
#define POOL_PARAMS const ELEM *X, ELEM *Y, i64 *Ind, i64 NC, POOL_GEOMETRY, i64 col_major

struct Pooled {
  float v;    // the pooled value
  i64 at;     // max: spatial index (id * H + ih) * W + iw of the first maximum, -1 if none
};

// One output window (od, oh, ow) over x, whose spatial neighbours are XD / XH / XW elements apart:
//   max: largest element in the window (padding ignored)
//   avg: sum / (window elements inside the input, or inside the padded input when
//        count_include_pad; positions past the padded end, from ceil_mode, never count)
//   Lp : (sum |x|^p)^(1/p) over the window elements inside the input
__device__ __forceinline__ Pooled pool_one(const ELEM* x, i64 XD, i64 XH, i64 XW, i64 od, i64 oh, i64 ow,
                                           POOL_GEOMETRY) {
#if POOL_MODE == 0
  float best = Lim<float>::lo();
  i64 best_at = -1;
#else
  float acc = 0.f;
  i64 inside = 0, padded = 0;
#endif
  for (i64 kd = 0; kd < KD; ++kd) {
    const i64 id = od * SD - PD + kd * DD;
    const bool pd_ok = id >= -PD && id < D + ED;
    for (i64 kh = 0; kh < KH; ++kh) {
      const i64 ih = oh * SH - PH + kh * DH;
      const bool ph_ok = ih >= -PH && ih < H + EH;
      for (i64 kw = 0; kw < KW; ++kw) {
        const i64 iw = ow * SW - PW + kw * DW;
        const bool in = id >= 0 && id < D && ih >= 0 && ih < H && iw >= 0 && iw < W;
#if POOL_MODE == 0
        if (in) {
          const float v = (float)ld(x, id * XD + ih * XH + iw * XW);
          if (best_at < 0 || v > best) { best = v; best_at = (id * H + ih) * W + iw; }
        }
#else
        padded += (pd_ok && ph_ok && iw >= -PW && iw < W + EW) ? 1 : 0;
        if (in) {
          const float v = (float)ld(x, id * XD + ih * XH + iw * XW);
#if POOL_MODE == 1
          acc += v;
#else
          acc += powf(fabsf(v), p);
#endif
          ++inside;
        }
#endif
      }
    }
  }
#if POOL_MODE == 0
  return {best, best_at};
#elif POOL_MODE == 1
  const i64 n = count_include_pad ? padded : inside;
  return {n > 0 ? acc / (float)n : 0.f, -1};
#else
  return {powf(acc, 1.f / p), -1};
#endif
}

// NCHW: one thread per output element y[nc, od, oh, ow] (grid-stride). MaxPool's Ind (may be
// null) gets the flat row-major index into X of the first maximum (ONNX MaxPool Indices,
// storage_order 0; col_major: the spatial part column-major, storage_order 1).
// grid (ceil(total/256)), block 256
extern "C" __global__ void __launch_bounds__(256) pool_window(POOL_PARAMS) {
  const i64 OSP = OD * OH * OW, total = NC * OSP;
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
    const i64 nc = i / OSP; i64 s = i - nc * OSP;
    const i64 od = s / (OH * OW); s -= od * OH * OW;
    const i64 oh = s / OW, ow = s - oh * OW;
    const Pooled r = pool_one(X + nc * D * H * W, H * W, W, 1, od, oh, ow, POOL_GEOMETRY_ARGS);
    st(Y, i, r.v);
#if POOL_MODE == 0
    if (Ind) {
      i64 at = r.at < 0 ? 0 : r.at;
      if (col_major) {  // storage_order 1: the spatial dims column-major (id fastest)
        const i64 bd = at / (H * W), bh = (at / W) % H, bw = at % W;
        at = bd + D * (bh + H * bw);
      }
      Ind[i] = r.at < 0 ? 0 : nc * D * H * W + at;
    }
#endif
  }
}

// Channels last (ai.polykit MaxPoolNHWC / AveragePoolNHWC, 2-D: D = OD = KD = 1): X is
// (NB, H, W, C), Y (NB, OH, OW, C); one thread per output element, channels fastest so a warp
// reads neighbouring channels. NC is NB * C. grid (ceil(total/256)), block 256. The three NHWC
// kernels store output pixel q's channels at Y + q * LDY and read input pixel p's at X + p * LDX
// (runtime arguments): C, or a channels-last Concat's channel total where Y (or X, a skip
// connection the Concat and the pool both read) is placed in its slice (pool.py; the vector
// kernels need LDY, LDX, Y and X aligned as their 16-byte stores and loads).
extern "C" __global__ void __launch_bounds__(256) pool_window_nhwc(const ELEM* X, ELEM* Y, i64 NC, i64 C,
                                                                   POOL_GEOMETRY, i64 LDY, i64 LDX) {
  const i64 total = NC * OH * OW;
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
    const i64 c = i % C, pix = i / C;
    const i64 nb = pix / (OH * OW), s = pix - nb * OH * OW;
    const i64 oh = s / OW, ow = s - oh * OW;
    st(Y, pix * LDY + c, pool_one(X + nb * H * W * LDX + c, H * W * LDX, W * LDX, LDX, 0, oh, ow, POOL_GEOMETRY_ARGS).v);
  }
}

// The same for 16-bit storage with C % 8 == 0 and every size < 2^31: one thread per output
// pixel and 8 channels, 16-byte loads and stores, 32-bit index math (the window rules are
// pool_one's, applied per channel). K = 3: the 3x3 window unrolled (its 9 loads in flight at
// once), K = 0: any window. grid (ceil(NB*OH*OW*C/8 / 256)), block 256. Modules of other storage
// types compile it empty (the enqueue takes it for half / bfloat16 only).
template <class T> struct Is16 { enum { value = 0 }; };
template <> struct Is16<half_t> { enum { value = 1 }; };
template <> struct Is16<bf16_t> { enum { value = 1 }; };
union Pack8 {
  uint4 raw;
  unsigned short h[8];
};

template <class T, int K>
__device__ __forceinline__ void pool_nhwc_v8(const T* X, T* Y, int NB, int C, POOL_GEOMETRY, i64 LDY, i64 LDX) {
  if constexpr (Is16<T>::value) {
    const int groups = C / 8, total = NB * (int)OH * (int)OW * groups;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
      const int g = i % groups, pix = i / groups;
      const int ohw = (int)(OH * OW), nb = pix / ohw, s = pix - nb * ohw;
      const int oh = s / (int)OW, ow = s - oh * (int)OW;
      const T* x = X + ((i64)nb * H * W) * LDX + g * 8;
      float acc[8];
      int inside = 0, padded = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[j] = POOL_MODE == 0 ? Lim<float>::lo() : 0.f;
#pragma unroll
      for (int kh = 0; kh < (K ? K : (int)KH); ++kh) {
        const int ih = oh * (int)SH - (int)PH + kh * (int)DH;
#pragma unroll
        for (int kw = 0; kw < (K ? K : (int)KW); ++kw) {
          const int iw = ow * (int)SW - (int)PW + kw * (int)DW;
          padded += (ih >= -(int)PH && ih < (int)(H + EH) && iw >= -(int)PW && iw < (int)(W + EW)) ? 1 : 0;
          if (ih < 0 || ih >= (int)H || iw < 0 || iw >= (int)W) continue;
          Pack8 v;
          v.raw = *(const uint4*)(x + ((i64)ih * W + iw) * LDX);
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            T e;
            e.x = v.h[j];
            const float f = (float)ld(&e, 0);
#if POOL_MODE == 0
            if (inside == 0 || f > acc[j]) acc[j] = f;  // pool_one: the first element, then strictly larger ones
#else
            acc[j] += f;
#endif
          }
          ++inside;
        }
      }
      Pack8 out;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
#if POOL_MODE == 0
        const float r = acc[j];
#else
        const int n = count_include_pad ? padded : inside;
        const float r = n > 0 ? acc[j] / (float)n : 0.f;
#endif
        T e;
        st(&e, 0, r);
        out.h[j] = e.x;
      }
      *(uint4*)(Y + (i64)pix * LDY + g * 8) = out.raw;
    }
  }
}

extern "C" __global__ void __launch_bounds__(256) pool_window_nhwc_v8(const ELEM* X, ELEM* Y, int NB, int C,
                                                                      POOL_GEOMETRY, i64 LDY, i64 LDX) {
  if (KH == 3 && KW == 3) pool_nhwc_v8<ELEM, 3>(X, Y, NB, C, POOL_GEOMETRY_ARGS, LDY, LDX);
  else pool_nhwc_v8<ELEM, 0>(X, Y, NB, C, POOL_GEOMETRY_ARGS, LDY, LDX);
}

// 8-bit MaxPool channels last (int8 / uint8 between INT8 layers: max commutes with the
// quantization) with C % 16 == 0 and every size < 2^31: one thread per output pixel and 16
// channels, 16-byte loads and stores, the byte-wise max of four 32-bit words (__vmaxs4 /
// __vmaxu4). A window with no element inside the input gives the type's lowest value (pool_one's
// -inf, saturated). K as for pool_nhwc_v8. grid (ceil(NB*OH*OW*C/16 / 256)), block 256. Other
// modules compile it empty.
template <class T> struct Is8 { enum { value = 0 }; };
template <> struct Is8<i8> { enum { value = 1 }; };
template <> struct Is8<u8> { enum { value = 2 }; };

#ifndef POOL_E4M3
#define POOL_E4M3 0  // 1 (ELEM u8): the bytes are float8_e4m3fn values (an FP8 plan's pool between FP8 layers)
#endif
// float8_e4m3fn bytes as keys that order like their values when compared as unsigned bytes (sign-magnitude
// to offset: a positive value's byte gains the top bit, a negative one's is inverted), four at a time; both
// NaNs (0x7f, 0xff) first become 0x7f, whose key 0xff is above every number's: NaN propagates, as
// numpy's maximum (the reference) has it. -448 (0xfe) has key 0x01, the least a number has: a window with
// nothing inside the input gives it (the reference pads with the type's lowest value, finfo's -448).
__device__ __forceinline__ u32 e4m3_keys(u32 v) {
  const u32 nan = __vcmpeq4(v | 0x80808080u, 0xffffffffu);
  v = (v & ~nan) | (nan & 0x7f7f7f7fu);
  return v ^ ((__vcmpgeu4(v, 0x80808080u) & 0x7f7f7f7fu) | 0x80808080u);
}
__device__ __forceinline__ u32 e4m3_values(u32 k) {  // e4m3_keys' inverse (NaN: 0x7f)
  return k ^ ((~__vcmpgeu4(k, 0x80808080u) & 0x7f7f7f7fu) | 0x80808080u);
}

template <class T, int K>
__device__ __forceinline__ void pool_nhwc_v16(const T* X, T* Y, int NB, int C, POOL_GEOMETRY, i64 LDY, i64 LDX) {
#if POOL_MODE == 0
  if constexpr (Is8<T>::value != 0) {
    constexpr bool is_signed = Is8<T>::value == 1 && !POOL_E4M3;
    const u32 lo = POOL_E4M3 ? 0x01010101u : is_signed ? 0x80808080u : 0u;
    const int groups = C / 16, total = NB * (int)OH * (int)OW * groups;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
      const int g = i % groups, pix = i / groups;
      const int ohw = (int)(OH * OW), nb = pix / ohw, s = pix - nb * ohw;
      const int oh = s / (int)OW, ow = s - oh * (int)OW;
      const T* x = X + ((i64)nb * H * W) * LDX + g * 16;
      uint4 acc = make_uint4(lo, lo, lo, lo);
#pragma unroll
      for (int kh = 0; kh < (K ? K : (int)KH); ++kh) {
        const int ih = oh * (int)SH - (int)PH + kh * (int)DH;
#pragma unroll
        for (int kw = 0; kw < (K ? K : (int)KW); ++kw) {
          const int iw = ow * (int)SW - (int)PW + kw * (int)DW;
          if (ih < 0 || ih >= (int)H || iw < 0 || iw >= (int)W) continue;
          uint4 v = *(const uint4*)(x + ((i64)ih * W + iw) * LDX);
          if (POOL_E4M3) v = make_uint4(e4m3_keys(v.x), e4m3_keys(v.y), e4m3_keys(v.z), e4m3_keys(v.w));
          if (is_signed) {
            acc = make_uint4(__vmaxs4(acc.x, v.x), __vmaxs4(acc.y, v.y), __vmaxs4(acc.z, v.z), __vmaxs4(acc.w, v.w));
          } else {
            acc = make_uint4(__vmaxu4(acc.x, v.x), __vmaxu4(acc.y, v.y), __vmaxu4(acc.z, v.z), __vmaxu4(acc.w, v.w));
          }
        }
      }
      if (POOL_E4M3) acc = make_uint4(e4m3_values(acc.x), e4m3_values(acc.y), e4m3_values(acc.z), e4m3_values(acc.w));
      *(uint4*)(Y + (i64)pix * LDY + g * 16) = acc;
    }
  }
#endif
}

// float8_e4m3fn MaxPool channels last, any C (pool_nhwc_v16's keys, one byte a thread): the unaligned / C % 16
// != 0 form of an FP8 plan's pool; pool_window_nhwc's indexing. Other modules compile it empty.
extern "C" __global__ void __launch_bounds__(256) pool_window_nhwc_e4m3(const u8* X, u8* Y, i64 NC, i64 C,
                                                                        POOL_GEOMETRY, i64 LDY, i64 LDX) {
#if POOL_MODE == 0 && POOL_E4M3
  const i64 total = NC * OH * OW;
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
    const i64 c = i % C, pix = i / C;
    const i64 nb = pix / (OH * OW), s = pix - nb * OH * OW;
    const i64 oh = s / OW, ow = s - oh * OW;
    const u8* x = X + nb * H * W * LDX + c;
    u32 best = 0x01u;  // -448's key: a window with nothing inside
    for (i64 kh = 0; kh < KH; ++kh) {
      const i64 ih = oh * SH - PH + kh * DH;
      for (i64 kw = 0; kw < KW; ++kw) {
        const i64 iw = ow * SW - PW + kw * DW;
        if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
        const u32 k = e4m3_keys(x[(ih * W + iw) * LDX]) & 0xffu;
        best = k > best ? k : best;
      }
    }
    Y[pix * LDY + c] = (u8)e4m3_values(best);
  }
#endif
}

extern "C" __global__ void __launch_bounds__(256) pool_window_nhwc_v16(const ELEM* X, ELEM* Y, int NB, int C,
                                                                       POOL_GEOMETRY, i64 LDY, i64 LDX) {
  if (KH == 3 && KW == 3) pool_nhwc_v16<ELEM, 3>(X, Y, NB, C, POOL_GEOMETRY_ARGS, LDY, LDX);
  else pool_nhwc_v16<ELEM, 0>(X, Y, NB, C, POOL_GEOMETRY_ARGS, LDY, LDX);
}

// Global pooling: one block per (n, c) row of S = D*H*W elements; a fixed-shape tree
// reduction in shared memory (deterministic). grid (NC), block 256.
extern "C" __global__ void __launch_bounds__(256) pool_global(const ELEM* X, ELEM* Y, i64 NC, i64 S, float p) {
  __shared__ float red[256];
  const ELEM* x = X + (i64)blockIdx.x * S;
#if POOL_MODE == 0
  float acc = Lim<float>::lo();
  bool nan = false;
  for (i64 j = threadIdx.x; j < S; j += blockDim.x) {
    const float v = (float)ld(x, j);
    nan |= v != v;
    acc = fmaxf(acc, v);
  }
  if (nan) acc = __int_as_float(0x7fc00000);
#else
  float acc = 0.f;
  for (i64 j = threadIdx.x; j < S; j += blockDim.x) {
    const float v = (float)ld(x, j);
#if POOL_MODE == 1
    acc += v;
#else
    acc += powf(fabsf(v), p);
#endif
  }
#endif
  red[threadIdx.x] = acc;
  __syncthreads();
  for (int step = 128; step > 0; step >>= 1) {
    if (threadIdx.x < step) {
      const float a = red[threadIdx.x], b = red[threadIdx.x + step];
#if POOL_MODE == 0
      red[threadIdx.x] = (a != a || b != b) ? __int_as_float(0x7fc00000) : fmaxf(a, b);
#else
      red[threadIdx.x] = a + b;
#endif
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const float r = red[0];
#if POOL_MODE == 0
    st(Y, blockIdx.x, r);
#elif POOL_MODE == 1
    st(Y, blockIdx.x, r / (float)S);
#else
    st(Y, blockIdx.x, powf(r, 1.f / p));
#endif
  }
}

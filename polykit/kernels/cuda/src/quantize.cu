// QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear (per tensor, per axis, blocked), and
// ai.polykit QuantizeNHWC (quantize_nhwc: an --int8 plan's image input, quantized to NHWC, padded;
// quantize_nhwc_s2d: a space-to-depth stem's image, zero-padded and space-to-depth'd on the way).
//
// Element types are runtime codes (QK_* below), not template arguments: one entry point per
// op serves every (x, scale, zero point, output) type combination; the per-element type
// switch is uniform across a warp. Values travel as double, which holds every supported
// type exactly, so the arithmetic below reproduces the reference's rounding:
//   quantize:   q = rint(x / s) in the `precision` type (fp16 division = fp32 division
//               rounded to fp16, like numpy), then saturate(q + zp) to the output type.
//   dequantize: y = (x - zp) * s in fp64, rounded once to the output type.
//   float8 / float4 outputs (lowp.cuh): y = x / s in the precision type, no rounding to an
//               integer (float4: + zp), then encoded (saturating when `saturate` is set; float4
//               always); a float8 zero point only names the output type. 4/2-bit integer
//               outputs saturate to their range like the 8/16-bit ones; NaN gives 0 (polykit's
//               float -> integer rule, reference cast.py), so no NaN reaches a conversion.
// Parameter index of element i of x viewed as [outer, D, inner] around `axis`:
//   mode 0 per tensor: 0; mode 1 per axis: d; mode 2 blocked: (o * Dp + d / block) * inner + in.
// Geometry: quantize/dequantize one thread per element (quantize_f32_8bit: four), grid-stride,
// blockDim.x = 256; quantize_nhwc(_image) 8 pixels a thread, quantize_nhwc_s2d one output pixel a thread,
// grid (pixel blocks, images).
// DynamicQuantizeLinear: dq_minmax (grid G, 256 threads) writes per-block (min, max) of x
// (as fp32) to a workspace, dq_params (one block) folds them into the uint8 scale / zero
// point outputs as ONNX defines them, then quantize_linear runs with those device scalars.
#include "blockreduce.cuh"
#include "lowp.cuh"
// (clamp_nan, markstein_quotient, e4m3x2_cvt, E4M3_CVT)
#include "quotient.cuh"

enum { QK_F32, QK_F16, QK_F64, QK_I8, QK_U8, QK_I16, QK_U16, QK_I32, QK_I64,
       QK_F8E4M3FN, QK_F8E4M3FNUZ, QK_F8E5M2, QK_F8E5M2FNUZ, QK_F4E2M1, QK_I4, QK_U4, QK_I2, QK_U2 };

__device__ __forceinline__ double qk_load(const void* p, int code, i64 i) {
  switch (code) {
    case QK_F32: return (double)((const float*)p)[i];
    case QK_F16: return (double)h2f(((const half_t*)p)[i]);
    case QK_F64: return ((const double*)p)[i];
    case QK_I8: return (double)((const i8*)p)[i];
    case QK_U8: return (double)((const u8*)p)[i];
    case QK_I16: return (double)((const i16*)p)[i];
    case QK_U16: return (double)((const u16*)p)[i];
    case QK_I32: return (double)((const i32*)p)[i];
    case QK_F8E4M3FN: return (double)ld((const f8e4m3fn_t*)p, i);
    case QK_F8E4M3FNUZ: return (double)ld((const f8e4m3fnuz_t*)p, i);
    case QK_F8E5M2: return (double)ld((const f8e5m2_t*)p, i);
    case QK_F8E5M2FNUZ: return (double)ld((const f8e5m2fnuz_t*)p, i);
    case QK_F4E2M1: return (double)ld((const f4e2m1_t*)p, i);
    case QK_I4: return (double)ld((const i4_t*)p, i);
    case QK_U4: return (double)ld((const u4_t*)p, i);
    case QK_I2: return (double)ld((const i2_t*)p, i);
    case QK_U2: return (double)ld((const u2_t*)p, i);
    default: return (double)((const i64*)p)[i];
  }
}

// store an integral, already saturated value
__device__ __forceinline__ void qk_store_int(void* p, int code, i64 i, double v) {
  switch (code) {
    case QK_I8: ((i8*)p)[i] = (i8)v; break;
    case QK_U8: ((u8*)p)[i] = (u8)v; break;
    case QK_I16: ((i16*)p)[i] = (i16)v; break;
    case QK_I4: case QK_U4: ((u8*)p)[i] = (u8)((i32)v & 0xf); break;
    case QK_I2: case QK_U2: ((u8*)p)[i] = (u8)((i32)v & 0x3); break;
    default: ((u16*)p)[i] = (u16)v; break;
  }
}

__device__ __forceinline__ void qk_store_float(void* p, int code, i64 i, double v) {
  switch (code) {
    case QK_F32: ((float*)p)[i] = (float)v; break;
    case QK_F16: ((half_t*)p)[i] = d2h(v); break;
    default: ((double*)p)[i] = v; break;
  }
}

__device__ __forceinline__ void qk_range(int code, double& lo, double& hi) {
  switch (code) {
    case QK_I8: lo = -128; hi = 127; break;
    case QK_U8: lo = 0; hi = 255; break;
    case QK_I16: lo = -32768; hi = 32767; break;
    case QK_I4: lo = -8; hi = 7; break;
    case QK_U4: lo = 0; hi = 15; break;
    case QK_I2: lo = -2; hi = 1; break;
    case QK_U2: lo = 0; hi = 3; break;
    default: lo = 0; hi = 65535; break;
  }
}

struct QkParam { i64 mode, inner, D, block, Dp; };

__device__ __forceinline__ i64 qk_index(const QkParam& g, i64 i) {
  if (g.mode == 0) return 0;
  const i64 q = i / g.inner, in = i - q * g.inner, o = q / g.D, d = q - o * g.D;
  return g.mode == 1 ? d : (o * g.Dp + d / g.block) * g.inner + in;
}

// x / s rounded to an integer, the division done in the precision type (0 f32, 1 f16, 2 f64)
__device__ __forceinline__ double qk_divide_round(double x, double s, int precision) {
  if (precision == 2) return rint(x / s);
  if (precision == 1) {
    const float xh = h2f(d2h(x)), sh = h2f(d2h(s));
    return (double)rintf(h2f(f2h(xh / sh)));
  }
  return (double)rintf((float)x / (float)s);
}

// x / s in the precision type, unrounded (float8 / float4 outputs)
__device__ __forceinline__ double qk_divide(double x, double s, int precision) {
  if (precision == 2) return x / s;
  if (precision == 1) return (double)h2f(f2h(h2f(d2h(x)) / h2f(d2h(s))));
  return (double)((float)x / (float)s);
}

__device__ __forceinline__ u8 qk_encode_float(int code, float v, bool sat) {
  switch (code) {
    case QK_F8E4M3FN: return LowpFmt<f8e4m3fn_t>::F::encode(v, sat);
    case QK_F8E4M3FNUZ: return LowpFmt<f8e4m3fnuz_t>::F::encode(v, sat);
    case QK_F8E5M2: return LowpFmt<f8e5m2_t>::F::encode(v, sat);
    case QK_F8E5M2FNUZ: return LowpFmt<f8e5m2fnuz_t>::F::encode(v, sat);
    default: return LowpFmt<f4e2m1_t>::F::encode(v, true);
  }
}

#define QK_PARAM_ARGS(p) i64 p##_mode, i64 p##_inner, i64 p##_D, i64 p##_block, i64 p##_Dp
#define QK_PARAM(p) const QkParam p = {p##_mode, p##_inner, p##_D, p##_block, p##_Dp};

extern "C" __global__ void quantize_linear(const void* x, i64 xc, const void* s, i64 sc, const void* z, i64 zc,
                                           void* y, i64 yc, i64 n, i64 precision, QK_PARAM_ARGS(ps),
                                           QK_PARAM_ARGS(pz), i64 saturate) {
  QK_PARAM(ps) QK_PARAM(pz)
  if (yc >= QK_F8E4M3FN && yc <= QK_F4E2M1) {
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
      double v = qk_divide(qk_load(x, (int)xc, i), qk_load(s, (int)sc, qk_index(ps, i)), (int)precision);
      if (z && yc == QK_F4E2M1) v += qk_load(z, (int)zc, qk_index(pz, i));
      ((u8*)y)[i] = qk_encode_float((int)yc, (float)v, saturate != 0);
    }
    return;
  }
  double lo, hi;
  qk_range((int)yc, lo, hi);
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
    double q = qk_divide_round(qk_load(x, (int)xc, i), qk_load(s, (int)sc, qk_index(ps, i)), (int)precision);
    if (z) q += qk_load(z, (int)zc, qk_index(pz, i));
    qk_store_int(y, (int)yc, i, q != q ? 0.0 : (q < lo ? lo : (q > hi ? hi : q)));
  }
}

// The common case on its own path (a calibrated model's image input): float32 x, one float32 scale,
// an int8 / uint8 output (mode 0 / 1) with an optional zero point of its type, or a float8_e4m3fn one
// (mode 2, QuantizeNHWC only: its zero point 0). Q8 holds them; Q8::byte is quantize_linear's
// arithmetic: rintf of the IEEE float32 quotient, + zp, saturated; e4m3: the quotient rounded to
// nearest even and saturated to +-448 (lowp.cuh's encode, as qk_encode_float with saturate 1). The quotient
// without the division where the scale allows (rcp_ok: quotient.cuh's markstein_quotient of x clamped to
// +-1024 sc, past which every int8 / uint8 result saturates alike and every e4m3 one too: the bits of
// __fdiv_rn, ~5 instructions for its ~10 and slow-path test), and two e4m3 bytes by one conversion on sm_89+
// (pair: e4m3_quantize.cuh's rule). A NaN x: 0 as before for the integers; e4m3's NaN byte 0x7f.
struct Q8 {
  float sc, rsc, lim, zp, lo, hi;
  bool has_z, f8, rcp_ok;
  __device__ __forceinline__ Q8(const float* s, const void* z, i64 mode)
      : sc(s[0]), rsc(__frcp_rn(s[0])), lim(s[0] * 1024.f),
        zp(!z || mode == 2 ? 0.f : mode ? (float)((const u8*)z)[0] : (float)((const i8*)z)[0]),
        lo(mode == 1 ? 0.f : -128.f), hi(mode == 1 ? 255.f : 127.f), has_z(z != nullptr && mode != 2),
        f8(mode == 2), rcp_ok(s[0] >= 0x1p-90f && s[0] <= 0x1p90f) {}
  // RN(x / sc), or for |x| > 1024 sc a quotient that saturates alike (NaN kept)
  __device__ __forceinline__ float quotient(float x) const {
    return rcp_ok ? markstein_quotient(clamp_nan(x, lim), sc, rsc) : __fdiv_rn(x, sc);
  }
  __device__ __forceinline__ u32 byte(float x) const {
    if (f8) return (u32)LowpFmt<f8e4m3fn_t>::F::encode(quotient(x), true);
    float q = rintf(quotient(x));
    if (has_z) q += zp;  // rounds only past 2^24, where it saturates either way
    q = q != q ? 0.f : (q < lo ? lo : (q > hi ? hi : q));  // NaN: 0 as there
    return (u32)(u8)(int)q;  // the byte of q (two's complement for int8)
  }
  // byte(x0) | byte(x1) << 8: e4m3 by the hardware's pair conversion where there is one
  __device__ __forceinline__ u32 pair(float x0, float x1) const {
#if E4M3_CVT
    if (f8) return e4m3x2_cvt(quotient(x0), quotient(x1));
#endif
    return byte(x0) | byte(x1) << 8;
  }
  __device__ __forceinline__ u32 zero_byte() const { return (u32)(u8)(int)zp; }
};

// n % 4 == 0, x 16- and y 4-byte aligned: four elements a thread, one 16-byte load, one 4-byte store
extern "C" __global__ void quantize_f32_8bit(const float4* x, const float* s, const void* z, u32* y, i64 n4,
                                            i64 u8out) {
  const Q8 q(s, z, u8out);
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n4; i += (i64)gridDim.x * blockDim.x) {
    const float4 v = x[i];
    y[i] = q.byte(v.x) | q.byte(v.y) << 8 | q.byte(v.z) << 16 | q.byte(v.w) << 24;
  }
}

// ai.polykit QuantizeNHWC: x [NB, C, HW] float32 -> y [NB, HW, CP] (CP >= C; channels C.. the zero
// point; e4m3: 0), Q8's arithmetic. A thread owns NHWC_PIX pixels NHWC_THREADS apart (images in y of the grid,
// so no index division): a warp's load of a channel is 128 consecutive bytes, and a thread issues all
// its loads of a word's (4 channels') pixels before the first division waits on one. Pixel bytes go
// out 16 at a time (vec: CP % 16 == 0 and y 16-byte aligned; a warp's store is 512 consecutive bytes),
// the words past C the zero point's; else byte by byte. quantize_nhwc takes any C, 4 pixels at a time
// through every 16-channel group; quantize_nhwc_image an image (C <= 3, vec): one word of data a
// pixel, so the 8 pixels' loads (24) are in flight at once, at fixed offsets from one pointer.
#define NHWC_THREADS 256  // blockDim.x (quantize.py's BLOCK)
#define NHWC_PIX 8        // quantize.py's NHWC_PIX
__device__ __forceinline__ void nhwc_pixels(const Q8& q, const float* xi, u8* yi, int p0, int hw, int C, int CP,
                                            int vec) {
  const u32 zw = q.zero_byte() * 0x01010101u;
  for (int c0 = 0; c0 < CP; c0 += 16) {
    u32 w[4][4];
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      const int cg = c0 + 4 * g;
      float v[4][4];
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int p = p0 + k * NHWC_THREADS;
          v[j][k] = cg + j < C && p < hw ? xi[(i64)(cg + j) * hw + p] : 0.f;
        }
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        w[g][k] = zw;
        if (cg >= C) continue;
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (cg + j < C) w[g][k] = (w[g][k] & ~(0xffu << 8 * j)) | q.byte(v[j][k]) << 8 * j;
      }
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int p = p0 + k * NHWC_THREADS;
      if (p >= hw) break;
      u8* yp = yi + (i64)p * CP + c0;
      if (vec) {
        *(uint4*)yp = make_uint4(w[0][k], w[1][k], w[2][k], w[3][k]);
        continue;
      }
      for (int j = 0; j < 16 && c0 + j < CP; ++j) yp[j] = (u8)(w[j / 4][k] >> 8 * (j % 4));
    }
  }
}
__device__ __forceinline__ void nhwc_image_pixels(const Q8& q, const float* xi, u8* yi, int p0, int hw, int C,
                                                  int CP) {
  const u32 zw = q.zero_byte() * 0x01010101u;
  const float* xp = xi + p0;
  float v[3][NHWC_PIX];
#pragma unroll
  for (int j = 0; j < 3; ++j)
#pragma unroll
    for (int k = 0; k < NHWC_PIX; ++k)
      v[j][k] = j < C && p0 + k * NHWC_THREADS < hw ? xp[(i64)j * hw + k * NHWC_THREADS] : 0.f;
#pragma unroll
  for (int k = 0; k < NHWC_PIX; ++k) {
    const int p = p0 + k * NHWC_THREADS;
    if (p >= hw) break;
    u32 w = zw;
#pragma unroll
    for (int j = 0; j < 3; ++j)
      if (j < C) w = (w & ~(0xffu << 8 * j)) | q.byte(v[j][k]) << 8 * j;
    uint4* yp = (uint4*)(yi + (i64)p * CP);
    yp[0] = make_uint4(w, zw, zw, zw);
    for (int c0 = 16; c0 < CP; c0 += 16) *++yp = make_uint4(zw, zw, zw, zw);
  }
}
// (4 blocks an SM: 64 registers, no spill; with fewer registers the division's slow path spills)
extern "C" __global__ void __launch_bounds__(NHWC_THREADS, 4)
    quantize_nhwc(const float* x, const float* s, const void* z, u8* y, int nb, int hw, int C, int CP, int vec,
                  i64 mode) {
  const Q8 q(s, z, mode);
  const int step = gridDim.x * NHWC_THREADS * NHWC_PIX;
  for (int img = blockIdx.y; img < nb; img += gridDim.y)
    for (int p0 = blockIdx.x * NHWC_THREADS * NHWC_PIX + threadIdx.x; p0 < hw; p0 += step)
#pragma unroll 1
      for (int h = 0; h < NHWC_PIX; h += 4)
        nhwc_pixels(q, x + (i64)img * C * hw, y + (i64)img * hw * CP, p0 + h * NHWC_THREADS, hw, C, CP, vec);
}
extern "C" __global__ void __launch_bounds__(NHWC_THREADS, 4)
    quantize_nhwc_image(const float* x, const float* s, const void* z, u8* y, int nb, int hw, int C, int CP,
                        i64 mode) {
  const Q8 q(s, z, mode);
  const int step = gridDim.x * NHWC_THREADS * NHWC_PIX;
  for (int img = blockIdx.y; img < nb; img += gridDim.y)
    for (int p0 = blockIdx.x * NHWC_THREADS * NHWC_PIX + threadIdx.x; p0 < hw; p0 += step)
      nhwc_image_pixels(q, x + (i64)img * C * hw, y + (i64)img * hw * CP, p0, hw, C, CP);
}

// ai.polykit QuantizeNHWC with `block` s > 1 or `pads` (a space-to-depth stem's image, fuse_quantize_nhwc):
// y [NB, OH, OW, CP] (OH = (H + top + bottom) / s, OW likewise) holds at channel (bh * s + bw) * C + c of
// pixel (oh, ow) Q(x[c, oh * s + bh - top, ow * s + bw - left]), Q(0) where that falls in the padding (Q8's
// arithmetic on 0.f: the bytes of Pad -> SpaceToDepth -> QuantizeLinear exactly), channels C * s * s.. the
// zero point's byte (e4m3: 0) as quantize_nhwc pads. One output pixel a thread, grid-stride over a plane's
// OH * OW pixels (images in y of the grid); adjacent threads own adjacent output columns, so a warp's stores are
// 32 * CP consecutive bytes and its loads of one (bh, bw, c) 32 floats s apart (the other bw's load reads the
// rest of those sectors, from L1). A 16-channel group's loads are all issued before its first division (its
// channels' (bh, bw, c) stepped one by one, no index division), then its bytes go out as one 16-byte store
// (vec: CP % 16 == 0, y 16-byte aligned), else byte by byte. Measured (H100, 2026-12-07, ResNet-50 bs32: 224 x
// 224 x 3 float32 in, 115 x 115 x 16 out, ~26 MB): 44 us when each (bh, bw)'s C loads waited on the ones before
// (runtime loops); the bytes want ~10 us.
extern "C" __global__ void __launch_bounds__(NHWC_THREADS)
    quantize_nhwc_s2d(const float* x, const float* s, const void* z, u8* y, int nb, int C, int H, int W, int OH,
                      int OW, int S, int top, int left, int CP, int vec, i64 mode) {
  const Q8 q(s, z, mode);
  const int ohw = OH * OW, hw = H * W, K = C * S * S;  // K: the data channels
  for (int img = blockIdx.y; img < nb; img += gridDim.y) {
    const float* xi = x + (i64)img * C * hw;
    for (int p = blockIdx.x * NHWC_THREADS + threadIdx.x; p < ohw; p += gridDim.x * NHWC_THREADS) {
      const int oh = p / OW, ow = p - oh * OW;
      u8* yp = y + ((i64)img * ohw + p) * CP;
      int c = 0, bw = 0, bh = 0;  // channel c0 + j's place in the block: (bh * S + bw) * C + c
      for (int c0 = 0; c0 < CP; c0 += 16) {
        float v[16];
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          const int iy = oh * S + bh - top, ix = ow * S + bw - left;
          const bool in = c0 + j < K && iy >= 0 && iy < H && ix >= 0 && ix < W;
          v[j] = in ? xi[(i64)c * hw + (i64)iy * W + ix] : 0.f;
          if (++c == C) {
            c = 0;
            if (++bw == S) { bw = 0; ++bh; }
          }
        }
        u32 w[4];  // (a channel past the data holds 0.f: Q(0) is the zero point's byte, e4m3's 0)
#pragma unroll
        for (int k = 0; k < 4; ++k) w[k] = q.pair(v[4 * k], v[4 * k + 1]) | q.pair(v[4 * k + 2], v[4 * k + 3]) << 16;
        if (vec) {
          *(uint4*)(yp + c0) = make_uint4(w[0], w[1], w[2], w[3]);
        } else {
          for (int j = 0; j < 16 && c0 + j < CP; ++j) yp[c0 + j] = (u8)(w[j / 4] >> 8 * (j % 4));
        }
      }
    }
  }
}

extern "C" __global__ void dequantize_linear(const void* x, i64 xc, const void* s, i64 sc, const void* z, i64 zc,
                                             void* y, i64 yc, i64 n, QK_PARAM_ARGS(ps), QK_PARAM_ARGS(pz)) {
  QK_PARAM(ps) QK_PARAM(pz)
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
    double v = qk_load(x, (int)xc, i);
    if (z) v -= qk_load(z, (int)zc, qk_index(pz, i));
    qk_store_float(y, (int)yc, i, v * qk_load(s, (int)sc, qk_index(ps, i)));
  }
}

// per-block min / max of x (as fp32) -> partial[2 * block], partial[2 * block + 1]
extern "C" __global__ void dq_minmax(const void* x, i64 xc, i64 n, float* partial) {
  __shared__ float smem[32];
  const float inf = Lim<float>::hi();
  float lo = inf, hi = -inf;
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
    const float v = (float)qk_load(x, (int)xc, i);
    lo = OpMin()(lo, v);
    hi = OpMax()(hi, v);
  }
  lo = block_reduce(lo, OpMin(), inf, smem);
  hi = block_reduce(hi, OpMax(), -inf, smem);
  if (threadIdx.x == 0) { partial[2 * blockIdx.x] = lo; partial[2 * blockIdx.x + 1] = hi; }
}

// scale = (max(hi, 0) - min(lo, 0)) / 255 (1 / 255 when that range is empty), zp = rint(clip(-lo / scale))
extern "C" __global__ void dq_params(const float* partial, i64 blocks, float* scale, u8* zero_point) {
  __shared__ float smem[32];
  const float inf = Lim<float>::hi();
  float lo = inf, hi = -inf;
  for (i64 b = threadIdx.x; b < blocks; b += blockDim.x) {
    lo = OpMin()(lo, partial[2 * b]);
    hi = OpMax()(hi, partial[2 * b + 1]);
  }
  lo = block_reduce(lo, OpMin(), inf, smem);
  hi = block_reduce(hi, OpMax(), -inf, smem);
  if (threadIdx.x == 0) {
    hi = hi > 0.0f ? hi : 0.0f;
    lo = lo < 0.0f ? lo : 0.0f;
    const float s = (hi == lo ? 1.0f : hi - lo) / 255.0f;
    float zp = 0.0f - lo / s;  // NaN when x holds both infinities: 0, as the reference's rule says
    zp = zp != zp ? 0.0f : (zp < 0.0f ? 0.0f : (zp > 255.0f ? 255.0f : zp));
    *scale = s;
    *zero_point = (u8)rintf(zp);
  }
}

// RoiAlign and NonMaxSuppression (float32 boxes, scores and features).
//
// roi_align: Y (R, C, oH, oW) from X (N, C, H, W), rois (R, 4: x1, y1, x2, y2), batch_indices (R, int64);
//   one thread per output element walks its bin's gH x gW samples (onnxruntime's positions, weights
//   and out-of-range rule; avg = mean of the bilinear values, max = max of the weighted corners).
//   Positions are rounded step by step (no FMA contraction) so corner indices match the reference.
// nms_select: grid (B*C), block 256: one block per (batch, class). Threads rank the candidates
//   (score > score_threshold when given) by score, ties by lower index (O(n^2) compares: fine for
//   the few thousand boxes a class holds), then walk them in order: all threads test the candidate
//   against the kept boxes (IoU > iou_threshold suppresses, float32 math as onnxruntime's), and it
//   is kept unless one hits, until max_output_boxes_per_class are kept. Kept indices go to
//   sel (B*C, n) and their count to count (B*C).
// nms_emit: grid-stride over (batch, class): rows (b, c, box) in (batch, class, kept order), each
//   class's first row after the counts before it; rows is the space the plan reserved (its bound).
//   The last (batch, class) writes the row count to *total (null: not asked), which the host reads
//   back after the layer (polykit.runtime.output_alloc).
#include "dtypes.cuh"

extern "C" __global__ void __launch_bounds__(256) roi_align(
    const float* __restrict__ X, const float* __restrict__ rois, const i64* __restrict__ batch, float* __restrict__ Y,
    i64 R, i64 C, i64 H, i64 W, i64 oH, i64 oW, i64 ratio, float scale, i64 half_pixel, i64 max_mode) {
  const i64 total = R * C * oH * oW;
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
    const i64 pw = i % oW, ph = (i / oW) % oH, c = (i / (oW * oH)) % C, r = i / (oW * oH * C);
    const float* box = rois + r * 4;
    const float shift = half_pixel ? 0.5f : 0.f;
    const float x0 = __fsub_rn(__fmul_rn(box[0], scale), shift), y0 = __fsub_rn(__fmul_rn(box[1], scale), shift);
    const float x1 = __fsub_rn(__fmul_rn(box[2], scale), shift), y1 = __fsub_rn(__fmul_rn(box[3], scale), shift);
    float rw = __fsub_rn(x1, x0), rh = __fsub_rn(y1, y0);
    if (!half_pixel) rw = fmaxf(rw, 1.f), rh = fmaxf(rh, 1.f);
    const float bh = __fdiv_rn(rh, (float)oH), bw = __fdiv_rn(rw, (float)oW);
    const i64 gh = ratio > 0 ? ratio : (i64)ceilf(__fdiv_rn(rh, (float)oH));
    const i64 gw = ratio > 0 ? ratio : (i64)ceilf(__fdiv_rn(rw, (float)oW));
    const float* img = X + (batch[r] * C + c) * H * W;
    float acc = 0.f;
    bool first = true;
    for (i64 iy = 0; iy < gh; ++iy) {
      // y0 + ph * bh + (iy + 0.5) * bh / gh, in that order
      float y = __fadd_rn(__fadd_rn(y0, __fmul_rn((float)ph, bh)), __fdiv_rn(__fmul_rn((float)iy + 0.5f, bh), (float)gh));
      for (i64 ix = 0; ix < gw; ++ix) {
        float x = __fadd_rn(__fadd_rn(x0, __fmul_rn((float)pw, bw)), __fdiv_rn(__fmul_rn((float)ix + 0.5f, bw), (float)gw));
        float v = 0.f;
        if (!(y < -1.f || y > (float)H || x < -1.f || x > (float)W)) {
          float yy = fmaxf(y, 0.f), xx = fmaxf(x, 0.f);
          i64 yl = (i64)yy, xl = (i64)xx, yh, xh;
          if (yl >= H - 1) yh = yl = H - 1, yy = (float)yl; else yh = yl + 1;
          if (xl >= W - 1) xh = xl = W - 1, xx = (float)xl; else xh = xl + 1;
          const float ly = yy - yl, lx = xx - xl, hy = 1.f - ly, hx = 1.f - lx;
          const float t1 = hy * hx * img[yl * W + xl], t2 = hy * lx * img[yl * W + xh];
          const float t3 = ly * hx * img[yh * W + xl], t4 = ly * lx * img[yh * W + xh];
          v = max_mode ? fmaxf(fmaxf(t1, t2), fmaxf(t3, t4)) : t1 + t2 + t3 + t4;
        }
        acc = max_mode ? (first ? v : fmaxf(acc, v)) : acc + v;
        first = false;
      }
    }
    const i64 count = gh * gw > 1 ? gh * gw : 1;
    Y[i] = max_mode ? acc : acc / (float)count;
  }
}

struct Box {
  float y0, x0, y1, x1;
};

__device__ __forceinline__ Box load_box(const float* b, i64 center) {
  Box o;
  if (center) {
    const float hw = b[2] / 2.f, hh = b[3] / 2.f;
    o.x0 = __fsub_rn(b[0], hw), o.x1 = __fadd_rn(b[0], hw), o.y0 = __fsub_rn(b[1], hh), o.y1 = __fadd_rn(b[1], hh);
  } else {
    o.y0 = fminf(b[0], b[2]), o.y1 = fmaxf(b[0], b[2]), o.x0 = fminf(b[1], b[3]), o.x1 = fmaxf(b[1], b[3]);
  }
  return o;
}

__device__ __forceinline__ bool suppresses(const Box& a, const Box& b, float threshold) {
  const float ix0 = fmaxf(a.x0, b.x0), ix1 = fminf(a.x1, b.x1), iy0 = fmaxf(a.y0, b.y0), iy1 = fminf(a.y1, b.y1);
  if (ix1 <= ix0 || iy1 <= iy0) return false;
  const float inter = __fmul_rn(__fsub_rn(ix1, ix0), __fsub_rn(iy1, iy0));
  const float a1 = __fmul_rn(__fsub_rn(a.x1, a.x0), __fsub_rn(a.y1, a.y0));
  const float a2 = __fmul_rn(__fsub_rn(b.x1, b.x0), __fsub_rn(b.y1, b.y0));
  const float uni = __fsub_rn(__fadd_rn(a1, a2), inter);
  if (inter <= 0.f || a1 <= 0.f || a2 <= 0.f || uni <= 0.f) return false;
  return __fdiv_rn(inter, uni) > threshold;
}

extern "C" __global__ void __launch_bounds__(256) nms_select(
    const float* __restrict__ boxes, const float* __restrict__ scores, const i64* __restrict__ max_out_p,
    const float* __restrict__ iou_p, const float* __restrict__ score_p, i32* __restrict__ order, i32* __restrict__ sel,
    i32* __restrict__ count, i64 C, i64 n, i64 center) {
  __shared__ int candidates, kept, hit;
  const i64 p = blockIdx.x, b = p / C;
  const float* s = scores + p * n;
  const float* bx = boxes + b * n * 4;
  i32* ord = order + p * n;
  i32* out = sel + p * n;
  const bool filter = score_p != nullptr;
  const float st = filter ? score_p[0] : 0.f;
  const float iou = iou_p ? iou_p[0] : 0.f;
  i64 max_out = max_out_p ? max_out_p[0] : 0;
  max_out = max_out < 0 ? 0 : (max_out > n ? n : max_out);
  if (threadIdx.x == 0) candidates = 0, kept = 0;
  __syncthreads();
  for (i64 i = threadIdx.x; i < n; i += blockDim.x) {
    const float si = s[i];
    if (filter && !(si > st)) continue;
    int rank = 0;
    for (i64 j = 0; j < n; ++j) {
      const float sj = s[j];
      if ((!filter || sj > st) && (sj > si || (sj == si && j < i))) ++rank;
    }
    ord[rank] = (i32)i;
    atomicAdd(&candidates, 1);
  }
  __syncthreads();
  for (int q = 0; q < candidates && kept < max_out; ++q) {
    const i32 i = ord[q];
    const Box cand = load_box(bx + 4 * (i64)i, center);
    if (threadIdx.x == 0) hit = 0;
    __syncthreads();
    for (int k = threadIdx.x; k < kept; k += blockDim.x)
      if (suppresses(cand, load_box(bx + 4 * (i64)out[k], center), iou)) hit = 1;
    __syncthreads();
    if (threadIdx.x == 0 && !hit) out[kept] = i, kept = kept + 1;
    __syncthreads();
  }
  if (threadIdx.x == 0) count[p] = kept;
}

extern "C" __global__ void __launch_bounds__(256) nms_emit(const i32* __restrict__ sel, const i32* __restrict__ count,
                                                           i64* __restrict__ Y, i64 BC, i64 C, i64 n, i64 rows,
                                                           i64* __restrict__ total) {
  for (i64 p = blockIdx.x * (i64)blockDim.x + threadIdx.x; p < BC; p += (i64)gridDim.x * blockDim.x) {
    i64 start = 0;
    for (i64 q = 0; q < p; ++q) start += count[q];
    if (total && p == BC - 1) *total = start + count[p] < rows ? start + count[p] : rows;
    for (i64 k = 0; k < count[p] && start + k < rows; ++k) {
      i64* row = Y + (start + k) * 3;
      row[0] = p / C, row[1] = p % C, row[2] = sel[p * n + k];
    }
  }
}

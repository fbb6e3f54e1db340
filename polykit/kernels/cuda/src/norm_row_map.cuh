// The row map of a Layer/RMS normalization that writes its rows permuted (ops/nn/norm_row_map.py,
// pass norm_row_maps): input row r goes to output row rm_dest(r). Up to RM_DIMS row dims, inner
// first, each (n, shift, q, a, b): the digit i = r mod n (r then divided by n) shifts cyclically,
// j = (i + shift) mod n, and adds (j mod q) * a + (j / q) * b (q = n: one piece). dims == 0: the
// identity. Runtime arguments (norm.py's row_map_args), so the modules depend on no map; only the kernels
// of mapped layers take them (norm_warp.cu with NW_MAPS 1, norm.cu's norm_rows_map_<code>).
#pragma once

#define RM_DIMS 6
// a map's parameters: dims, then per dim d (0 = inner) n, shift, q, a, b, named with prefix p
#define MAP_DIM_PARAMS(p, d) int p##_n##d, int p##_s##d, int p##_q##d, int p##_a##d, int p##_b##d
#define MAP_DIM_ARGS(p, d) p##_n##d, p##_s##d, p##_q##d, p##_a##d, p##_b##d
#define MAP_PARAMS(p)                                                                                        \
  int p##_dims, MAP_DIM_PARAMS(p, 0), MAP_DIM_PARAMS(p, 1), MAP_DIM_PARAMS(p, 2), MAP_DIM_PARAMS(p, 3),        \
      MAP_DIM_PARAMS(p, 4), MAP_DIM_PARAMS(p, 5)
#define MAP_ARGS(p)                                                                                          \
  p##_dims, MAP_DIM_ARGS(p, 0), MAP_DIM_ARGS(p, 1), MAP_DIM_ARGS(p, 2), MAP_DIM_ARGS(p, 3), MAP_DIM_ARGS(p, 4), \
      MAP_DIM_ARGS(p, 5)
#define RM_PARAMS MAP_PARAMS(rm)
#define RM_ARGS MAP_ARGS(rm)

struct RowMap {
  int dims;
  int n[RM_DIMS], s[RM_DIMS], q[RM_DIMS], a[RM_DIMS], b[RM_DIMS];
};

__device__ __forceinline__ RowMap rm_make(RM_PARAMS) {
  RowMap m;
  m.dims = rm_dims;
  const int n[RM_DIMS] = {rm_n0, rm_n1, rm_n2, rm_n3, rm_n4, rm_n5};
  const int s[RM_DIMS] = {rm_s0, rm_s1, rm_s2, rm_s3, rm_s4, rm_s5};
  const int q[RM_DIMS] = {rm_q0, rm_q1, rm_q2, rm_q3, rm_q4, rm_q5};
  const int a[RM_DIMS] = {rm_a0, rm_a1, rm_a2, rm_a3, rm_a4, rm_a5};
  const int b[RM_DIMS] = {rm_b0, rm_b1, rm_b2, rm_b3, rm_b4, rm_b5};
  for (int d = 0; d < RM_DIMS; ++d) {
    m.n[d] = n[d];
    m.s[d] = s[d];
    m.q[d] = q[d];
    m.a[d] = a[d];
    m.b[d] = b[d];
  }
  return m;
}

// the output row of input row `row` (rows below 2^31: the host checks)
__device__ __forceinline__ i64 rm_dest(i64 row, const RowMap& m) {
  if (m.dims == 0) return row;
  int rem = (int)row;
  i64 dest = 0;
#pragma unroll
  for (int d = 0; d < RM_DIMS; ++d) {
    if (d < m.dims) {
      const int i = rem % m.n[d];
      rem /= m.n[d];
      int j = i + m.s[d];
      if (j >= m.n[d]) j -= m.n[d];
      dest += (i64)(j % m.q[d]) * m.a[d] + (i64)(j / m.q[d]) * m.b[d];
    }
  }
  return dest;
}

// The input map (in_map: a row-gathering copy before the norm, Swin's patch merging): the norm's
// logical input [rows, L] read from X in segments of im_seg elements: logical segment t = row * (L /
// im_seg) + j / im_seg is X's segment im_offset + rm_dest(t) of the map (same dims as above, here
// from the logical segment to X's; arguments: segment, offset, then the map). No map (dims 0): X
// read as [rows, L].
#define IM_PARAMS int im_seg, int im_offset, MAP_PARAMS(im)
#define IM_ARGS im_seg, im_offset, MAP_ARGS(im)
#define IM_MAP_ARGS MAP_ARGS(im)

struct InMap {
  RowMap m;
  int seg, offset;
};

// the element of X where segment s (< L / seg) of logical row `row` starts (the map given: dims > 0).
// 32-bit division: L, the segment and s are below 2^31 (the host checks the segments' reach)
__device__ __forceinline__ i64 im_base(i64 row, int s, int L, const InMap& im) {
  return (i64)(im.offset + rm_dest(row * (L / im.seg) + s, im.m)) * im.seg;
}

// the element of X that element j of logical row `row` (rows of L) reads
__device__ __forceinline__ i64 im_elem(i64 row, i64 j, i64 L, const InMap& im) {
  if (im.m.dims == 0) return row * L + j;
  const int jj = (int)j, s = jj / im.seg;
  return im_base(row, s, (int)L, im) + (jj - s * im.seg);
}

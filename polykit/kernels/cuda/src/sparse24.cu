// 2:4 structured-sparse GEMM on sparse tensor cores (mma.sp m16n8k32, fp16 in, fp32 accumulate,
// fp16 out): Y[item][t][f] = alpha * sum_k W[f][k] * X[item][t][k] + beta * bias[f], then the layer's
// epilogue (HAS_EPILOGUE), for Gemm / MatMul / 1x1-conv layers whose weight W [F, K] was compressed
// at build time (polykit/compiler/plan/sparse24.py):
//   Wc = values [F, K/2] half (row-major), then metadata [F, K/16] uint16: entry (f, c) holds the
//   positions (2 bits each, ascending) of the two kept values of each group of 4 in K 16c..16c+15,
//   group g in bits 4g..4g+3 -- the PTX ISA's metadata for m16n8k32 with 16-bit operands.
// The weight is mma's sparse A operand (rows = output features F), the activations its dense B
// operand (columns = tokens t): B[k][t] at X[item * sxb + t * sxt + k * sxk] (MatMul / Gemm /
// ConvNHWC: sxt = K, sxk = 1; an NCHW 1x1 conv: sxt = 1, sxk = H * W, one item per image), the
// output at Y[item * syb + t * syt + f * syf]; `ylast` is the output's last dim (the epilogue's col).
// K is a multiple of 32 (the builder offers nothing else); F and the token count are any.
// Launch: grid (ceil(T / 64), ceil(F / 64), items), block 128 (4 warps, 2 x 2, each 32 F x 32 t:
// 2 x 4 mma tiles); shared tiles of BK = 32 K per step; `vec` 1 when X rows are 16-byte loadable
// (sxk == 1, sxt % 8 == 0, X 16-byte aligned).
#include "dtypes.cuh"

// the fused-epilogue hook (HAS_EPILOGUE, EPI_PARAMS, ...; epilogue_hook.cuh)
#include "epilogue_hook.cuh"

#define SP_BF 64
#define SP_BT 64
#define SP_BK 32
#define SP_LDA (SP_BK / 2 + 8)  // compressed values a row, padded (halves)
#define SP_LDB (SP_BK + 8)      // K a token, padded (halves)

__device__ __forceinline__ unsigned pair_at(const half_t* p) { return *reinterpret_cast<const unsigned*>(p); }

extern "C" __global__ void __launch_bounds__(128) gemm_sparse24(
    const half_t* __restrict__ X, const unsigned char* __restrict__ Wc, const half_t* __restrict__ bias,
    half_t* __restrict__ Y, i64 T, i64 F, i64 K, i64 sxb, i64 sxt, i64 sxk, i64 syb, i64 syt, i64 syf, float alpha,
    float beta, i64 ylast, i64 vec EPI_PARAMS) {
  __shared__ __align__(16) half_t sA[SP_BF * SP_LDA];
  __shared__ __align__(16) half_t sB[SP_BT * SP_LDB];
  __shared__ unsigned sE[SP_BF];
#if HAS_EPILOGUE
  const EpiState epi = make_epi(EPI_ARGS);
#endif
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const i64 item = blockIdx.z, t0 = (i64)blockIdx.x * SP_BT, f0 = (i64)blockIdx.y * SP_BF;
  const int wf = (warp >> 1) * 32, wt = (warp & 1) * 32;
  const half_t* values = reinterpret_cast<const half_t*>(Wc);
  const unsigned short* meta = reinterpret_cast<const unsigned short*>(Wc + F * K);  // after F * K/2 halves
  const half_t* x = X + item * sxb;
  float acc[2][4][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.f;

  for (i64 k0 = 0; k0 < K; k0 += SP_BK) {
    {  // compressed values: 64 rows x 16 halves, one 16-byte chunk a thread
      const int r = tid >> 1, h = (tid & 1) * 8;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (f0 + r < F) v = *reinterpret_cast<const uint4*>(values + (f0 + r) * (K / 2) + k0 / 2 + h);
      *reinterpret_cast<uint4*>(&sA[r * SP_LDA + h]) = v;
    }
    if (tid < SP_BF)  // metadata: the two 16-K entries of this step, one word a row
      sE[tid] = f0 + tid < F ? *reinterpret_cast<const unsigned*>(meta + (f0 + tid) * (K / 16) + k0 / 16) : 0u;
    if (vec) {  // activations: 64 tokens x 32 K, two 16-byte chunks a thread
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int idx = tid + c * 128, r = idx >> 2, q = (idx & 3) * 8;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (t0 + r < T) v = *reinterpret_cast<const uint4*>(x + (t0 + r) * sxt + k0 + q);
        *reinterpret_cast<uint4*>(&sB[r * SP_LDB + q]) = v;
      }
    } else {
      for (int idx = tid; idx < SP_BT * SP_BK; idx += 128) {
        const int r = idx % SP_BT, q = idx / SP_BT;  // consecutive threads: consecutive tokens
        half_t v; v.x = 0;
        if (t0 + r < T) v = x[(t0 + r) * sxt + (k0 + q) * sxk];
        sB[r * SP_LDB + q] = v;
      }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int ra = wf + i * 16 + g;
      const unsigned a0 = pair_at(&sA[ra * SP_LDA + 2 * t4]), a1 = pair_at(&sA[(ra + 8) * SP_LDA + 2 * t4]);
      const unsigned a2 = pair_at(&sA[ra * SP_LDA + 2 * t4 + 8]), a3 = pair_at(&sA[(ra + 8) * SP_LDA + 2 * t4 + 8]);
      // lanes 4g + {0, 1} pass the metadata (selector 0): entry (t4 & 1) of rows g and g + 8
      const int half_sel = t4 & 1;
      const unsigned e = ((sE[ra] >> (16 * half_sel)) & 0xFFFFu) | (((sE[ra + 8] >> (16 * half_sel)) & 0xFFFFu) << 16);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int rb = wt + j * 8 + g;
        const unsigned b0 = pair_at(&sB[rb * SP_LDB + 2 * t4]), b1 = pair_at(&sB[rb * SP_LDB + 2 * t4 + 8]);
        const unsigned b2 = pair_at(&sB[rb * SP_LDB + 2 * t4 + 16]), b3 = pair_at(&sB[rb * SP_LDB + 2 * t4 + 24]);
        float* c = acc[i][j];
        asm volatile(
            "mma.sp.sync.aligned.m16n8k32.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
            "{%8, %9, %10, %11}, {%0, %1, %2, %3}, %12, 0x0;\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(b2), "r"(b3), "r"(e));
      }
    }
    __syncthreads();
  }
  // accumulators: c[0], c[1] feature g, tokens 2 t4 + {0, 1}; c[2], c[3] feature g + 8
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const i64 f = f0 + wf + i * 16 + g + (r >> 1) * 8, t = t0 + wt + j * 8 + 2 * t4 + (r & 1);
        if (f >= F || t >= T) continue;
        float v = alpha * acc[i][j][r];
        if (bias) v += beta * h2f(bias[f]);
        const i64 out = item * syb + t * syt + f * syf;
#if HAS_EPILOGUE
        v = apply_epilogue(epi, v, out, out % ylast);
#endif
        st(Y, out, v);
      }
}

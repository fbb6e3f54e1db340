// Every float32 through e4m3_quantize.cuh on the GPU, against the division and the software encode it replaces
// (a check, not a test: it needs nvcc and a GPU of compute capability 8.9+; about a second on an H100; STEP=new15 runs it):
//   nvcc -O2 -gencode=arch=compute_90a,code=sm_90a -I polykit/kernels/cuda/src -o /tmp/e4m3_check benchmarks/e4m3_quantize_check.cu
//   /tmp/e4m3_check
// For each of the 2^32 bit patterns v: the hardware conversion of v against lowp.cuh's encode(v, true) (every float,
// NaNs by their byte), and for scales inside the division-free range (0.006, 1/3, 2^-90, 2^90) and outside it
// (2^-100) E4m3Quantizer::pair's bytes against encode(__fdiv_rn(v, ys), true), the stages' arithmetic before the
// quantizer. Prints the mismatches (0 expected) and the first one of each kind, and the bytes of a negative NaN.
#include <cstdio>
#include "e4m3_quantize.cuh"

__device__ unsigned long long mismatches[12];
__device__ unsigned first[12], neg_nan[3];

__device__ unsigned sw(float v) { return LowpFmt<f8e4m3fn_t>::F::encode(v, true); }

__global__ void check(float ys, int k) {
  const E4m3Quantizer q = e4m3_quantizer(ys);
  const unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < (1ull << 32); i += step) {
    const float v = __uint_as_float((unsigned)i);
    const unsigned was = sw(__fdiv_rn(v, ys)), now = q.pair(v, 0.f) & 0xffu, now_hi = q.pair(0.f, v) >> 8;
    if (k == 0 && (q.bytes2(v, 0.f) & 0xffu) != sw(v)) { atomicAdd(&mismatches[0], 1); first[0] = (unsigned)i; }
    if (now != was) { atomicAdd(&mismatches[1 + 2 * k], 1); first[1 + 2 * k] = (unsigned)i; }
    if (now_hi != was) { atomicAdd(&mismatches[2 + 2 * k], 1); first[2 + 2 * k] = (unsigned)i; }
    if (k == 0 && (unsigned)i == 0xffc00000u) { neg_nan[0] = q.bytes2(v, 0.f) & 0xffu; neg_nan[1] = sw(v); neg_nan[2] = was; }
  }
}

int main() {
  const float scales[5] = {0.006f, 1.f / 3, 0x1p-90f, 0x1p90f, 0x1p-100f};
  for (int k = 0; k < 5; ++k) check<<<1056, 512>>>(scales[k], k);
  unsigned long long n[12];
  unsigned f[12], nn[3];
  cudaMemcpyFromSymbol(n, mismatches, sizeof n);
  cudaMemcpyFromSymbol(f, first, sizeof f);
  cudaMemcpyFromSymbol(nn, neg_nan, sizeof nn);
  printf("%s\nhardware conversion != software encode: %llu (first %08x); -NaN: hardware %02x, encode %02x, "
         "encode of the division %02x\n", cudaGetErrorString(cudaGetLastError()), n[0], f[0], nn[0], nn[1], nn[2]);
  for (int k = 0; k < 5; ++k)
    printf("ys %a: pair != encode(v / ys): low %llu (first %08x), high %llu (first %08x)\n", scales[k], n[1 + 2 * k],
           f[1 + 2 * k], n[2 + 2 * k], f[2 + 2 * k]);
  return 0;
}

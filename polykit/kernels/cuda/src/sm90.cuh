// Hopper (sm_90a) building blocks of the tensor-core GEMM / implicit-GEMM kernels:
// mbarriers, TMA tile loads, shared-memory matrix descriptors, register hand-off and the
// consumer side of the stage pipeline (wgmma over one stage of A and B tiles).
//
// Shared-memory tile formats (both 128-byte swizzled, every tile 1024-byte aligned):
//   K-major  (A always, B when it is [N, K]): row r of the tile (an M or N index) holds 64
//            consecutive K elements = 128 bytes; 16-byte chunk c of row r sits at chunk
//            c ^ (r % 8). TMA with CU_TENSOR_MAP_SWIZZLE_128B and box {64, rows} writes it.
//   MN-major (B when it is [K, N]): the tile is BN/64 boxes of {64 N, 64 K}; row k of a box
//            holds 64 consecutive N elements (same swizzle); box j sits at j * 8 KB.
// Descriptor fields (PTX ISA "matrix descriptor"): start >> 4 (bits 0-13), leading byte
// offset >> 4 (16-29), stride byte offset >> 4 (32-45), swizzle mode (62-63; 1 = 128 B).
#pragma once
#include "wgmma.cuh"

struct __align__(64) TmaDesc {
  u64 v[16];
};

__device__ __forceinline__ u32 smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }

// ---- mbarriers -------------------------------------------------------------------------
__device__ __forceinline__ void bar_init(u64* bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count));
}
__device__ __forceinline__ void bar_fence_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
__device__ __forceinline__ void bar_expect_tx(u64* bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bar_arrive(u64* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
// wait until the phase with parity `parity` of the barrier has completed
__device__ __forceinline__ void bar_wait(u64* bar, u32 parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}
// cp.async (16-byte) completion tracked by the barrier: one pending arrive per thread
__device__ __forceinline__ void bar_arrive_cp_async(u64* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_addr(bar)) : "memory");
}

// ---- TMA -------------------------------------------------------------------------------
__device__ __forceinline__ void tma_prefetch_desc(const TmaDesc* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"((u64)map) : "memory");
}
// box at element coordinates (c0 innermost, c1, c2) of a 3-D tensor map -> dst, counted on bar
__device__ __forceinline__ void tma_load_3d(void* dst, const TmaDesc* map, u64* bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];"
      ::"r"(smem_addr(dst)), "l"((u64)map), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

// box at element coordinates (c0 innermost, .., c3) of a 4-D tensor map -> dst, counted on bar
__device__ __forceinline__ void tma_load_4d(void* dst, const TmaDesc* map, u64* bar, int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], [%2];"
      ::"r"(smem_addr(dst)), "l"((u64)map), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

// ---- cp.async (implicit-GEMM producers) ------------------------------------------------
// 16 bytes global -> shared; `valid` false writes zeros (padding, out-of-range rows)
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}

// float -> the nearest tf32 value (round half away from zero), kept in a float
__device__ __forceinline__ float tf32_round(float x) {
  u32 r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return __uint_as_float(r);
}

// ---- descriptors and wgmma ordering -----------------------------------------------------
__device__ __forceinline__ u64 smem_desc(u32 addr, u32 lbo, u32 sbo) {
  return (u64)((addr & 0x3FFFF) >> 4) | ((u64)(lbo >> 4) << 16) | ((u64)(sbo >> 4) << 32) | (1ull << 62);
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }
// keep the compiler from moving accumulator reads/writes across the async wgmma
template <int R>
__device__ __forceinline__ void fence_regs(float* d) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int R>
__device__ __forceinline__ void fence_regs(int* d) {  // int32 accumulators (s8 wgmma)
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+r"(d[i])::"memory");
}
template <int REGS>
__device__ __forceinline__ void set_max_regs_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(REGS)); }
template <int REGS>
__device__ __forceinline__ void set_max_regs_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(REGS)); }

// ---- consumer: one stage of wgmma ----------------------------------------------------------
// Warpgroup tile: WSUB x 64 rows (rows `row0 + s*64 ..`) by WN columns; the stage holds A
// (K-major rows) at `a` and B (WN rows K-major, or MN-major boxes when MN_B) at `b`, 64 K deep.
// `first` zeroes the accumulators (scale_d 0 on the first k step). ACC: float, or int for T = i8
// (s8 k32: four 32-byte k steps a stage, like the 16-bit types' k16).
template <int WN, int WSUB, int MN_B, class T, class ACC>
__device__ __forceinline__ void wgmma_stage(ACC (&acc)[WSUB][WN / 2], u32 a, u32 b, int row0, bool first) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const u64 db = MN_B ? smem_desc(b + kk * 2048, 8192, 1024) : smem_desc(b + kk * 32, 16, 1024);
#pragma unroll
    for (int s = 0; s < WSUB; ++s) {
      const u64 da = smem_desc(a + (row0 + s * 64) * 128 + kk * 32, 16, 1024);
      Wgmma<WN, T>::template run<MN_B>(acc[s], da, db, (first && kk == 0) ? 0 : 1);
    }
  }
}

// ---- fp32 on tf32 tensor cores (3xTF32) ----------------------------------------------------
// x = big + small with both parts tf32 values (big = x rounded to tf32, small = the rest rounded
// to tf32); a * b ~ a_small * b_big + a_big * b_small + a_big * b_big, the dropped a_small *
// b_small is below 2^-22 |a b| and unbiased (both parts are rounded, not truncated).
__device__ __forceinline__ void split_tf32(float x, u32& big, u32& small) {
  const float b = tf32_round(x);
  big = __float_as_uint(b);
  small = __float_as_uint(tf32_round(x - b));
}
// generic-proxy shared-memory writes -> visible to wgmma (async proxy) reads
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// barrier `id` (not 0: __syncthreads' own) over `threads` threads of the block
template <int ID, int THREADS>
__device__ __forceinline__ void named_barrier() { asm volatile("bar.sync %0, %1;" ::"n"(ID), "n"(THREADS) : "memory"); }
// the same with the barrier chosen at run time (id 1 .. 15); named_arrive counts the calling warps in and
// goes on (producer / consumer hand-offs between warpgroups: the waiting side calls named_sync)
template <int THREADS>
__device__ __forceinline__ void named_sync(int id) { asm volatile("bar.sync %0, %1;" ::"r"(id), "n"(THREADS) : "memory"); }
template <int THREADS>
__device__ __forceinline__ void named_arrive(int id) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "n"(THREADS) : "memory");
}

// One stage of 3xTF32 wgmma into `part` (zeroed by the first wgmma): A (float, K-major rows, 32
// deep) split into big and small parts in registers (the m64nNk8 tf32 A fragment: rows g, g + 8
// by columns t, t + 4 of the warp's 16 rows, g = lane / 4, t = lane % 4); B's big and small parts
// K-major in shared memory at b_big and b_small. Every fragment and descriptor is made before the
// one wgmma.fence and none is written again until the caller's wgmma.wait: registers an
// in-flight wgmma reads must not change (PTX ISA: wgmma register operands).
template <int WN, int WSUB>
__device__ __forceinline__ void wgmma_stage_3xtf32(float (&part)[WSUB][WN / 2], const unsigned char* a, u32 b_big,
                                                   u32 b_small, int row0, int warp, int lane) {
  const int g = lane / 4, t = lane % 4;
  u32 big[4][WSUB][4], small[4][WSUB][4];
  u64 db_big[4], db_small[4];
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    db_big[kk] = smem_desc(b_big + kk * 32, 16, 1024);
    db_small[kk] = smem_desc(b_small + kk * 32, 16, 1024);
#pragma unroll
    for (int s = 0; s < WSUB; ++s) {
      // row r = row0 + 64 s + 16 warp + g has r % 8 == g: chunk c of it sits at chunk c ^ g
      const unsigned char* row = a + (row0 + s * 64 + warp * 16 + g) * 128 + t * 4;
      const int c0 = ((2 * kk) ^ g) << 4, c1 = ((2 * kk + 1) ^ g) << 4;
      split_tf32(*(const float*)(row + c0), big[kk][s][0], small[kk][s][0]);
      split_tf32(*(const float*)(row + 1024 + c0), big[kk][s][1], small[kk][s][1]);
      split_tf32(*(const float*)(row + c1), big[kk][s][2], small[kk][s][2]);
      split_tf32(*(const float*)(row + 1024 + c1), big[kk][s][3], small[kk][s][3]);
    }
  }
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int s = 0; s < WSUB; ++s) {
      WgmmaTf32RA<WN>::run(part[s], small[kk][s], db_big[kk], kk == 0 ? 0 : 1);
      WgmmaTf32RA<WN>::run(part[s], big[kk][s], db_small[kk], 1);
      WgmmaTf32RA<WN>::run(part[s], big[kk][s], db_big[kk], 1);
    }
}

// Linear tile index -> (item, tile row, tile column), GROUP tile rows at a time so that
// neighbouring blocks share A and B tiles in L2.
struct TileIdx {
  int z, tm, tn;
};
__device__ __forceinline__ TileIdx tile_of(int t, int tiles_m, int tiles_n, int group) {
  const int per_item = tiles_m * tiles_n;
  TileIdx r;
  r.z = t / per_item;
  t -= r.z * per_item;
  const int width = group * tiles_n;
  const int first_m = (t / width) * group;
  const int gm = min(group, tiles_m - first_m);
  const int in = t % width;
  r.tm = first_m + in % gm;
  r.tn = in / gm;
  return r;
}

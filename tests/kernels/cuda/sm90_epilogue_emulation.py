"""The sm90 GEMM's epilogue run on the host: gemm_sm90.cu's own source, its K loop replaced by the product.

gemm_sm90's K loop is wgmma fed by TMA, which the host emulation (block_emulation.py, warp_emulation.py) does not
model; its epilogue (gemm_sm90_epilogue.cuh: finish_tile, the 16-byte and native INT8 / FP8 paths, TILE_INPUTS,
ROW_HALVES, the edges of partial tiles) is plain CUDA with warp shuffles, which it does. `Sm90EpilogueLauncher`
takes a tactic's launch of `gemm_sm90` (its enqueue unchanged: the same defines, Y, sizes, INT8 / FP8 output
arguments and epilogue inputs a GPU launch gets), computes the product A B^T from the operands its TMA maps name
(exact int32 sums for INT8; float64 sums rounded to float32 for FP8 and 16-bit operands), and runs HARNESS: the
module's whole source compiled for the host, every PTX it does not model a run-time trap (translate_asm's "trap"),
one block a tile in tile_of's order, each consumer thread taking its accumulators where the wgmma layout puts them
(row 16 * warp + lane / 4 (+ 8), column 8 j + 2 (lane % 4) (+ 1) of its m64 subtile) and finishing the tile as
`consume` does after its K loop. So the epilogue's bytes are checked against the cpu reference without a GPU, and
two forms of it (EPI_ROLL) against each other bit for bit.
"""

from __future__ import annotations

import ctypes
from dataclasses import replace
from typing import Any, Mapping, Sequence

import numpy as np

from polykit.kernels.cuda.base import DeviceTensor, KernelSource, TensorMapSpec
from tests.kernels.cuda.block_emulation import EmulatedLauncher, host_launcher

#: compiled as the device compiles it (__CUDA_ARCH__ 900: pointwise.cuh's non-contracting float ops, the e4m3
#: conversion's PTX, int8_out.cuh's quad_xor by __shfl_xor_sync), the host's stand-ins for what that adds
ARCH = r"""
#define __CUDA_ARCH__ 900
#define __grid_constant__
#include <algorithm>
using std::min;
using std::max;
struct alignas(8) float2 { float x, y; };
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline float __int2float_rn(int a) { return (float)a; }
inline int __float_as_int(float f) { int u; memcpy(&u, &f, 4); return u; }
// cvt.rni.s32.f32: half to even, saturated to int32, NaN -> 0
inline int __float2int_rn(float a) {
  return a != a ? 0 : a >= 0x1p31f ? 2147483647 : a <= -0x1p31f ? (-2147483647 - 1) : (int)nearbyintf(a);
}
// PRMT (default mode; the selectors here have no sign bit): byte i of the result is byte (s >> 4 i) & 7 of y:x
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) { return emu_prmt(x, y, s); }
inline void __trap() { emu_fail("__trap"); }
inline double __dadd_rn(double a, double b) { return a + b; }  // (-O1 on the host contracts nothing)
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline unsigned __activemask() { return 0xffffffffu; }  // (the epilogue's warps run whole)
inline bool __any_sync(unsigned mask, bool p) {  // a warp vote by the emulation's shuffles
  unsigned v = p;
  for (int d = 1; d < 32; d *= 2) v |= __shfl_xor_sync(mask, v, d);
  return v != 0;
}
"""
HARNESS = r"""
#define EMU_TAIL(...) __VA_OPT__(, ) __VA_ARGS__
#if HAS_EPILOGUE
#define EMU_EPI_ARGS EMU_TAIL(EPI_ARGS)  // (an epilogue may read no inputs: EPI_ARGS empty)
#else
#define EMU_EPI_ARGS
#endif
// gemm_sm90's parameters with P and its row length in place of the tensor maps: one block a tile (blockIdx.x in
// tile_of's order), CONSUMERS x 128 threads (consumer warpgroup 1 + threadIdx.x / 128); each thread takes its
// accumulators from P, the product padded to whole tiles ([items * tiles_m * BM, np] row-major), where the wgmma
// layout puts them, then finishes the tile as consume does after its K loop
extern "C" __global__ void sm90_epilogue(const acc_t* P, i64 np, const ELEM* C, ELEM* Y, i64 M, i64 N, i64 K, i64 scm,
                                         i64 scn, float alpha, float beta, i64 items, i64 a_batched,
                                         i64 b_batched I8_PARAMS EPI_PARAMS) {
  (void)a_batched, (void)b_batched, (void)items, (void)K, (void)C;
  const int wg = 1 + threadIdx.x / 128, tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int row0 = (wg - 1) * MSUB * 64;
  const int tiles_m = (int)((M + BM - 1) / BM), tiles_n = (int)((N + BN - 1) / BN);
  OutT out = MAKE_OUT(Y, C, M, N, scm, scn, alpha, beta);
#if I8 && !F8
  out.q.small_sums = K < 256;
#endif
#if HAS_EPILOGUE
  EPI_OF(out) = make_epi(EPI_ARGS);
#endif
  const TileIdx ti = tile_of(blockIdx.x, tiles_m, tiles_n, GROUP);
  acc_t acc[MSUB][BN / 2];
  for (int s = 0; s < MSUB; ++s)
    for (int j = 0; j < BN / 8; ++j)
      for (int e = 0; e < 4; ++e) {
        const i64 r = (i64)ti.z * tiles_m * BM + (i64)ti.tm * BM + row0 + s * 64 + warp * 16 + lane / 4 + 8 * (e / 2);
        const i64 c = (i64)ti.tn * BN + 8 * j + 2 * (lane % 4) + e % 2;
        acc[s][4 * j + e] = P[r * np + c];
      }
#if TILE_INPUTS
  TileIn tin;
  if (vector_ok(out))
    load_tile_inputs(out, tin, ti.z, (i64)ti.tm * BM + row0 + warp * 16 + lane / 4, (i64)ti.tn * BN, lane);
  finish_tile(out, ti, acc, row0, warp, lane, tin);
#else
  finish_tile(out, ti, acc, row0, warp, lane);
#endif
}
"""
PARAMS = ("const acc_t* P, i64 np, const ELEM* C, ELEM* Y, i64 M, i64 N, i64 K, i64 scm, i64 scn, float alpha, "
          "float beta, i64 items, i64 a_batched, i64 b_batched I8_PARAMS EPI_PARAMS")
ARGS = "P, np, C, Y, M, N, K, scm, scn, alpha, beta, items, a_batched, b_batched"
I8_ARGS = ", Scale, QBias, YScale, YZ, flags, scale_step, bias_step"


def _host_array(ptr: int, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
    """The host array at `ptr` (a DeviceTensor of this emulation points into host memory)."""
    dt = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    raw = (ctypes.c_uint8 * (count * dt.itemsize)).from_address(ptr)
    return np.frombuffer(raw, dt, count).reshape(shape)


def _operand(spec: TensorMapSpec) -> np.ndarray:
    """A tensor map's matrix as float64 or int64: dims (K, rows, items), rows K elements apart."""
    k, rows, items = spec.dims
    a = _host_array(spec.ptr, spec.dtype, (items, rows, k))
    return a.astype(np.int64) if np.dtype(spec.dtype).kind in "iu" else a.astype(np.float64)


class Sm90EpilogueLauncher(EmulatedLauncher):
    """A launcher for the sm90 GEMM tactics' enqueue whose `gemm_sm90` launches run HARNESS on the host."""

    unmodelled = "trap"
    #: defines added to (or replacing) each launched kernel's (EPI_ROLL 1: the rolled form of a tile)
    defines: tuple[tuple[str, str], ...] = ()

    def launch(self, kernel: KernelSource, grid: Sequence[int], block: Sequence[int], args: Sequence[Any],
               shared_mem: int = 0) -> None:
        defines = dict(kernel.defines)
        if kernel.name != "gemm_sm90" or int(defines.get("SPLITK", 0)) or int(defines.get("STREAMK", 0)):
            raise AssertionError(f"the epilogue harness runs whole-tile gemm_sm90 launches, not {kernel.name} "
                                 f"{defines}")
        tm_a, tm_b = args[0], args[1]
        m, n, items = int(args[4]), int(args[5]), int(args[11])
        msub, consumers, bn = (int(defines.get(k, d)) for k, d in (("MSUB", 1), ("CONSUMERS", 2), ("BN", 0)))
        bm = 64 * msub * consumers
        tiles_m, tiles_n = -(-m // bm), -(-n // bn)
        a, b = _operand(tm_a), _operand(tm_b)
        if int(defines.get("B_MN", 0)):  # B [K, N] row-major: its map's rows are K's
            b = np.swapaxes(b, 1, 2)
        product = np.matmul(a, np.swapaxes(b, 1, 2))  # (items or 1, M, N)
        integer = int(defines.get("I8", 0)) and not int(defines.get("F8", 0))
        padded = np.zeros((items, tiles_m * bm, tiles_n * bn), np.int32 if integer else np.float32)
        padded[:, :m, :n] = (product.astype(np.int64).astype(np.int32) if integer else product.astype(np.float32))
        self.keep = padded  # alive while the kernel reads it
        kernel = replace(kernel, defines=tuple(sorted({**defines, **dict(self.defines)}.items())))
        harness = replace(kernel, name="sm90_epilogue", file=None, code=ARCH + kernel.render() + HARNESS, defines=())
        self.args = ARGS + (I8_ARGS if int(defines.get("I8", 0)) or int(defines.get("F8", 0)) else "") + " EMU_EPI_ARGS"
        self.params = PARAMS
        tensor = DeviceTensor(padded.ctypes.data, padded.shape, padded.dtype)
        super().launch(harness, (tiles_m * tiles_n * items,), (128 * consumers,),
                       [tensor, tiles_n * bn, *args[2:]])


def epilogue_launcher(tmp_path_factory) -> Sm90EpilogueLauncher:
    return host_launcher(tmp_path_factory, PARAMS, ARGS, cls=Sm90EpilogueLauncher)


def run_emulated_layer(launcher: Sm90EpilogueLauncher, layer: Any, inputs: Mapping[str, np.ndarray], tactic: str,
                       kind: str = "QConvNHWC") -> dict[str, np.ndarray]:
    """`layer`'s outputs from `tactic`'s enqueue with `launcher` (as runtime.cuda.harness.run_layer runs it on a
    GPU: inputs in their own buffers, outputs filled with 0xFF bytes first)."""
    from polykit.kernels.tactics import find_tactic
    from polykit.runtime.cuda.harness import infer_output_specs

    chosen = find_tactic("cuda", kind, tactic)
    assert chosen.supports(layer), f"{tactic} refuses {layer.in_dtypes} {layer.in_shapes}"
    held = {name: np.ascontiguousarray(inputs[name]) for name in dict.fromkeys(n for n in layer.inputs if n)}
    tensors = {name: DeviceTensor(a.ctypes.data, a.shape, a.dtype) for name, a in held.items()}
    outputs = {}
    for name, (shape, dtype) in infer_output_specs(layer, inputs).items():
        raw = np.full(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize + 64, 0xFF, np.uint8)
        start = -raw.ctypes.data % 64  # 64-byte aligned, as a device allocation is at least
        outputs[name] = raw[start:start + raw.size - 64].view(dtype).reshape(shape)
        tensors[name] = DeviceTensor(outputs[name].ctypes.data, tuple(shape), np.dtype(dtype))
    chosen.enqueue(layer, launcher, tensors)
    return {name: a.copy() for name, a in outputs.items()}

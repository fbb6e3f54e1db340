"""Run a block-cooperative CUDA kernel on the host, every thread of a block a real thread.

test_lowp_emulated.py runs grid-stride kernels as one thread; a kernel that stages tiles in
shared memory needs its whole block: here each block of the launch runs as blockDim.x
std::threads that share the module's one shared-memory buffer (blocks run one after another)
and meet at a std::barrier in __syncthreads. The kernel's own source is compiled by g++ as a
shared library with a prelude that stands in for the CUDA builtins (threadIdx / blockIdx are
thread_local; blocks of one, two or three dimensions) and test_lowp_emulated's IEEE stand-ins for dtypes.cuh's PTX conversions; a
generated `emu_launch(grid, block, <the kernel's parameters>)` runs the grid. A missing barrier
shows up as a wrong or changing result, as on a GPU; the lanes of a warp do not run in lockstep,
so kernels that rely on warp shuffles or lockstep are out of reach.

`EmulatedLauncher` is a Launcher for a tactic's own enqueue: its kernels run here.
"""

from __future__ import annotations

import ctypes
import hashlib
import re
import subprocess
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from polykit.kernels.cuda.base import DeviceTensor, KernelSource

PRELUDE = r"""
#include <math.h>
#include <string.h>
#include <barrier>
#include <thread>
#include <vector>
#define __device__
#define __global__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __restrict__
#define __shared__ static  // one array a kernel instance, shared by the block's threads (blocks run one after another)
struct Dim3 { unsigned x, y, z; };
static thread_local Dim3 threadIdx, blockIdx;
static Dim3 blockDim, gridDim;
static std::barrier<>* emu_barrier;
inline void __syncthreads() { emu_barrier->arrive_and_wait(); }
inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
inline double __longlong_as_double(long long u) { double f; memcpy(&f, &u, 8); return f; }
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
// packed 16-bit PTX math (weight_only_mma.cuh), each half on its own: the operation exact in double (two
// float16 values differ by at most 2^40; a bfloat16 fma's operands here lie within 2^30 of each other),
// then one rounding: float16 through _Float16, bfloat16 to nearest even via round-to-odd in float
inline double emu_h(unsigned v) { _Float16 h; unsigned short b = (unsigned short)v; memcpy(&h, &b, 2); return (double)h; }
inline unsigned emu_to_h(double d) { _Float16 h = (_Float16)d; unsigned short b; memcpy(&b, &h, 2); return b; }
inline double emu_b(unsigned v) { return (double)__uint_as_float((v & 0xffffu) << 16); }
inline unsigned emu_to_b(double d) {
  float f = (float)d;
  unsigned u = __float_as_uint(f);
  if ((double)f != d) {  // round to odd: toward zero, then the sticky last bit
    if (fabs((double)f) > fabs(d)) u -= 1;
    u |= 1;
  }
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}
inline unsigned emu_h2(unsigned a, unsigned b, int op) {
  unsigned d = 0;
  for (int i = 0; i < 2; ++i) {
    const double x = emu_h(a >> 16 * i), y = emu_h(b >> 16 * i);
    d |= emu_to_h(op ? x * y : x - y) << 16 * i;
  }
  return d;
}
inline unsigned emu_bf2_fma(unsigned a, unsigned b, unsigned c) {
  unsigned d = 0;
  for (int i = 0; i < 2; ++i) d |= emu_to_b(emu_b(a >> 16 * i) * emu_b(b >> 16 * i) + emu_b(c >> 16 * i)) << 16 * i;
  return d;
}
inline unsigned emu_prmt(unsigned a, unsigned b, unsigned s) {
  const unsigned long long v = ((unsigned long long)b << 32) | a;
  unsigned d = 0;
  for (int i = 0; i < 4; ++i) {
    const unsigned sel = (s >> 4 * i) & 15u, byte = (unsigned)(v >> 8 * (sel & 7u)) & 255u;
    d |= (sel & 8u ? (byte & 128u ? 255u : 0u) : byte) << 8 * i;
  }
  return d;
}
"""

#: an inline-asm operand `"r"(expression)` (no parentheses inside)
_R = r'"r"\(([^()]*)\)'


#: PTX the host cannot assemble -> its C meaning (cp.async copies at once: its wait is then a no-op)
PTX = {
    r'asm\("ex2\.approx\.ftz\.f32 %0, %1;" : "=f"\((\w+)\) : "f"\((\w+)\)\);': r"\1 = exp2f(\2);",
    r'asm\("rcp\.approx\.ftz\.f32 %0, %1;" : "=f"\((\w+)\) : "f"\((\w+)\)\);': r"\1 = 1.0f / \2;",
    r'asm volatile\("cp\.async\.cg\.shared\.global \[%0\], \[%1\], 16, %2;" ::"r"\(\(u32\)__cvta_generic_to_shared\((\w+)\)\),'
    r'\s*"l"\((\w+)\),\s*"r"\((\w+) \? 16 : 0\) : "memory"\);': r"if (\3) memcpy(\1, \2, 16); else memset(\1, 0, 16);",
    r'asm volatile\("cp\.async\.wait_all;" ::: "memory"\);': "",
    r'asm\("sub\.rn\.f16x2 %0, %1, %2;" : "=r"\((\w+)\) : ' + _R + ", " + _R + r"\);": r"\1 = emu_h2(\2, \3, 0);",
    r'asm\("mul\.rn\.f16x2 %0, %1, %2;" : "=r"\((\w+)\) : ' + _R + ", " + _R + r"\);": r"\1 = emu_h2(\2, \3, 1);",
    r'asm\("fma\.rn\.bf16x2 %0, %1, %2, %3;" : "=r"\((\w+)\) : ' + _R + ", " + _R + ", " + _R + r"\);":
        r"\1 = emu_bf2_fma(\2, \3, \4);",
    r'asm\("prmt\.b32 %0, %1, %2, %3;" : "=r"\((\w+)\) : ' + _R + ", " + _R + ", " + _R + r"\);":
        r"\1 = emu_prmt(\2, \3, \4);",
}


def host_source(cuda: str, kernel: str, params: str, args: str, smem_bytes: int) -> str:
    """`cuda` (a rendered module) as host C++ with `emu_launch(gx, gy, gz, bx, <params>)`, which
    runs kernel `kernel(<args>)` over the grid; `smem_bytes` of dynamic shared memory."""
    from tests.kernels.cuda.test_lowp_emulated import HALF

    for name, repl in HALF.items():
        cuda = re.sub(r"__device__ __forceinline__ \w+ " + name + r"\(.*?\n\}", repl, cuda, count=1, flags=re.S)
    for pattern, repl in PTX.items():
        cuda = re.sub(pattern, repl, cuda)
    if "asm(" in cuda:
        raise ValueError("the kernel source holds PTX the host emulation does not model")
    # dynamic shared memory: one buffer at namespace scope in place of the kernel's `extern` declaration
    extern = r"extern __shared__ __align__\(\d+\) unsigned char (\w+)\[\];"
    shared = re.findall(extern, cuda)
    cuda = re.sub(extern, "", cuda)
    head = "".join(f"alignas(16) unsigned char {name}[{smem_bytes}];\n" for name in dict.fromkeys(shared))
    runner = f"""
extern "C" void emu_launch(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, {params}) {{
  gridDim = {{gx, gy, gz}};
  blockDim = {{bx, by, bz}};
  for (unsigned emu_z = 0; emu_z < gz; ++emu_z)  // not x, y, z: a kernel's parameters may be named so
    for (unsigned emu_y = 0; emu_y < gy; ++emu_y)
      for (unsigned emu_x = 0; emu_x < gx; ++emu_x) {{
        std::barrier<> bar((std::ptrdiff_t)(bx * by * bz));
        emu_barrier = &bar;
        std::vector<std::thread> threads;
        for (unsigned t = 0; t < bx * by * bz; ++t)
          threads.emplace_back([=] {{
            threadIdx = {{t % bx, t / bx % by, t / (bx * by)}};
            blockIdx = {{emu_x, emu_y, emu_z}};
            {kernel}({args});
          }});
        for (auto& th : threads) th.join();
      }}
}}
"""
    return PRELUDE + head + cuda + runner


class EmulatedLauncher:
    """A Launcher whose kernels run on the host (compiled once per source text); `params` and
    `args` name the kernel's parameter list and its argument names (macros of the .cu)."""

    stream = None
    communicator = None
    sm_count = 132

    def __init__(self, build_dir: Path, cxx: str, params: str, args: str, smem_bytes: int = 1 << 18):
        self.dir, self.cxx, self.params, self.args, self.smem = build_dir, cxx, params, args, smem_bytes
        self.libs: dict[str, ctypes.CDLL] = {}
        self.launches: list[tuple[KernelSource, tuple[int, ...], tuple[int, ...], int]] = []

    def _lib(self, kernel: KernelSource) -> ctypes.CDLL:
        text = host_source(kernel.render(), kernel.name, self.params, self.args, self.smem)
        key = hashlib.sha256((self.cxx + text).encode()).hexdigest()[:16]
        if key not in self.libs:
            src, lib = self.dir / f"{key}.cpp", self.dir / f"{key}.so"
            if not lib.exists():
                src.write_text(text)
                subprocess.run([self.cxx, "-std=c++20", "-O1", "-w", "-fPIC", "-shared", "-pthread", "-o", str(lib),
                                str(src)], check=True)
            self.libs[key] = ctypes.CDLL(str(lib))
        return self.libs[key]

    def launch(self, kernel: KernelSource, grid: Sequence[int], block: Sequence[int], args: Sequence[Any],
               shared_mem: int = 0) -> None:
        if shared_mem > self.smem:
            raise AssertionError(f"{shared_mem} B of shared memory, the emulation has {self.smem}")
        grid = tuple(grid) + (1,) * (3 - len(grid))
        block = tuple(block) + (1,) * (3 - len(block))
        self.launches.append((kernel, grid, block, shared_mem))
        c_args = []
        for a in args:
            if isinstance(a, DeviceTensor):
                c_args.append(ctypes.c_void_p(a.ptr))
            elif isinstance(a, np.int32):
                c_args.append(ctypes.c_int(int(a)))
            elif isinstance(a, np.float32):
                c_args.append(ctypes.c_float(float(a)))
            elif isinstance(a, (np.float64, float)):
                c_args.append(ctypes.c_double(float(a)))
            else:
                c_args.append(ctypes.c_longlong(int(a)))
        self._lib(kernel).emu_launch(*(ctypes.c_uint(g) for g in grid), *(ctypes.c_uint(b) for b in block), *c_args)

    def workspace(self, nbytes: int) -> int:
        raise AssertionError("the emulated kernels borrow no workspace")


def host_launcher(tmp_path_factory, folder: str, params: str, args: str, cls: type = EmulatedLauncher):
    """An emulated launcher (`cls`) building in a fresh `folder` with the host's g++; the test is
    skipped where there is none."""
    import shutil

    import pytest

    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    return cls(tmp_path_factory.mktemp(folder), cxx, params, args)
